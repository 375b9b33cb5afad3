"""Dtype-changing and selecting elementwise ops: cast, where, clip, comparisons and
logic (equal, less, logical_and, logical_not, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.tensor import (
    Cast,
    Const,
    PrimExpr,
    UnaryOp,
    as_expr,
    binary,
    compare,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import nan_order, te
from kiln.ops._numpy import is_float
from kiln.ops.broadcast import broadcast_index, broadcast_shapes, broadcast_types
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


# ----------------------------------------------------------------------- cast

#: `cast`'s `float_to_int` rules for a float -> integer cast of NaN, +-inf and values
#: whose truncation the integer type cannot hold: "wrap", the IR's own (a kiln.ir Cast:
#: kiln.codegen.llvm.arith), and "x86", onnxruntime's on x86 (the ONNX Cast and CastLike
#: converters ask for it): cvttss2si's "integer indefinite", the most negative int32 or
#: int64, then the narrower types' low bits.
WRAP, X86 = "wrap", "x86"
FLOAT_TO_INT = (WRAP, X86)
_INT32_MIN, _INT64_MIN = -(2 ** 31), -(2 ** 63)


def _cast_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    rule = attrs.get("float_to_int", WRAP)
    if rule not in FLOAT_TO_INT:
        raise IRError(f"cast: float_to_int must be one of {', '.join(FLOAT_TO_INT)}, "
                      f"got {rule!r}")
    return TensorType(types[0].shape, dt.check_dtype(attrs["dtype"]))


def _cast_value(v: PrimExpr, dtype: str, rule: str = WRAP) -> PrimExpr:
    if v.dtype == dtype:
        return v
    if dtype == "bool":
        return compare("ne", v, Const(0, v.dtype))
    if rule == X86 and dt.is_float(v.dtype) and dt.is_int(dtype):
        return _x86_float_to_int(v, dtype)
    return Cast(dtype, v)


def _indefinite(v: PrimExpr, wide: str) -> PrimExpr:
    """x86's truncating conversion of float `v` to `wide` (int32 or int64): NaN and values
    whose truncation `wide` cannot hold give its most negative value."""
    low = float(_INT32_MIN if wide == "int32" else _INT64_MIN)
    # NaN fails both; a value just below `low` truncates to `low`, the fallback itself
    ok = (v >= as_expr(low, v.dtype)) & (v < as_expr(-low, v.dtype))
    # the IR's Cast of the others is defined (kiln.codegen.llvm.arith) and selected away;
    # clearing them first would cost more than the select (the conversion folds into it)
    return select(ok, Cast(wide, v), Const(int(low), wide))


def _x86_float_to_int(v: PrimExpr, dtype: str) -> PrimExpr:
    """onnxruntime's float -> `dtype` conversion on x86 (its compiler's code): int32 and
    the narrower types through int32, then their low bits; int64 through int64; uint64,
    and uint32 from float32, float64 and bfloat16, through the signed type of their width
    with 2**(bits-1) taken off the values above it and the top bit flipped back
    (`_unsigned`); uint32 from float16 through int64, then its low bits."""
    half = v.dtype == "float16"
    if v.dtype != "float64":
        v = Cast("float32", v)  # 16-bit floats compute in float32 (exact)
    if dtype == "uint64" or (dtype == "uint32" and not half):
        return Cast(dtype, _unsigned(v, "int64" if dtype == "uint64" else "int32"))
    wide = _indefinite(v, "int64" if dtype in ("int64", "uint32") else "int32")
    return wide if wide.dtype == dtype else Cast(dtype, wide)


def _unsigned(v: PrimExpr, wide: str) -> PrimExpr:
    """The bits of x86's float -> unsigned conversion, as the signed `wide`: values from
    2**(bits-1) on converted less that, with the top bit set again."""
    low = _INT32_MIN if wide == "int32" else _INT64_MIN
    top = as_expr(-float(low), v.dtype)
    big = v >= top
    bits = _indefinite(select(big, v - top, v), wide)
    return select(big, binary("xor", bits, Const(low, wide)), bits)


def _cast_ref(x: np.ndarray, dtype: str, float_to_int: str = WRAP, **attrs: Any) -> np.ndarray:
    target = dt.to_numpy(dtype)
    if not is_float(x) or not dt.is_int(dtype):
        return x.astype(target)
    v = x.astype(np.float64)  # exact for every float dtype; the bounds compare alike
    if float_to_int == WRAP:
        return _wrap_ref(v, dtype)
    if dtype == "uint64" or (dtype == "uint32" and x.dtype != np.float16):
        bits = dt.bits(dtype)
        top = 2.0 ** (bits - 1)
        with np.errstate(invalid="ignore"):
            big = v >= top
        wide = _indefinite_ref(np.where(big, v - top, v), bits)
        return np.where(big, wide ^ np.int64(-top), wide).astype(target)
    wide = _indefinite_ref(v, 64 if dtype in ("int64", "uint32") else 32)
    return wide.astype(target)  # integer to integer: the low bits


def _wrap_ref(v: np.ndarray, dtype: str) -> np.ndarray:
    """The IR's float -> integer rule (kiln.codegen.llvm.arith): truncation, wrapped to
    the type's bits within int64 (within uint64 for uint64), saturated beyond, NaN 0."""
    top = 2.0 ** 63
    with np.errstate(invalid="ignore"):
        inside, above, below = (v >= -top) & (v < top), v >= top, v < -top
    wide = np.zeros(v.shape, np.int64)
    wide[inside] = np.trunc(v[inside]).astype(np.int64)
    wide[above], wide[below] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    if dtype != "uint64":
        return wide.astype(dt.to_numpy(dtype))
    out = wide.astype(np.uint64)
    with np.errstate(invalid="ignore"):
        huge = v >= 2.0 * top
    out[above & ~huge] = v[above & ~huge].astype(np.uint64)
    out[huge] = np.iinfo(np.uint64).max
    return out


def _indefinite_ref(v: np.ndarray, bits: int) -> np.ndarray:
    low = -(2.0 ** (bits - 1))
    with np.errstate(invalid="ignore"):
        ok = (v >= low) & (v < -low)
    out = np.full(v.shape, int(low), np.int64)
    out[ok] = np.trunc(v[ok]).astype(np.int64)
    return out


register_op("cast", pattern="elemwise", infer=_cast_infer,
            compute=lambda ins, a: te.compute(
                ins[0].shape, lambda *i: _cast_value(ins[0][i], a["dtype"],
                                                     a.get("float_to_int", WRAP)),
                a["dtype"], "cast"),
            reference=_cast_ref)


# ---------------------------------------------------------------- where, clip

def _where_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    c, a, b = types
    if c.dtype != "bool":
        raise IRError(f"where: condition must be bool, got {c.dtype}")
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return TensorType(shape, broadcast_types([a, b]).dtype)


def _where_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    c, a, b = inputs
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return te.compute(shape, lambda *i: select(
        c[broadcast_index(i, c.shape)], a[broadcast_index(i, a.shape)],
        b[broadcast_index(i, b.shape)]), a.dtype, "where")


register_op("where", pattern="broadcast", infer=_where_infer, compute=_where_compute,
            reference=lambda c, a, b, **k: np.where(c, a, b))


def _clip_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    lo, hi = attrs.get("min"), attrs.get("max")

    def element(*i: PrimExpr) -> PrimExpr:
        v = x[i]
        # onnxruntime's Clip: a NaN bound is ignored, a NaN value stays NaN
        if lo is not None:
            v = nan_order.clip_below(v, as_expr(lo, x.dtype))
        if hi is not None:
            v = nan_order.clip_above(v, as_expr(hi, x.dtype))
        return v

    return te.compute(x.shape, element, x.dtype, "clip")


register_op("clip", pattern="elemwise", infer=lambda t, a: t[0], compute=_clip_compute,
            reference=lambda x, min=None, max=None, **a: _clip_ref(x, min, max))


def _clip_ref(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    out = x
    # a NaN bound is ignored (kiln.ops.nan_order.clip_below); a NaN value stays
    if lo is not None and not np.isnan(lo):
        out = np.maximum(out, np.asarray(lo).astype(x.dtype))
    if hi is not None and not np.isnan(hi):
        out = np.minimum(out, np.asarray(hi).astype(x.dtype))
    return np.array(out, dtype=x.dtype)


# --------------------------------------------------------- comparisons, logic

COMPARISONS: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "equal": ("eq", np.equal), "not_equal": ("ne", np.not_equal), "less": ("lt", np.less),
    "less_equal": ("le", np.less_equal), "greater": ("gt", np.greater),
    "greater_equal": ("ge", np.greater_equal),
}


LOGIC: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "logical_and": ("and", np.logical_and), "logical_or": ("or", np.logical_or),
    "logical_xor": ("xor", np.logical_xor),
}


def _register_cmp(name: str, fn: Callable[[PrimExpr, PrimExpr], PrimExpr], ref: Callable[..., Any],
                  check_bool: bool) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        t = broadcast_types(types)
        if check_bool and t.dtype != "bool":
            raise IRError(f"{name} needs bool operands, got {t.dtype}")
        return TensorType(t.shape, "bool")

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        a, b = inputs
        shape = broadcast_shapes(a.shape, b.shape)
        return te.compute(shape, lambda *i: fn(a[broadcast_index(i, a.shape)],
                                               b[broadcast_index(i, b.shape)]), "bool", name)

    register_op(name, pattern="broadcast", infer=infer, compute=compute,
                reference=lambda a, b, **k: ref(a, b))


def _scalar_op(op: str, comparison: bool) -> Callable[[PrimExpr, PrimExpr], PrimExpr]:
    def fn(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        return compare(op, a, b) if comparison else binary(op, a, b)
    return fn


for _n, (_op, _r) in COMPARISONS.items():
    _register_cmp(_n, _scalar_op(_op, True), _r, False)


for _n, (_op, _r) in LOGIC.items():
    _register_cmp(_n, _scalar_op(_op, False), _r, True)


register_op("logical_not", pattern="elemwise",
            infer=lambda t, a: t[0] if t[0].dtype == "bool" else _not_bool(t[0]),
            compute=lambda ins, a: te.compute(ins[0].shape, lambda *i: UnaryOp("not", ins[0][i]),
                                              "bool", "logical_not"),
            reference=lambda x, **a: np.logical_not(x))


def _not_bool(t: TensorType) -> Type:
    raise IRError(f"logical_not needs a bool tensor, got {t.dtype}")
