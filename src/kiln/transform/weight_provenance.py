"""The replay record of a folded constant (kiln.ir.weight_origin): what constant folding
did to the weights, as the exact steps `Module.swap_weights` replays.

Constant folding (here, in `fold-constants`, and while importing ONNX) evaluates an
operator on constants. When the operator only moves or exactly converts the values of
one weight (reshape, copy, transpose, a slice, a float-to-float cast) the folded constant
is that weight through a replay step; a gather of a weight is numpy's `take`; float
arithmetic (`ARITHMETIC`: a batch norm's statistics
folded into a scale and a shift) is an `Apply` of the numpy its reference runs; when
every input is a literal the result is a literal; anything else computed from weights is
opaque, and a library holding it refuses to swap, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ops.manip import slice_params

# Operators whose value is their first input's elements in the same order.
_SAME_ORDER = frozenset({"reshape", "copy"})
_FLOATS = frozenset({"float16", "float32", "float64"})
# Float operators whose numpy reference is numpy's function of the same name on the
# operands (16-bit floats widened), cast to the result's dtype (kiln.ops.elementwise).
ARITHMETIC = frozenset({"add", "subtract", "multiply", "divide", "sqrt"})


def _perm(attrs: Mapping[str, Any], ndim: int) -> tuple[int, ...]:
    perm = attrs.get("perm")
    return tuple(range(ndim))[::-1] if perm is None else tuple(int(a) for a in perm)


def _slice_origin(source: wo.Origin, shape: Sequence[int], attrs: Mapping[str, Any]
                  ) -> wo.Origin | None:
    """The replay of a `strided_slice` (its reference's index lists, as numpy slices)."""
    bounds = []
    for start, step, count in slice_params(shape, attrs):
        stop = start + step * count
        bounds.append((start, stop if stop >= 0 else None, step))
    return wo.step("slice", source, bounds=tuple(bounds))


def folded_origin(op: str, attrs: Mapping[str, Any], args: Sequence[np.ndarray],
                  result: Any) -> wo.Origin | None:
    """The origin of `result`, the value of `op(*args, **attrs)` on constant arrays."""
    sources = [wo.origin_of(a) for a in args]
    if all(isinstance(s, wo.Literal) for s in sources):
        return wo.LITERAL
    if op == "gather" and isinstance(result, np.ndarray) and len(args) == 2:
        return wo.apply("take", [wo.operand(a) for a in args], result.dtype,
                        axis=int(attrs.get("axis", 0)))
    if op in ARITHMETIC and isinstance(result, np.ndarray) and \
            all(a.dtype.name in _FLOATS for a in (*args, result)):
        return wo.apply(op, [wo.operand(a) for a in args], result.dtype)
    if not isinstance(result, np.ndarray) or not args or \
            any(not isinstance(s, wo.Literal) for s in sources[1:]):
        return wo.combine(sources, f"folded {op}")
    source, x = sources[0], args[0]
    if source is None:
        return None
    if op in _SAME_ORDER and result.dtype == x.dtype and result.size == x.size:
        return wo.step("reshape", source, shape=tuple(int(d) for d in result.shape))
    if op == "strided_slice" and result.dtype == x.dtype:
        return _slice_origin(source, x.shape, attrs)
    if op == "transpose" and result.dtype == x.dtype:
        return wo.step("transpose", source, perm=_perm(attrs, x.ndim))
    if op == "cast" and x.dtype.name in _FLOATS and result.dtype.name in _FLOATS \
            and result.shape == x.shape:
        return wo.step("astype", source, dtype=result.dtype.name)
    return wo.combine(sources, f"folded {op}")


def fold_call(op: str, attrs: Mapping[str, Any], args: Sequence[np.ndarray],
              folded: g.Expr) -> g.Expr:
    """Record the origin of the folded value `folded` (a Constant, or a Tuple of them, as
    constant folding makes it) of `op` on `args`; returns it."""
    if isinstance(folded, g.Constant):
        if any(folded.data is a for a in args):
            return folded  # the value is an input itself: it keeps its origin
        origin = folded_origin(op, attrs, args, folded.data)
        if origin is not None:
            wo.record(folded.data, origin)
    elif isinstance(folded, g.Tuple):
        origin = wo.combine([wo.origin_of(a) for a in args], f"folded {op}")
        for f in folded.fields:
            if isinstance(f, g.Constant) and origin is not None:
                wo.record(f.data, origin)
    return folded


def derived(const: g.Constant, origin: wo.Origin | None) -> g.Constant:
    """`const` with `origin` recorded (None: left unknown); returns it."""
    if origin is not None:
        wo.record(const.data, origin)
    return const


__all__ = ["ARITHMETIC", "derived", "fold_call", "folded_origin"]
