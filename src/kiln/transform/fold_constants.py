"""FoldConstants: evaluate graph bindings whose inputs are all constants.

An operator `Call` whose arguments are `Constant`s (directly, or through
bindings that were folded before it) is replaced by a `Constant` holding its
value, computed with the operator's numpy reference (`kiln.ops`). Tuple
projections of folded tuples fold too. Bindings the function returns directly
are kept as calls, so every output is still computed by the function (an
output that is a bare constant has nowhere to live in destination-passing
code). Calls whose folded value would be much larger than their inputs (a
broadcast of a small constant to a huge tensor) are kept, to keep weights
small; see `max_growth`. Sizes are computed from the inferred types before
anything is evaluated, and no folded value above `max_fold_bytes` may be
larger than its inputs, so a tiny graph cannot make the compiler allocate
terabytes (docs/passes.md).

The ONNX importer already folds while importing; this pass catches what later
rewrites expose (e.g. after fold-batchnorm, or on hand-written graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ir.visitor import GraphMutator
from kiln.ops import evaluate_call
from kiln.transform.pass_base import FunctionPass
from kiln.transform.weight_provenance import fold_call


class _Substitute(GraphMutator):
    def __init__(self, env: dict[g.Var, g.Expr]) -> None:
        self.env = env

    def visit_var(self, e: g.Var) -> g.Expr:
        return self.env.get(e, e)


def substitute(expr: g.Expr, env: dict[g.Var, g.Expr]) -> g.Expr:
    """`expr` with the variables of `env` replaced (rebuilds only what changes)."""
    return _Substitute(env).visit_expr(expr)


def result_vars(expr: g.Expr) -> set[g.Var]:
    """The variables a function result names directly (itself or its tuple fields)."""
    if isinstance(expr, g.Var):
        return {expr}
    if isinstance(expr, g.Tuple):
        out: set[g.Var] = set()
        for f in expr.fields:
            out |= result_vars(f)
        return out
    return set()


def _is_const(e: g.Expr) -> bool:
    return isinstance(e, g.Constant) or (
        isinstance(e, g.Tuple) and all(_is_const(f) for f in e.fields))


def _as_const(value: Any) -> g.Expr:
    if isinstance(value, tuple):
        return g.Tuple(tuple(_as_const(v) for v in value))
    return g.Constant(np.asarray(value))


# The default size bound of a value constant folding creates (here and while
# importing ONNX, kiln.frontend.onnx).
DEFAULT_FOLD_BUDGET = 16 << 20


def type_bytes(t: Type) -> int:
    """Bytes of a value of type `t` (tuples: the sum); shapes must be static."""
    if isinstance(t, TupleType):
        return sum(type_bytes(f) for f in t.fields)
    if isinstance(t, TensorType):
        return t.numel() * dt.itemsize(t.dtype)
    return 0


def _type_numel(t: Type) -> int:
    if isinstance(t, TupleType):
        return sum(_type_numel(f) for f in t.fields)
    return t.numel() if isinstance(t, TensorType) else 0


def _numel(e: g.Expr) -> int:
    if isinstance(e, g.Constant):
        return int(e.data.size)
    if isinstance(e, g.Tuple):
        return sum(_numel(f) for f in e.fields)
    return 0


@dataclass(frozen=True)
class FoldConstants(FunctionPass):
    """Replace all-constant operator calls of graph functions by their values.

    `max_growth`: a call is folded only if its value has at most this many times
    the elements of its constant inputs, or at most `always_fold` elements.
    `max_fold_bytes`: a value larger than this is folded only if it is no larger
    than its inputs (a transpose of a weight, not a broadcast).
    """

    name = "fold-constants"
    level = "graph"
    max_growth: int = 4
    always_fold: int = 4096
    max_fold_bytes: int = DEFAULT_FOLD_BUDGET

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        keep_as_call = result_vars(func.result)
        env: dict[g.Var, g.Expr] = {}
        bindings: list[g.Binding] = []
        changed = False
        for b in func.bindings:
            value = substitute(b.value, env)
            changed = changed or value is not b.value
            folded: g.Expr | None = None
            if isinstance(value, g.Call) and all(isinstance(a, g.Constant) for a in value.args) \
                    and self._within_budget(value):
                args = [a.data for a in value.args if isinstance(a, g.Constant)]
                folded = fold_call(value.op, value.attrs, args,
                                   _as_const(evaluate_call(value.op, args, value.attrs)))
            elif isinstance(value, g.TupleGetItem) and isinstance(value.tuple_value, g.Tuple) \
                    and _is_const(value.tuple_value):
                folded = value.tuple_value.fields[value.index]
            elif isinstance(value, g.Tuple) and _is_const(value):
                folded = value
            if folded is not None and b.var not in keep_as_call:
                env[b.var] = folded
                changed = True
                continue
            bindings.append(b if value is b.value else g.Binding(b.var, value))
        if not changed:
            return func
        result = substitute(func.result, env)
        return g.Function(func.params, tuple(bindings), result, dict(func.attrs))

    def _within_budget(self, call: g.Call) -> bool:
        # Decided on the call's type: evaluating first would already allocate the value.
        try:
            numel = _type_numel(call.type)
        except IRError:  # a symbolic shape: not a constant's
            return False
        if numel > max(self.always_fold, self.max_growth * sum(_numel(a) for a in call.args)):
            return False
        nbytes = type_bytes(call.type)
        in_bytes = sum(int(a.data.nbytes) for a in call.args if isinstance(a, g.Constant))
        return nbytes <= max(self.max_fold_bytes, in_bytes)
