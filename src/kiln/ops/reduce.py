"""Reductions and normalisations: reduce_{sum,mean,max,min,prod,l1,l2,sum_square,log_sum},
argmax/argmin, cumsum, softmax, log_softmax, layer_norm.

`axes` attributes are non-negative and sorted (the frontend normalises them).
Normalisations ONNX defines as compositions (InstanceNormalization,
GroupNormalization, RMSNormalization, MeanVarianceNormalization,
LpNormalization, ReduceLogSumExp, Hardmax) are mapped onto these ops by their
converters (kiln.frontend.onnx.converters.reduce).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import dim_product, shape_text
from kiln.ir.tensor import Cast, PrimExpr, as_expr, intrin, max_, select
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ops import nan_order, te
from kiln.ops._numpy import is_float, widen, work
from kiln.ops.registry import load_builtin_ops, register_op

Attrs = Mapping[str, Any]
#: The shortest row onnxruntime's MLAS LayerNorm kernel takes (shorter ones run its
#: scalar code, which kiln.kernels.rows' `layer_norm_mlas_row` does not repeat).
MLAS_LAYER_NORM_MIN = 8


@dataclass(frozen=True)
class Reduction:
    """What a reduction op computes over its reduced axes (`axes_of(attrs, ndim)`):
    `kind` (te.reduce's combiner) over `pre(x)`, then `post(total, count)`. The row
    kernels (kiln.kernels.rows) read it to reduce trailing axes by hand."""

    kind: str
    pre: Callable[[PrimExpr], PrimExpr] | None
    post: Callable[[PrimExpr, Any], PrimExpr] | None
    axes_of: Callable[[Attrs, int], tuple[int, ...]]


#: op name -> its Reduction: the reduce ops of this module, the global pools of
#: kiln.ops.pool.
REDUCTIONS: dict[str, Reduction] = {}


def reduction_of(op: str) -> Reduction:
    """The Reduction of the reduction op `op` (KeyError for another op)."""
    load_builtin_ops()  # the global pools register theirs in kiln.ops.pool
    return REDUCTIONS[op]


def mean_of(total: PrimExpr, count: int | PrimExpr) -> PrimExpr:
    """`total / count`; a symbolic `count` (a product of int64 dim scalars) is converted to
    the total's dtype first. Either is taken as at least 1: the mean of no elements is 0,
    as onnxruntime's ReduceMean gives it (the total is 0), not 0/0."""
    if isinstance(count, int):
        return total / max(count, 1)
    return total / Cast(total.dtype, max_(count, 1))


def norm_axes(axes: Any, ndim: int) -> tuple[int, ...]:
    """Axes as sorted non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    items = axes if isinstance(axes, (tuple, list)) else (axes,)
    out = []
    for a in items:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise IRError(f"axis {a} is out of range for a {ndim}-d tensor")
        out.append(a % max(ndim, 1))
    if len(set(out)) != len(out):
        raise IRError(f"repeated axis in {tuple(items)}")
    return tuple(sorted(out))


def reduced_shape(shape: Sequence[Any], axes: Sequence[int], keepdims: bool
                  ) -> tuple[Any, ...]:
    """`shape` reduced over `axes`: 1 there with `keepdims`, else dropped."""
    return tuple(1 if k in axes else d for k, d in enumerate(shape)
                 if keepdims or k not in axes)


def _compute_dtype(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _split_index(i: Sequence[PrimExpr], ndim: int, axes: Sequence[int],
                 keep: bool) -> list[PrimExpr | None]:
    """The output index `i` spread over the input dims (None for reduced dims)."""
    kept = iter(i)
    outer: list[PrimExpr | None] = []
    for k in range(ndim):
        if k in axes:
            if keep:
                next(kept)
            outer.append(None)
        else:
            outer.append(next(kept))
    return outer


def _fill(outer: Sequence[PrimExpr | None], r: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
    rit = iter(r)
    return tuple(next(rit) if o is None else o for o in outer)


def _identity(kind: str, dtype: np.dtype[Any]) -> Any:
    """The value of an empty max/min reduction (ONNX: -inf/+inf, or the int extremes)."""
    if dtype == np.bool_:
        return kind == "min"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if kind == "max" else info.max
    return -np.inf if kind == "max" else np.inf


def _register_reduce(name: str, kind: str, post: Callable[[PrimExpr, Any], PrimExpr] | None,
                     pre: Callable[[PrimExpr], PrimExpr] | None,
                     ref: Callable[..., np.ndarray]) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        x = types[0]
        axes = norm_axes(attrs.get("axes"), x.ndim)
        return TensorType(reduced_shape(x.shape, axes, bool(attrs.get("keepdims", True))),
                          x.dtype)

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        axes = norm_axes(attrs.get("axes"), x.ndim)
        keep = bool(attrs.get("keepdims", True))
        out_shape = reduced_shape(x.shape, axes, keep)
        extents = tuple(x.shape[a] for a in axes)
        count = dim_product(extents)  # an expression when an extent is symbolic
        acc = _compute_dtype(x.dtype)

        def element(*i: PrimExpr) -> PrimExpr:
            outer = _split_index(i, x.ndim, axes, keep)

            def body(*r: PrimExpr) -> PrimExpr:
                v = x[_fill(outer, r)]
                v = v if v.dtype == acc else Cast(acc, v)
                return pre(v) if pre else v

            total = te.reduce(kind, body, extents, acc)
            if kind in SCAN_KINDS and not any(isinstance(e, int) and e == 0 for e in extents):
                # onnxruntime's scan keeps a leading NaN (kiln.ops.nan_order)
                total = nan_order.with_leading_nan(body(*(as_expr(0) for _ in extents)), total)
            total = post(total, count) if post else total
            return total if acc == x.dtype else Cast(x.dtype, total)

        return te.compute(out_shape, element, x.dtype, name)

    def reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
        axes = norm_axes(attrs.get("axes"), x.ndim)
        keep = bool(attrs.get("keepdims", True))
        with np.errstate(all="ignore"):
            return np.asarray(ref(x, axis=axes, keepdims=keep)).astype(x.dtype)

    register_op(name, pattern="reduce", infer=infer, compute=compute, reference=reference)
    REDUCTIONS[name] = Reduction(kind, pre, post, _reduce_axes_of)


def _reduce_axes_of(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    return norm_axes(attrs.get("axes"), ndim)


def _mean_ref(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    total = np.sum(work(x), axis=axis, keepdims=keepdims)
    count = int(np.prod([x.shape[a] for a in axis]))
    if is_float(x):
        return total / max(count, 1)  # no elements: 0, as onnxruntime (mean_of)
    # integers: truncating division, like the kernel
    return np.where(total < 0, -(-total // max(count, 1)), total // max(count, 1))


def _extreme_ref(kind: str) -> Callable[..., np.ndarray]:
    def ref(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return nan_order.scan_extreme_ref(x, kind, axis, keepdims, _identity(kind, x.dtype))
    return ref


#: ReduceMax/ReduceMin follow onnxruntime's scan: the first element, replaced only by a
#: strictly greater (less) one, so a leading NaN stays and a later one is skipped.
SCAN_KINDS = ("scan_max", "scan_min")


_register_reduce("reduce_sum", "sum", None, None,
                 lambda x, axis, keepdims: np.sum(work(x), axis=axis, keepdims=keepdims))
_register_reduce("reduce_mean", "sum", mean_of, None, _mean_ref)
_register_reduce("reduce_max", "scan_max", None, None, _extreme_ref("max"))
_register_reduce("reduce_min", "scan_min", None, None, _extreme_ref("min"))
_register_reduce("reduce_prod", "prod", None, None,
                 lambda x, axis, keepdims: np.prod(work(x), axis=axis, keepdims=keepdims))
_register_reduce("reduce_l1", "sum", None, lambda v: intrin("abs", v) if dt.is_signed(v.dtype)
                 else v,
                 lambda x, axis, keepdims: np.sum(np.abs(work(x)), axis=axis, keepdims=keepdims))
_register_reduce("reduce_l2", "sum", lambda t, n: intrin("sqrt", t), lambda v: v * v,
                 lambda x, axis, keepdims: np.sqrt(np.sum(work(x) ** 2, axis=axis,
                                                          keepdims=keepdims)))
_register_reduce("reduce_sum_square", "sum", None, lambda v: v * v,
                 lambda x, axis, keepdims: np.sum(work(x) ** 2, axis=axis, keepdims=keepdims))
_register_reduce("reduce_log_sum", "sum", lambda t, n: intrin("log", t), None,
                 lambda x, axis, keepdims: np.log(np.sum(work(x), axis=axis,
                                                         keepdims=keepdims)))


# --------------------------------------------------------------------------- argmax, argmin

def _arg_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    if isinstance(x.shape[axis], int) and x.shape[axis] == 0:
        raise IRError(f"arg reduction over an empty axis {axis} of {x}")
    return TensorType(reduced_shape(x.shape, (axis,), bool(attrs.get("keepdims", True))),
                      "int64")


def _arg_compute(kind: str) -> Callable[[Sequence[te.Tensor], Attrs], te.Tensor]:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
        keep = bool(attrs.get("keepdims", True))
        last = bool(attrs.get("select_last_index", False))
        n = x.shape[axis]
        best_shape = reduced_shape(x.shape, (axis,), True)

        def along(i: Sequence[PrimExpr], r: PrimExpr) -> PrimExpr:
            return x[tuple(r if k == axis else i[k] for k in range(x.ndim))]

        # pass 1: onnxruntime's scan value (a leading NaN stays, later ones are skipped);
        # pass 2: the first (or last) index holding it, 0 for a leading NaN
        best = te.compute(best_shape, lambda *i: nan_order.with_leading_nan(
            along(i, as_expr(0)), te.reduce(f"scan_{kind}", lambda r: along(i, r), (n,),
                                            x.dtype)),
            x.dtype, f"arg{kind}_value", materialize=True)

        def element(*i: PrimExpr) -> PrimExpr:
            outer = _split_index(i, x.ndim, (axis,), keep)
            full = tuple(as_expr(0) if o is None else o for o in outer)

            def hit(r: PrimExpr) -> PrimExpr:
                found = x[_fill(outer, (r,))].eq(best[full])
                return select(found, r, as_expr(-1 if last else n))

            index = te.reduce("max" if last else "min", hit, (n,), "int64")
            return select(nan_order.is_nan(best[full]), as_expr(0), index)

        return te.compute(reduced_shape(x.shape, (axis,), keep), element, "int64",
                          f"arg{kind}")
    return compute


def _arg_ref(kind: str) -> Callable[..., np.ndarray]:
    def ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
        (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
        out = nan_order.scan_arg_ref(x, kind, axis, bool(attrs.get("select_last_index", 0)))
        return np.expand_dims(out, axis) if attrs.get("keepdims", True) else out
    return ref


register_op("argmax", pattern="reduce", infer=_arg_infer, compute=_arg_compute("max"),
            reference=_arg_ref("max"))
register_op("argmin", pattern="reduce", infer=_arg_infer, compute=_arg_compute("min"),
            reference=_arg_ref("min"))


# --------------------------------------------------------------------------- cumsum, cumprod

def _cumulative_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    norm_axes(attrs.get("axis", 0), types[0].ndim)
    return types[0]


def _cumulative_compute(kind: str) -> Callable[[Sequence[te.Tensor], Attrs], te.Tensor]:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
        exclusive, reverse = bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0))
        acc = _compute_dtype(x.dtype)
        neutral = as_expr(0 if kind == "sum" else 1, acc)

        def element(*i: PrimExpr) -> PrimExpr:
            here = i[axis]

            def term(k: PrimExpr) -> PrimExpr:
                if reverse:
                    take = k > here if exclusive else k >= here
                else:
                    take = k < here if exclusive else k <= here
                v = x[tuple(k if d == axis else i[d] for d in range(x.ndim))]
                v = v if v.dtype == acc else Cast(acc, v)
                return select(take, v, neutral)

            total = te.reduce(kind, term, (x.shape[axis],), acc)
            return total if acc == x.dtype else Cast(x.dtype, total)

        return te.compute(x.shape, element, x.dtype, f"cum{kind}")
    return compute


def _cumulative_ref(kind: str) -> Callable[..., np.ndarray]:
    def ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
        (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
        v = widen(x)
        if attrs.get("reverse", 0):
            v = np.flip(v, axis)
        out = (np.cumsum if kind == "sum" else np.cumprod)(v, axis=axis)
        if attrs.get("exclusive", 0):
            # shift by one along the axis, the neutral element first
            first = np.take(np.zeros_like(out) if kind == "sum" else np.ones_like(out), [0],
                            axis=axis)
            out = np.concatenate([first, np.take(out, np.arange(out.shape[axis] - 1),
                                                 axis=axis)], axis=axis)
        if attrs.get("reverse", 0):
            out = np.flip(out, axis)
        return np.ascontiguousarray(out).astype(x.dtype)
    return ref


for _kind in ("sum", "prod"):
    register_op(f"cum{_kind}", pattern="opaque", infer=_cumulative_infer,
                compute=_cumulative_compute(_kind), reference=_cumulative_ref(_kind))


# --------------------------------------------------------------------------- topk

def _topk_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    (axis,) = norm_axes(attrs.get("axis", -1), x.ndim)
    k = int(attrs["k"])
    n = x.shape[axis]
    if not isinstance(n, int):
        raise IRError(f"topk: the axis {axis} of {shape_text(x.shape)} must be static")
    if not 0 <= k <= n:
        raise IRError(f"topk: k = {k} is outside [0, {n}] for {x}")
    shape = list(x.shape)
    shape[axis] = k
    return TupleType((TensorType(tuple(shape), x.dtype), TensorType(tuple(shape), "int64")))


def topk_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> tuple[te.Tensor, te.Tensor]:
    """TopK's kernels: the k largest (or smallest) values along `axis` and their indices."""
    (x,) = inputs
    (axis,) = norm_axes(attrs.get("axis", -1), x.ndim)
    # k is a size, or a run-time dimension (kiln.ops.data_dependent's TopK)
    k = attrs["k"] if isinstance(attrs["k"], PrimExpr) else int(attrs["k"])
    largest = bool(attrs.get("largest", 1))
    n = x.shape[axis]

    def at(i: Sequence[PrimExpr], m: PrimExpr) -> PrimExpr:
        return x[tuple(m if d == axis else i[d] for d in range(x.ndim))]

    # onnxruntime's order, NaN above +inf and NaNs equal, as integer keys made once
    # (kiln.ops.nan_order.order_key): the ranks below are a permutation, every index found
    key = x if not dt.is_float(x.dtype) else te.compute(
        x.shape, lambda *i: nan_order.order_key(x[i]), nan_order.order_key_dtype(x.dtype),
        "topk_key", materialize=True)

    # rank[i] = how many elements come before x[i] (better value, or equal and earlier)
    def rank_of(*i: PrimExpr) -> PrimExpr:
        def before(m: PrimExpr) -> PrimExpr:
            a, b = key[tuple(m if d == axis else i[d] for d in range(x.ndim))], key[i]
            better = a > b if largest else a < b
            return select(better | (a.eq(b) & (m < i[axis])), as_expr(1), as_expr(0))
        return te.reduce("sum", before, (n,), "int64")

    rank = te.compute(x.shape, rank_of, "int64", "rank", materialize=True)
    shape: list[Any] = list(x.shape)
    shape[axis] = k

    def index_of(*j: PrimExpr) -> PrimExpr:
        return te.reduce("min", lambda m: select(rank[tuple(m if d == axis else j[d] for d in
                                                            range(x.ndim))].eq(j[axis]),
                                                 m, as_expr(n)), (n,), "int64")

    indices = te.compute(shape, index_of, "int64", "topk_indices", materialize=True)
    values = te.compute(shape, lambda *j: at(j, te.clamp_index(indices[j], n)), x.dtype,
                        "topk_values")
    return values, indices


def topk_ref(x: np.ndarray, **attrs: Any) -> tuple[np.ndarray, np.ndarray]:
    """TopK in numpy (onnxruntime's order: NaN above +inf, the lower index first among
    equal values)."""
    (axis,) = norm_axes(attrs.get("axis", -1), x.ndim)
    order = nan_order.order_argsort_ref(x, axis, bool(attrs.get("largest", 1)))
    idx = np.take(order, np.arange(int(attrs["k"])), axis=axis).astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


register_op("topk", pattern="opaque", infer=_topk_infer, compute=topk_compute,
            reference=topk_ref)


# --------------------------------------------------------------------------- softmax

def _same_type(types: Sequence[TensorType], attrs: Attrs) -> Type:
    norm_axes(attrs.get("axis", -1), types[0].ndim)
    return types[0]


def _softmax_compute(log: bool) -> Callable[[Sequence[te.Tensor], Attrs], te.Tensor]:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        (axis,) = norm_axes(attrs.get("axis", -1), x.ndim)
        n = x.shape[axis]
        acc = _compute_dtype(x.dtype)
        outer = tuple(d for k, d in enumerate(x.shape) if k != axis)

        def at(i: Sequence[PrimExpr], r: PrimExpr) -> PrimExpr:
            idx = list(i)
            idx.insert(axis, r)
            v = x[tuple(idx)]
            return v if v.dtype == acc else Cast(acc, v)

        mx = te.compute(outer, lambda *i: te.reduce("max", lambda r: at(i, r), (n,), acc),
                        acc, "row_max", materialize=True)
        total = te.compute(outer, lambda *i: te.reduce(
            "sum", lambda r: intrin("exp", at(i, r) - mx[i]), (n,), acc),
            acc, "row_sum", materialize=True)

        def element(*i: PrimExpr) -> PrimExpr:
            rest = i[:axis] + i[axis + 1:]
            shifted = at(rest, i[axis]) - mx[rest]
            v = shifted - intrin("log", total[rest]) if log else \
                intrin("exp", shifted) / total[rest]
            return v if acc == x.dtype else Cast(x.dtype, v)

        return te.compute(x.shape, element, x.dtype, "log_softmax" if log else "softmax")

    return compute


def softmax_ref(x: np.ndarray, axis: int = -1, **attrs: Any) -> np.ndarray:
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):  # a row of -inf, or holding +inf, is NaN
        e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
        return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _log_softmax_ref(x: np.ndarray, axis: int = -1, **attrs: Any) -> np.ndarray:
    x64 = x.astype(np.float64)
    s = x64 - x64.max(axis=axis, keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=axis, keepdims=True))).astype(x.dtype)


# Row kernels built by hand (kiln.kernels.rows); FuseOps fuses elementwise chains
# on both sides of them.
#: softmax over an axis as a tensor expression (also attention_tiled's fallback).
softmax_compute = _softmax_compute(False)
register_op("softmax", pattern="reduce", infer=_same_type, compute=softmax_compute,
            reference=softmax_ref)
register_op("log_softmax", pattern="reduce", infer=_same_type, compute=_softmax_compute(True),
            reference=_log_softmax_ref)


# --------------------------------------------------------------------------- layer norm

def _layer_norm_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if not dt.is_float(x.dtype):
        raise IRError(f"layer_norm needs a float tensor, got {x}")
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    norm_shape = tuple(x.shape[axis:])
    for t in types[1:]:
        if len(t.shape) > len(norm_shape) or \
                tuple(t.shape) != norm_shape[len(norm_shape) - len(t.shape):]:
            raise IRError(f"layer_norm: scale/bias shape {t.shape} does not fit {norm_shape}")
    return x


def _layer_norm_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x = inputs[0]
    scale = inputs[1] if len(inputs) > 1 else None
    bias = inputs[2] if len(inputs) > 2 else None
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    eps = float(attrs.get("epsilon", 1e-5))
    acc = _compute_dtype(x.dtype)
    outer = x.shape[:axis]
    inner = x.shape[axis:]
    count = int(np.prod(inner))

    def at(o: Sequence[PrimExpr], r: Sequence[PrimExpr]) -> PrimExpr:
        v = x[tuple(o) + tuple(r)]
        return v if v.dtype == acc else Cast(acc, v)

    mean = te.compute(outer, lambda *o: te.reduce("sum", lambda *r: at(o, r), inner, acc)
                      / count, acc, "mean", materialize=True)
    var = te.compute(outer, lambda *o: te.reduce(
        "sum", lambda *r: (at(o, r) - mean[o]) * (at(o, r) - mean[o]), inner, acc) / count,
        acc, "var", materialize=True)

    def element(*i: PrimExpr) -> PrimExpr:
        o, r = i[:axis], i[axis:]
        v = (at(o, r) - mean[o]) * intrin("rsqrt", var[o] + eps)
        if scale is not None:
            s = scale[r[len(r) - scale.ndim:]]
            v = v * (s if s.dtype == acc else Cast(acc, s))
        if bias is not None:
            b = bias[r[len(r) - bias.ndim:]]
            v = v + (b if b.dtype == acc else Cast(acc, b))
        return v if acc == x.dtype else Cast(x.dtype, v)

    return te.compute(x.shape, element, x.dtype, "layer_norm")


def _layer_norm_ref(x: np.ndarray, scale: np.ndarray | None = None,
                    bias: np.ndarray | None = None, **attrs: Any) -> np.ndarray:
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    axes = tuple(range(axis, x.ndim))
    acc = dt.to_numpy(_compute_dtype(dt.from_numpy(x.dtype)))
    # the kernels' statistics: the mean rounded to the compute dtype, the squared
    # deviations summed in it (infinite where that sum overflows: the outputs are then 0)
    with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN rows give NaN
        mean = x.astype(np.float64).mean(axis=axes, keepdims=True).astype(acc)
        centred = x.astype(acc).astype(np.float64) - mean
        squares = (centred ** 2).sum(axis=axes, keepdims=True)
        var = np.where(squares > np.finfo(acc).max, np.inf, squares / np.prod(
            [x.shape[a] for a in axes]))
        y = centred / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
    if scale is not None:
        y = y * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(x.dtype)


register_op("layer_norm", pattern="reduce", infer=_layer_norm_infer,
            compute=_layer_norm_compute, reference=_layer_norm_ref)
