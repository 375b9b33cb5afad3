"""The range of a float expression's values, NaN aside, from its own tree.

A float -> int cast whose operand is clamped between bounds it can see (QuantizeLinear's
`min(max(round(x / s) + zp, 0), 255)`, the requantizing epilogue's clamp) can skip the
general conversion (kiln.codegen.llvm.arith, which must give the documented result for
any float) for one `fptosi` of a NaN-cleared operand. The rules are interval arithmetic
on constants, casts from integer types of at most 32 bits, add/sub/mul, min/max (and
selects between the operands of their comparison, `v < lo ? lo : v`), rounding
intrinsics and selects; anything else (loads of floats, variables) is
unbounded. NaN is not a value here: a clamp that meets NaN gives NaN (kiln's min/max),
and the cast's caller handles it.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.structural import structural_equal
from kiln.ir.tensor import BinaryOp, Cast, Compare, Const, Intrin, PrimExpr, Select

Range = tuple[float, float]
_UNBOUNDED: Range = (-math.inf, math.inf)
_ROUNDING = {"round": round, "floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}


def float_range(e: PrimExpr) -> Range:
    """Bounds `(lo, hi)` of `e`'s non-NaN values (infinite when unknown)."""
    if isinstance(e, Const):
        v = float(e.value)
        return (v, v) if math.isfinite(v) else _UNBOUNDED
    if isinstance(e, Cast):
        src = e.value.dtype
        if dt.is_int(src) and dt.bits(src) <= 32:
            info = np.iinfo(dt.to_numpy(src))
            return float(info.min), float(info.max)
        return float_range(e.value) if dt.is_float(src) and dt.bits(e.dtype) >= dt.bits(src) \
            else _UNBOUNDED
    if isinstance(e, Intrin) and e.name in _ROUNDING:
        lo, hi = float_range(e.args[0])
        return (math.floor(lo) if math.isfinite(lo) else lo,
                math.ceil(hi) if math.isfinite(hi) else hi)
    if isinstance(e, Select):
        clamp = _select_min_max(e)
        if clamp is not None:
            return _binary(clamp, float_range(e.true_value), float_range(e.false_value))
        (a_lo, a_hi), (b_lo, b_hi) = float_range(e.true_value), float_range(e.false_value)
        return min(a_lo, b_lo), max(a_hi, b_hi)
    if isinstance(e, BinaryOp):
        return _binary(e.op, float_range(e.a), float_range(e.b))
    return _UNBOUNDED


def _select_min_max(e: Select) -> str | None:
    """"min" or "max" when `e` picks between the two operands of its comparison (`v < lo ?
    lo : v` is max(v, lo), NaN aside), else None."""
    cond = e.cond
    if not (isinstance(cond, Compare) and cond.op in ("lt", "le", "gt", "ge")):
        return None
    if structural_equal(e.true_value, cond.a) and structural_equal(e.false_value, cond.b):
        return "min" if cond.op in ("lt", "le") else "max"
    if structural_equal(e.true_value, cond.b) and structural_equal(e.false_value, cond.a):
        return "max" if cond.op in ("lt", "le") else "min"
    return None


def _binary(op: str, a: Range, b: Range) -> Range:
    if op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if not all(map(math.isfinite, (*a, *b))):
        return _UNBOUNDED
    if op == "add":
        return a[0] + b[0], a[1] + b[1]
    if op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if op == "mul":
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    return _UNBOUNDED


def fits_int32(e: PrimExpr) -> bool:
    """Whether every non-NaN value of the float expression `e` truncates into int32
    (with a wide margin, 2**30: the bounds are computed in float64, without the float32
    roundings)."""
    lo, hi = float_range(e)
    return lo > -2.0 ** 30 and hi < 2.0 ** 30
