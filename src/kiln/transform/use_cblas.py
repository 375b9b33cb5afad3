"""UseCBLAS: on a target with `libs: ["cblas"]`, float32 matrix products call CBLAS.

Each float32 `matmul` whose B is one matrix becomes `cblas_matmul` (kiln.ops.cblas),
visible in the graph's DSL text; the other products keep kiln's own kernels. The
pass does nothing on targets without the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.transform.functor import rewrite_calls
from kiln.transform.pass_base import FunctionPass


def target_wants_cblas() -> bool:
    from kiln.target import Target

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
        from kiln.ops import cblas
        from kiln.ops.registry import call as op_call

        assert isinstance(func, g.Function)
        if not (self.force or target_wants_cblas()):
            return func

        def rewrite(v: g.Call) -> g.Expr | None:
            if v.op != "matmul" or len(v.args) != 2:
                return None
            at, bt = v.args[0].type, v.args[1].type
            if isinstance(at, TensorType) and isinstance(bt, TensorType) and \
                    cblas.supports(at, bt, v.attrs):
                return op_call(cblas.NAME, *v.args, **v.attrs)
            return None

        return rewrite_calls(func, rewrite)


__all__ = ["UseCBLAS"]
