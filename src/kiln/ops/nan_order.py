"""NaN and infinity through comparisons: the one place that says how kiln's operators
order, compare, take the extreme of and clamp non-finite values, as IR expressions and
as the numpy references that check them.

ONNX leaves most of this open; kiln follows onnxruntime (CPU) operator by operator,
and onnxruntime's kernels differ: a reduction keeps its first element and replaces it
only by a strictly greater one, so it ignores a later NaN but keeps a leading one;
TopK sorts NaN above +inf; Clip ignores a NaN bound; Max, Min and Relu propagate a
NaN operand. The rules, each named after what it does, and who uses them:

- `max_propagate` / `min_propagate`: a NaN operand wins (Max, Min, Relu);
- `max_ignore_nan` / `min_ignore_nan`: a NaN operand loses, NaN only if both are;
- `max_keep_first` / `min_keep_first` (with `with_leading_nan` for lanes): onnxruntime's
  scan, a NaN candidate never replaces the best so far and a NaN best stays
  (ReduceMax/Min, ArgMax/Min, Hardmax, the row max of softmax; MaxPool and
  GlobalMaxPool from the most negative finite value, kiln.kernels.pool.max_rows);
- `max_keep_second` / `min_keep_second`: the other way round, a NaN candidate replaces
  and a NaN best is replaced by the next candidate (ScatterElements/ScatterND `max`
  and `min`);
- `order_greater` / `order_less` / `order_equal`, and `order_key` (an integer with that
  order): a total order, NaN above +inf (`NanPlace.HIGH`: TopK, Unique's sorted output)
  or below -inf (`NanPlace.LOW`: NonMaxSuppression's candidates), all NaNs equal;
- `clip_below` / `clip_above`: a NaN bound is ignored, a NaN value stays (Clip).

`scan_extreme_ref`, `scan_arg_ref` and `order_argsort_ref` are the numpy side of the
same rules, for the ops' references (constant folding, kiln.ops.evaluate, the tests).

Why kiln.ops, not kiln.ir: the IR defines one meaning for its comparisons (ordered:
false when an operand is NaN; `ne` unordered), for `select`, for the `isnan` intrinsic
and for its `min`/`max` binary ops (numpy's `np.minimum`/`np.maximum`: a NaN operand
wins, ties give the first operand; kiln.ir.tensor, the interpreter's `_fmax`,
kiln.codegen.llvm.arith, the C printer's `kiln_max_*` helpers), and every backend and
the reference interpreter implement exactly those. Which NaN rule an *operator*
follows is a fact about the operator (and the runtime kiln matches), not about the IR,
so it lives with the operators, built from those primitives only: no pass or backend
needs to know, the interpreter, llvm and c agree because they agree on the
primitives, and kiln.ir stays a leaf that knows no ONNX. The names here are public
and stable (the quantization operators call them too).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.tensor import Cast, Const, PrimExpr, binary, intrin, max_, min_, reinterpret, select
from kiln.ops._numpy import is_float, widen


class NanPlace(StrEnum):
    """Where NaN sits in a total order of floats (all NaNs equal to each other)."""

    HIGH = "high"  # above +inf: onnxruntime's TopK, numpy's sort puts NaN last too
    LOW = "low"    # below -inf: a NaN score ranks after every number


def is_nan(x: PrimExpr) -> PrimExpr:
    """`x` is NaN (bool); the constant False for integer and bool values."""
    if not dt.is_float(x.dtype):
        return Const(False, "bool")
    return intrin("isnan", x)


def _not_nan(x: PrimExpr) -> PrimExpr:
    return Const(True, "bool") if not dt.is_float(x.dtype) else ~intrin("isnan", x)


# --------------------------------------------------------------------------- min / max

def max_propagate(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """max(a, b) where a NaN operand wins (numpy's `maximum`; ties give `a`): the IR's
    own `max` BinaryOp."""
    return max_(a, b)


def min_propagate(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """min(a, b) where a NaN operand wins (numpy's `minimum`; ties give `a`)."""
    return min_(a, b)


def max_ignore_nan(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """max(a, b) ignoring a NaN operand (C's `fmax`): NaN only when both are."""
    if not dt.is_float(a.dtype):
        return max_(a, b)
    return select((b > a) | is_nan(a), b, a)


def min_ignore_nan(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """min(a, b) ignoring a NaN operand (C's `fmin`): NaN only when both are."""
    if not dt.is_float(a.dtype):
        return min_(a, b)
    return select((b < a) | is_nan(a), b, a)


def max_keep_first(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`b` if it is strictly greater than `a`, else `a`: when either is NaN, `a`.
    onnxruntime's scan for a maximum is `best = max_keep_first(best, x)` from the first
    element: a NaN `x` never replaces, a NaN `best` is never replaced, ties keep the
    earlier element. One `maxps` on x86."""
    return _keep(a, b, greater=True, first=True)


def min_keep_first(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`b` if it is strictly less than `a`, else `a`: when either is NaN, `a`."""
    return _keep(a, b, greater=False, first=True)


def max_keep_second(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`a` if it is strictly greater than `b`, else `b`: when either is NaN, `b`.
    onnxruntime's ScatterElements/ScatterND `max` is `cur = max_keep_second(cur, update)`:
    a NaN update replaces, a NaN `cur` is replaced by the next update."""
    return _keep(a, b, greater=True, first=False)


def min_keep_second(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`a` if it is strictly less than `b`, else `b`: when either is NaN, `b`."""
    return _keep(a, b, greater=False, first=False)


def _keep(a: PrimExpr, b: PrimExpr, greater: bool, first: bool) -> PrimExpr:
    """The operand that is strictly beyond the other (greater or less); when neither
    is (a tie, or a NaN), `a` if `first` else `b`. Bools have no order but min/max."""
    if dt.is_bool(a.dtype):
        return max_(a, b) if greater else min_(a, b)
    if first:
        return select(b > a if greater else b < a, b, a)
    return select(a > b if greater else a < b, a, b)


def with_leading_nan(first: PrimExpr, total: PrimExpr) -> PrimExpr:
    """The result of a `max_keep_first` (`min_keep_first`) scan that started at the first
    element `first`, given `total`, the same scan started at the identity (-inf, +inf):
    the scans differ only when `first` is NaN, which the scan then keeps. Lets a scan
    run in independent lanes (vectorized) and still keep onnxruntime's result."""
    if not dt.is_float(first.dtype):
        return total
    return select(is_nan(first), first, total)


# --------------------------------------------------------------------------- orders

def order_greater(a: PrimExpr, b: PrimExpr, nan: NanPlace = NanPlace.HIGH) -> PrimExpr:
    """`a` is above `b` in the total order with NaN at `nan` (NaNs equal each other)."""
    if not dt.is_float(a.dtype):
        return a > b
    if nan is NanPlace.HIGH:
        return (a > b) | (is_nan(a) & _not_nan(b))
    return (a > b) | (is_nan(b) & _not_nan(a))


def order_less(a: PrimExpr, b: PrimExpr, nan: NanPlace = NanPlace.HIGH) -> PrimExpr:
    """`a` is below `b` in the total order with NaN at `nan` (NaNs equal each other)."""
    return order_greater(b, a, nan)


def order_equal(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`a` equals `b` in the total orders above: equal numbers, or both NaN."""
    if not dt.is_float(a.dtype):
        return a.eq(b)
    return a.eq(b) | (is_nan(a) & is_nan(b))


def order_key(x: PrimExpr, nan: NanPlace = NanPlace.HIGH) -> PrimExpr:
    """An integer ordered as `x` is in the total order with NaN at `nan` (equal keys for
    equal values: -0.0 and 0.0 share one, so do all NaNs), so that a kernel comparing
    many pairs compares integers once the keys are made: the float's bits, the
    negative ones' magnitude bits flipped. Integers are their own key; 16-bit floats
    key as float32."""
    if not dt.is_float(x.dtype):
        return x
    wide, itype = ("float64", "int64") if x.dtype == "float64" else ("float32", "int32")
    v = x if x.dtype == wide else Cast(wide, x)
    top = (1 << (dt.bits(itype) - 1)) - 1
    bits = reinterpret(v + Const(0.0, wide), itype)  # + 0.0 turns -0.0 into 0.0
    mono = select(bits < Const(0, itype), binary("xor", bits, Const(top, itype)), bits)
    return select(is_nan(x), Const(top if nan is NanPlace.HIGH else -top - 1, itype), mono)


def order_key_dtype(dtype: str) -> str:
    """The dtype of `order_key` of a `dtype` value."""
    if not dt.is_float(dtype):
        return dtype
    return "int64" if dtype == "float64" else "int32"


# --------------------------------------------------------------------------- clamps

def clip_below(x: PrimExpr, lo: PrimExpr) -> PrimExpr:
    """`x` raised to at least `lo` as onnxruntime's Clip does: a NaN `x` stays NaN, a
    NaN `lo` is ignored (`lo > x` is false for both)."""
    if isinstance(lo, Const) and not _is_nan_const(lo):
        return max_(x, lo)  # NaN x still wins; the IR's max is the cheapest form
    return select(lo > x, lo, x)


def clip_above(x: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """`x` lowered to at most `hi` as onnxruntime's Clip does: a NaN `x` stays NaN, a
    NaN `hi` is ignored."""
    if isinstance(hi, Const) and not _is_nan_const(hi):
        return min_(x, hi)
    return select(hi < x, hi, x)


def _is_nan_const(c: Const) -> bool:
    return isinstance(c.value, float) and c.value != c.value


# --------------------------------------------------------------------------- numpy

def _to_last(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """`x` with `axes` moved to the end and flattened into one, in row-major order."""
    rest = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, rest + list(axes))
    return moved.reshape((*(x.shape[a] for a in rest), -1))


def scan_extreme_ref(x: np.ndarray, kind: str, axes: Sequence[int], keepdims: bool,
                     initial: Any) -> np.ndarray:
    """ReduceMax (`kind` "max") or ReduceMin over `axes` by onnxruntime's scan: NaN when
    the first reduced element (row-major) is NaN, else the extreme of the numbers (NaN
    when there are none); `initial` for an empty reduction."""
    flat = _to_last(widen(x), axes)
    out_shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape)
                      if keepdims or a not in axes)
    if flat.shape[-1] == 0:
        return np.full(out_shape, initial, dtype=x.dtype)
    if not is_float(flat):
        fn = np.max if kind == "max" else np.min
        return np.asarray(fn(flat, axis=-1)).astype(x.dtype).reshape(out_shape)
    with np.errstate(invalid="ignore"):
        total = (np.fmax if kind == "max" else np.fmin).reduce(flat, axis=-1)
    first = flat[..., 0]
    return np.where(np.isnan(first), first, total).astype(x.dtype).reshape(out_shape)


def scan_arg_ref(x: np.ndarray, kind: str, axis: int, last: bool) -> np.ndarray:
    """ArgMax (`kind` "max") or ArgMin along `axis` by onnxruntime's scan (int64, the
    axis dropped): the first (`last`: the last) index holding the `scan_extreme_ref`
    value; 0 when that value is NaN (a leading NaN is never replaced)."""
    data = widen(x)
    best = scan_extreme_ref(data, kind, (axis,), True, 0)
    hits = np.moveaxis(data == best, axis, -1)
    n = hits.shape[-1]
    idx = n - 1 - np.argmax(hits[..., ::-1], axis=-1) if last else np.argmax(hits, axis=-1)
    if is_float(data):
        idx = np.where(np.isnan(np.moveaxis(best, axis, -1)[..., 0]), 0, idx)
    return np.asarray(idx, dtype=np.int64)


def order_argsort_ref(x: np.ndarray, axis: int, descending: bool,
                      nan: NanPlace = NanPlace.HIGH) -> np.ndarray:
    """The indices sorting `x` along `axis` in the total order with NaN at `nan`, equal
    values (NaNs too) by ascending index: TopK's order. numpy's stable sort already puts
    NaN last (HIGH) ascending; descending sorts the reversed axis and reverses back."""
    moved = np.moveaxis(x.astype(np.float32) if _is_bfloat16(x) else x, axis, -1)
    n = moved.shape[-1]
    if descending:
        order = n - 1 - np.flip(np.argsort(np.flip(moved, -1), axis=-1, kind="stable"), -1)
    else:
        order = np.argsort(moved, axis=-1, kind="stable")
    if moved.dtype.kind == "f" and nan is NanPlace.LOW:
        # numpy's NaN block (last ascending, first descending) to the other end, stably
        holds_nan = np.isnan(np.take_along_axis(moved, order, -1))
        key = holds_nan if descending else ~holds_nan
        order = np.take_along_axis(order, np.argsort(key, axis=-1, kind="stable"), -1)
    return np.moveaxis(order, -1, axis).astype(np.int64)


def _is_bfloat16(x: np.ndarray) -> bool:
    return x.dtype.name == "bfloat16"


__all__ = ["NanPlace", "clip_above", "clip_below", "is_nan", "max_ignore_nan", "max_keep_first",
           "max_keep_second", "max_propagate", "min_ignore_nan", "min_keep_first",
           "min_keep_second", "min_propagate",
           "order_argsort_ref", "order_equal", "order_greater", "order_key", "order_key_dtype",
           "order_less",
           "scan_arg_ref", "scan_extreme_ref", "with_leading_nan"]
