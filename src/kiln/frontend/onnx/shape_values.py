"""Symbolic shape values: small integer tensors whose elements are known as dimensions.

Exporters compute shapes at run time: `Shape(x) -> Gather -> Unsqueeze -> Concat ->
Reshape`. With static shapes these fold to constants while importing. With symbolic
dimensions `Shape(x)` is `[batch, seq, 64]`: this module evaluates the shape
arithmetic on numpy object arrays whose elements are dimensions (an int, or a
PrimExpr over dimension variables, kiln.ir.shape_expr), so that the consumer
(Reshape, Expand, Slice, ...) sees a symbolic target. The graph still computes the
value at run time too, for consumers that use it as data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.shape_expr import dims_equal, simplify_dim
from kiln.ir.tensor import BinaryOp, Const, PrimExpr, Var
from kiln.ops import registry as op_registry

# Ops whose numpy reference moves elements without computing on them: it runs on
# object arrays as is.
_STRUCTURAL = frozenset({"gather", "concat", "reshape", "strided_slice", "broadcast_to",
                         "copy", "transpose", "split", "tile"})


def _floordiv(a: Any, b: Any) -> Any:
    if isinstance(b, int) and b == 0:
        raise ZeroDivisionError
    if isinstance(a, int) and isinstance(b, int):
        return int(np.trunc(a / b)) if (a < 0) != (b < 0) else a // b  # ONNX truncates
    return a // b


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": _floordiv,
    "maximum": lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int) else None,
    "minimum": lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int) else None,
}


class Unknown(Exception):
    """The value depends on more than the dimensions (or on how they compare)."""


def _elementwise(fn: Callable[..., Any], *args: np.ndarray) -> np.ndarray:
    def apply(*xs: Any) -> Any:
        out = fn(*xs)
        if out is None:
            raise Unknown
        return out

    return np.asarray(np.frompyfunc(apply, len(args), 1)(*args), dtype=object)


def _equal(a: Any, b: Any) -> bool:
    same = dims_equal(a, b)
    if same is None and ((_below_zero(a) and _nonnegative(b)) or
                         (_below_zero(b) and _nonnegative(a))):
        return False  # `Equal(shape, -1)` guards: a size is never negative
    if same is None:
        raise Unknown
    return same


def _below_zero(d: Any) -> bool:
    return isinstance(d, int) and d < 0


def _nonnegative(d: Any) -> bool:
    """Whether `d` is provably >= 0: sums and products of sizes (dimension variables)."""
    if isinstance(d, int):
        return d >= 0
    if isinstance(d, Var):
        return True
    if isinstance(d, BinaryOp) and d.op in ("add", "mul", "floordiv", "min", "max"):
        return _nonnegative(d.a) and _nonnegative(d.b)
    if isinstance(d, Const):
        return int(d.value) >= 0
    return False


def evaluate(op: str, args: Sequence[np.ndarray], attrs: Mapping[str, Any],
             result_dtype: str) -> np.ndarray | None:
    """`op` applied to `args` (object arrays of dims, or plain constants), or None when
    the result is not a function of the dimensions kiln can follow."""
    if not dt.is_int(result_dtype) and result_dtype != "bool":
        return None
    objs = [np.asarray(a, dtype=object) if a.dtype != object else a for a in args]
    try:
        if op in _STRUCTURAL:  # indices stay integer arrays
            out = op_registry.evaluate_call(op, list(args), attrs)
        elif op in _ARITH:
            out = _elementwise(_ARITH[op], *objs)
        elif op == "neg":
            out = _elementwise(lambda a: -a, *objs)
        elif op == "cast":
            out = objs[0]
        elif op == "equal":
            out = _elementwise(_equal, *objs)
        elif op == "not_equal":
            out = _elementwise(lambda a, b: not _equal(a, b), *objs)
        elif op == "where":
            out = np.where(objs[0].astype(bool), objs[1], objs[2])
        elif op == "reduce_prod" and len(objs) == 1:
            x = objs[0]
            axes = attrs.get("axes") or tuple(range(x.ndim))
            keep = bool(attrs.get("keepdims", True))
            out = np.asarray(np.multiply.reduce(x, axis=tuple(axes), keepdims=keep),  # type: ignore[call-overload]
                             dtype=object)
        else:
            return None
    except (Unknown, ZeroDivisionError, TypeError, ValueError):
        return None
    if isinstance(out, tuple):
        return None
    return np.asarray(np.frompyfunc(canonical, 1, 1)(np.asarray(out, dtype=object)),
                      dtype=object)


def canonical(d: Any) -> Any:
    """A dimension in canonical form (an int when constant); bools stay bools."""
    if isinstance(d, (bool, np.bool_)):
        return bool(d)
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, PrimExpr):
        return simplify_dim(d)
    raise Unknown


def is_constant(value: np.ndarray) -> bool:
    """Whether every element of `value` is a plain number."""
    return all(not isinstance(v, PrimExpr) for v in value.reshape(-1))


def shape_value(shape: Sequence[Any]) -> np.ndarray:
    """The 1-D object array `[d0, d1, ...]` of a shape."""
    out = np.empty(len(shape), dtype=object)
    for k, d in enumerate(shape):
        out[k] = canonical(d)
    return out

