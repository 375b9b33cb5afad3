"""UseCBLAS: on a target with `libs: ["cblas"]`, float32 matrix products call CBLAS.

Each float32 `matmul` whose B is one matrix becomes `cblas_matmul` (kiln.ops.cblas),
visible in the graph's DSL text; the other products keep kiln's own kernels. The
pass does nothing on targets without the library. On a target whose `libs` list it,
the tuning session (kiln.tuning.apply) decides per product: the pass asks it with
kiln.ops.cblas.LIBRARY_CHOICE, and `{"library": "own"}` leaves the `matmul` to the
GEMM families (block-matmuls); no session, or no params, is the rule's: CBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops import cblas
from kiln.ops.registry import call as op_call
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.functor import rewrite_calls
from kiln.transform.pass_base import FunctionPass
from kiln.tuning.apply import current


def target_wants_cblas() -> bool:
    target = Target.current()
    return target is not None and "cblas" in (target.get("libs") or ())


@dataclass(frozen=True)
class UseCBLAS(FunctionPass):
    """Rewrite float32 `matmul(a, b)` with a 2-D `b` to `cblas_matmul` (when `force` or
    the current target lists `cblas` in `libs`)."""

    name = "use-cblas"
    level = "graph"
    force: bool = False

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        allowed = target_wants_cblas()
        if not (self.force or allowed):
            return func
        # a tuning session chooses per product, only where the target's libs allow CBLAS
        session = current() if allowed else None
        isa = isa_for(None) if session is not None else None

        def rewrite(v: g.Call) -> g.Expr | None:
            if v.op != "matmul" or len(v.args) != 2:
                return None
            at, bt = v.args[0].type, v.args[1].type
            if isinstance(at, TensorType) and isinstance(bt, TensorType) and \
                    cblas.supports(at, bt, v.attrs):
                choice = cblas.LIBRARY_CHOICE
                if session is not None and isa is not None and not choice.calls_library(
                        session.params_for(choice, v, isa)):
                    return None
                return op_call(cblas.NAME, *v.args, **v.attrs)
            return None

        return rewrite_calls(func, rewrite)


__all__ = ["UseCBLAS"]
