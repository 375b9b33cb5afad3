"""LegalizeOps: replace operator `Call`s by tensor-level functions + `CallTensor`.

A call whose op has a hand-built kernel (`kiln.kernels.lowering_for(op)`) gets that
kernel for the target's ISA; any other call, its op's portable lowering: the object
the pass's op resolver finds (default `kiln.ops.get_op(name)`, the op's
tensor-expression definition) has a `legalize(call) -> (PrimFunc, name_hint)` method.
The PrimFunc is added to the module (marked private, so dead-code elimination may
drop it) and called with `CallTensor`. Calls with the same op, attributes and
argument types share one PrimFunc, as do calls whose kernel takes sizes of its
arguments at run time under one key of kiln.transform.fuse_ops (`lone_call_key`).

Every call that cannot be legalized is reported at once, with counts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.errors import CompileError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import function_exprs
from kiln.ir.attrs import ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.names import unique_name
from kiln.ir.tensor import Buffer, PrimFunc, SeqStmt
from kiln.ir.types import TensorType
from kiln.ir.visitor import GraphMutator
from kiln.kernels.lowering import legalize_call, lowering_for
from kiln.kernels.specialisation import naming
from kiln.ops import get_op
from kiln.ops.te import with_dim_params
from kiln.transform.fuse_ops import lone_call_key
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import Pass

#: Operator name -> an object with `legalize(call) -> (PrimFunc, name_hint)`.
OpResolver = Callable[[str], Any]


def _kiln_ops(name: str) -> Any:
    return get_op(name)


def find_legalizer(name: str, ops: OpResolver | None = None
                   ) -> Callable[[g.Call], tuple[PrimFunc, str]] | None:
    """The `legalize` method of operator `name` (from `ops`, by default kiln.ops's
    registry), or None if there is no rule for it."""
    lookup = ops or _kiln_ops
    try:
        op = lookup(name)
    except (KeyError, LookupError, ValueError):
        return None
    legalize = getattr(op, "legalize", None) if op is not None else None
    return legalize if callable(legalize) else None


@dataclass(frozen=True)
class LegalizeOps(Pass):
    """Lower every operator `Call` of graph functions to a PrimFunc + CallTensor.

    `ops` resolves an operator name to its definition (default: `kiln.ops.get_op`).
    """

    name = "legalize-ops"
    ops: OpResolver | None = None

    def run(self, mod: IRModule) -> IRModule:
        graph_funcs = mod.graph_funcs()
        missing: Counter[str] = Counter()
        for fn in graph_funcs.values():
            for e in function_exprs(fn):
                if isinstance(e, g.Call) and find_legalizer(e.op, self.ops) is None:
                    missing[e.op] += 1
        if missing:
            listed = ", ".join(f"{op} (x{n})" for op, n in sorted(missing.items()))
            raise CompileError(
                f"cannot legalize {sum(missing.values())} operator call(s) of "
                f"{len(missing)} operator(s): {listed}. No lowering rule is registered in "
                "kiln.ops (or the pass's op resolver) for them; register one, or lower these "
                "calls to call_tensor "
                "yourself before compiling")
        if not any(isinstance(e, g.Call)
                   for fn in graph_funcs.values() for e in function_exprs(fn)):
            return mod
        state = _State(dict(mod.functions), self.ops)
        for fname, fn in graph_funcs.items():
            state.functions[fname] = _Legalizer(state).visit_function(fn)
        return IRModule(state.functions, mod.attrs)


class _State:
    def __init__(self, functions: dict[str, BaseFunc], ops: OpResolver | None) -> None:
        self.functions = functions
        self.ops = ops
        self.cache: dict[Any, str] = {}
        self.isa = kernel_isa()  # the target the pipeline runs under

    def legalize(self, call: g.Call, legalize: Callable[[g.Call], tuple[PrimFunc, str]]
                 ) -> tuple[PrimFunc, str]:
        """`call`'s kernel: kiln's hand-built one for the target's ISA where there is
        one (kiln.kernels), else its op's `legalize`."""
        lowering = lowering_for(call.op) if self.ops is None else None
        if lowering is not None:
            return legalize_call(call, lowering, self.isa)
        return legalize(call)

    def add_kernel(self, call: g.Call) -> str:
        # a kernel over run-time sizes is shared by calls of other sizes (fuse_ops' key)
        key: Any = lone_call_key(call, self.isa) if self.ops is None else None
        if key is None:
            key = (call.op, tuple(call.attrs.items()), tuple(a.type for a in call.args),
                   call.ret_type)
        try:
            hash(key)
        except TypeError:  # an unhashable attribute: do not share
            key = ("unshared", id(call))
        if key in self.cache:
            return self.cache[key]
        legalize = find_legalizer(call.op, self.ops)
        assert legalize is not None  # checked before rewriting
        empty = _empty_result_kernel(call)
        result = (empty, f"{call.op}_empty") if empty is not None else self.legalize(call,
                                                                                    legalize)
        if not (isinstance(result, tuple) and len(result) == 2
                and isinstance(result[0], PrimFunc)):
            raise CompileError(
                f"legalize rule of operator '{call.op}' returned {result!r}; "
                "expected (PrimFunc, name_hint)")
        prim, hint = result

        prim = with_dim_params(prim)  # hand-built kernels may omit them
        name = self._unique(_identifier(str(hint) or call.op))
        self.functions[name] = prim.with_attrs(**{ATTR_PRIVATE: True})
        self.cache[key] = name
        return name

    def _unique(self, base: str) -> str:
        return unique_name(base, self.functions)


def _empty_result_kernel(call: g.Call) -> PrimFunc | None:
    """A kernel that does nothing, for a call whose result has no elements (a static
    dimension of 0) and whose operands all have static shapes: there is nothing to
    compute, and the operators' kernels assume at least one element (their tiles and
    workspaces would write into a zero-byte buffer)."""
    types = [t for t in (*(a.type for a in call.args), call.ret_type)
             if isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape)]
    if len(types) != len(call.args) + 1 or types[-1].numel() != 0:
        return None
    params = [Buffer(f"arg{i}", t.shape, t.dtype) for i, t in enumerate(types[:-1])]
    return PrimFunc((*params, Buffer("out", types[-1].shape, types[-1].dtype)), SeqStmt(()))


def _identifier(hint: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", hint).lstrip("_") or "kernel"
    return f"op_{name}" if name[0].isdigit() else name


class _Legalizer(GraphMutator):
    """Replaces every operator Call (arguments first) by a CallTensor of its kernel."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def visit_binding(self, b: g.Binding) -> g.Binding | list[g.Binding] | None:
        with naming(b.var):  # a generic kernel is reported by the value's name
            return super().visit_binding(b)

    def visit_call(self, e: g.Call) -> g.Expr:
        call = super().visit_call(e)
        assert isinstance(call, g.Call)
        return g.CallTensor(self.state.add_kernel(call), call.args, call.ret_type)
