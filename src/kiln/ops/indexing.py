"""Indexing ops: gather, gather_elements, gather_nd, scatter_elements, scatter_nd
(ONNX's converters, OneHot's among them: kiln.frontend.onnx.converters.indexing)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.kernel_errors import KERNEL_ERRORS, op_error_code
from kiln.ir.shape_expr import dim_at_least, dim_product, dim_text, dims_equal, shape_text
from kiln.ir.tensor import (
    Cast,
    PrimExpr,
    as_expr,
    max_,
    min_,
    select,
)
from kiln.ir.types import Dim, TensorType, Type
from kiln.ops import nan_order, te
from kiln.ops.reduce import norm_axes
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


# ------------------------------------------------------- index range checks
# ONNX indexing ops reject indices outside [-n, n) (onnxruntime: "indices element
# out of data bounds"); kernels verify them before computing (te.Check) and the
# numpy references raise the same message. The kernels still clamp, so memory
# stays safe whatever the order of evaluation.

def _as_int64(k: PrimExpr) -> PrimExpr:
    return k if k.dtype == "int64" else Cast("int64", k)


def index_check(op: str, ind: te.Tensor, extent: Dim, component: int | None = None
                ) -> te.Check:
    """Every index of `ind` (or its last-axis `component`) is in [-extent, extent)."""
    def ok(*j: PrimExpr) -> PrimExpr:
        k = _as_int64(ind[j if component is None else (*j, as_expr(component))])
        return (k >= -extent) & (k < extent)

    shape = ind.shape if component is None else ind.shape[:-1]
    return te.Check(shape, ok, op_error_code(op))


def check_indices(op: str, idx: np.ndarray, extent: int) -> None:
    """The reference's version of `index_check`: IRError with the kernel's message."""
    if idx.size and (int(idx.min()) < -extent or int(idx.max()) >= extent):
        raise IRError(KERNEL_ERRORS[op_error_code(op)])


# --------------------------------------------------------------------- gather

def _gather_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    if not dt.is_int(idx.dtype):
        raise IRError(f"gather: indices must be integers, got {idx.dtype}")
    return TensorType((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]), x.dtype)


def _gather_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    out = _gather_infer([TensorType(x.shape, x.dtype), TensorType(ind.shape, ind.dtype)], attrs)
    assert isinstance(out, TensorType)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        k = ind[i[axis:axis + ind.ndim]]
        k = k if k.dtype == "int64" else Cast("int64", k)
        k = select(k < 0, k + n, k)  # negative indices count from the end (ONNX)
        src = (*i[:axis], te.clamp_index(k, n), *i[axis + ind.ndim:])
        return x[src]

    return te.compute(out.shape, element, x.dtype, "gather",
                      checks=[index_check("gather", ind, n)])


def _gather_ref(x: np.ndarray, idx: np.ndarray, axis: int = 0, **attrs: Any) -> np.ndarray:
    check_indices("gather", idx, x.shape[axis])
    return np.take(x, idx, axis=axis)


register_op("gather", pattern="injective", infer=_gather_infer, compute=_gather_compute,
            reference=_gather_ref)


# ------------------------------------------------------------ gather_elements

def check_element_indices(op: str, data: Sequence[Dim], ind: Sequence[Dim], axis: int) -> None:
    """Off `axis`, an indices dimension must be no longer than data's: the kernels
    address data at the indices' own positions there (gather_elements read past data,
    scatter_elements dropped the extra updates; onnxruntime refuses both)."""
    for d, (n, k) in enumerate(zip(data, ind, strict=True)):
        if d != axis and not dim_at_least(n, k):
            raise IRError(f"{op}: indices {shape_text(ind)} are longer than data "
                          f"{shape_text(data)} on axis {d}; only axis {axis} may be longer")


def _gather_elements_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    if idx.ndim != x.ndim or not dt.is_int(idx.dtype):
        raise IRError(f"gather_elements: indices {idx} must be integers of the rank of {x}")
    check_element_indices("gather_elements", x.shape, idx.shape, axis)
    return TensorType(idx.shape, x.dtype)


def _gather_elements_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        k = ind[i]
        k = k if k.dtype == "int64" else Cast("int64", k)
        k = select(k < 0, k + n, k)
        return x[tuple(te.clamp_index(k, n) if d == axis else i[d] for d in range(x.ndim))]

    return te.compute(ind.shape, element, x.dtype, "gather_elements",
                      checks=[index_check("gather_elements", ind, n)])


def _gather_elements_ref(x: np.ndarray, idx: np.ndarray, **attrs: Any) -> np.ndarray:
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    check_indices("gather_elements", idx, x.shape[axis])
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take_along_axis(x, idx.astype(np.int64), axis=axis)


register_op("gather_elements", pattern="injective", infer=_gather_elements_infer,
            compute=_gather_elements_compute, reference=_gather_elements_ref)


# ------------------------------------------------------------------ gather_nd

def _index(ind: te.Tensor, idx: Sequence[PrimExpr], extent: Dim) -> PrimExpr:
    """An index value read from `ind`, negative values counted from the end, clamped."""
    k = ind[tuple(idx)]
    k = k if k.dtype == "int64" else Cast("int64", k)
    return te.clamp_index(select(k < 0, k + extent, k), extent)


def _index_depth(op: str, ind: Sequence[Dim]) -> int:
    """The last dimension of an indices shape: how many data axes one index addresses.
    It fixes the result's rank, so it must be a number even when other dims are symbolic."""
    if not ind:
        return 0
    r = ind[-1]
    if not isinstance(r, int):
        raise IRError(f"{op}: the last dimension of indices {shape_text(ind)} must be "
                      f"static (it fixes the result's rank), got {dim_text(r)}")
    return r


def _gather_nd_shape(data: Sequence[Dim], ind: Sequence[Dim], batch: int) -> tuple[Dim, ...]:
    # Batch dims may be symbolic: they must be provably equal (dims_equal), since the
    # kernel indexes data and indices with the same loop variable.
    r = _index_depth("gather_nd", ind)
    if not ind or batch >= len(ind) or batch + r > len(data) or \
            not all(dims_equal(a, b) for a, b in zip(ind[:batch], data[:batch], strict=True)):
        raise IRError(f"gather_nd: indices {shape_text(ind)} with batch_dims {batch} do not "
                      f"fit data {shape_text(data)}")
    return (*ind[:-1], *data[batch + r:])


def _gather_nd_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    if not dt.is_int(idx.dtype):
        raise IRError(f"gather_nd: indices must be integers, got {idx.dtype}")
    shape = _gather_nd_shape(x.shape, idx.shape, int(attrs.get("batch_dims", 0)))
    return TensorType(shape, x.dtype)


def _gather_nd_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    batch = int(attrs.get("batch_dims", 0))
    shape = _gather_nd_shape(x.shape, ind.shape, batch)
    r = _index_depth("gather_nd", ind.shape)
    lead = ind.ndim - 1

    def element(*i: PrimExpr) -> PrimExpr:
        picked = [_index(ind, (*i[:lead], as_expr(t)), x.shape[batch + t]) for t in range(r)]
        return x[(*i[:batch], *picked, *i[lead:])]

    checks = [index_check("gather_nd", ind, x.shape[batch + t], t) for t in range(r)]
    return te.compute(shape, element, x.dtype, "gather_nd", checks=checks)


def _gather_nd_ref(x: np.ndarray, idx: np.ndarray, **attrs: Any) -> np.ndarray:
    batch = int(attrs.get("batch_dims", 0))
    shape = _gather_nd_shape(x.shape, idx.shape, batch)
    r = idx.shape[-1]
    for t in range(r):
        check_indices("gather_nd", idx[..., t], x.shape[batch + t])
    out = np.empty(cast(tuple[int, ...], shape), dtype=x.dtype)  # numpy shapes are static
    for pos in np.ndindex(*idx.shape[:-1]):
        key = tuple(int(v) for v in idx[pos])
        src = (*pos[:batch], *(k + x.shape[batch + t] if k < 0 else k
                               for t, k in enumerate(key)))
        out[pos] = x[src]
    del r
    return out


register_op("gather_nd", pattern="injective", infer=_gather_nd_infer,
            compute=_gather_nd_compute, reference=_gather_nd_ref)


# -------------------------------------------------------------------- scatter

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_check(attrs: Attrs) -> str:
    red = str(attrs.get("reduction", "none"))
    if red not in SCATTER_REDUCTIONS:
        raise IRError(f"scatter: unknown reduction {red!r}; known: "
                      f"{', '.join(SCATTER_REDUCTIONS)}")
    return red


def _neutral(kind: str, dtype: str) -> PrimExpr:
    """The value that leaves a `kind` reduction unchanged."""
    if kind == "max":
        return te.lowest_value(dtype)
    if kind == "min":
        return te.highest_value(dtype)
    return as_expr(0 if kind == "sum" else 1, dtype)


#: `over(kind, dtype, term)`: the `kind` reduction of `term(hit, update, position)` over
#: the updates (`hit`: it goes to this element; `position`: its flat index, their order).
Over = Callable[[str, str, Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]], PrimExpr]


def _scatter_combine(red: str, base: PrimExpr, over: Over) -> PrimExpr:
    """`base` combined with the matching updates, in the updates' order."""
    if red in ("max", "min") and dt.is_float(base.dtype):
        return _scatter_extreme(red, base, over)
    kind = {"add": "sum", "mul": "prod"}.get(red, red)
    fill = _neutral(kind, base.dtype)
    total = over(kind, base.dtype, lambda hit, v, p: select(hit, v, fill))
    if red == "add":
        return base + total
    if red == "mul":
        return base * total
    return max_(base, total) if red == "max" else min_(base, total)


def _scatter_extreme(red: str, base: PrimExpr, over: Over) -> PrimExpr:
    """onnxruntime's float `max` (`min`) scatter, `cur = max_keep_second(cur, update)` in
    the updates' order (kiln.ops.nan_order): a NaN update replaces, a NaN `cur` gives way
    to the next update. So the result is the extreme of `base` and the updates after the
    last NaN update, NaN if nothing follows it."""
    last_nan = over("max", "int64", lambda hit, v, p: select(hit & nan_order.is_nan(v), p,
                                                             as_expr(-1)))

    def later(hit: PrimExpr, p: PrimExpr) -> PrimExpr:
        return hit & (p > last_nan)

    best = over(red, base.dtype, lambda hit, v, p: select(later(hit, p), v,
                                                          _neutral(red, base.dtype)))
    some = over("max", "int64", lambda hit, v, p: select(later(hit, p), as_expr(1),
                                                         as_expr(0)))
    start = select(last_nan >= 0, as_expr(float("nan"), base.dtype), base)
    keep = nan_order.max_keep_second if red == "max" else nan_order.min_keep_second
    return select(some > 0, keep(start, best), start)


def _scatter_elements_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx, upd = types
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    _scatter_check(attrs)
    if idx.ndim != x.ndim or idx.shape != upd.shape or upd.dtype != x.dtype or \
            not dt.is_int(idx.dtype):
        raise IRError(f"scatter_elements: indices {idx} and updates {upd} must have one shape "
                      f"and the rank of data {x}")
    check_element_indices("scatter_elements", x.shape, idx.shape, axis)
    return x


def _scatter_elements_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind, upd = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    red = _scatter_check(attrs)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        def src(k: PrimExpr) -> tuple[PrimExpr, ...]:
            return tuple(k if d == axis else te.clamp_index(i[d], ind.shape[d])
                         for d in range(x.ndim))

        inside: PrimExpr = as_expr(True)
        for d in range(x.ndim):
            if d != axis and ind.shape[d] < x.shape[d]:
                inside = inside & (i[d] < ind.shape[d])

        def match(k: PrimExpr) -> PrimExpr:
            return inside & _index(ind, src(k), n).eq(i[axis])

        m = ind.shape[axis]
        if red == "none":
            last = te.reduce("max", lambda k: select(match(k), k, as_expr(-1)), (m,), "int64")
            hit = upd[src(te.clamp_index(last, m))]
            return select(last >= 0, hit, x[i])

        def over(kind: str, dtype: str,
                 term: Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]) -> PrimExpr:
            return te.reduce(kind, lambda k: term(match(k), upd[src(k)], k), (m,), dtype)

        return _scatter_combine(red, x[i], over)

    return te.compute(x.shape, element, x.dtype, "scatter_elements",
                      checks=[index_check("scatter_elements", ind, n)])


# max/min: onnxruntime's std::max(update, cur): a NaN update replaces, a NaN cur gives way
_NP_REDUCE: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "mul": np.multiply,
    "max": lambda cur, v: cur if cur > v else v, "min": lambda cur, v: cur if cur < v else v}


def _scatter_elements_ref(x: np.ndarray, idx: np.ndarray, upd: np.ndarray,
                          **attrs: Any) -> np.ndarray:
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    red = _scatter_check(attrs)
    check_indices("scatter_elements", idx, x.shape[axis])
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        dst = list(pos)
        dst[axis] = k + x.shape[axis] if k < 0 else k
        t = tuple(dst)
        out[t] = upd[pos] if red == "none" else _NP_REDUCE[red](out[t], upd[pos])
    return out


register_op("scatter_elements", pattern="opaque", infer=_scatter_elements_infer,
            compute=_scatter_elements_compute, reference=_scatter_elements_ref)


def _scatter_nd_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx, upd = types
    _scatter_check(attrs)
    r = _index_depth("scatter_nd", idx.shape)
    want = (*idx.shape[:-1], *x.shape[r:])
    # Symbolic dims must be provably equal: the kernel reads updates at the indices'
    # and data's positions.
    fits = len(upd.shape) == len(want) and all(
        dims_equal(a, b) for a, b in zip(upd.shape, want, strict=True))
    if not dt.is_int(idx.dtype) or r > x.ndim or not fits or upd.dtype != x.dtype:
        raise IRError(f"scatter_nd: updates {upd} must have shape {shape_text(want)} for "
                      f"indices {idx} into data {x}")
    return x


def _scatter_nd_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind, upd = inputs
    red = _scatter_check(attrs)
    r = _index_depth("scatter_nd", ind.shape)
    lead = ind.shape[:-1]

    def element(*i: PrimExpr) -> PrimExpr:
        def match(*q: PrimExpr) -> PrimExpr:
            ok: PrimExpr = as_expr(True)
            for t in range(r):
                ok = ok & _index(ind, (*q, as_expr(t)), x.shape[t]).eq(i[t])
            return ok

        if red == "none":
            count = dim_product(lead)  # an expression when the indices are symbolic

            def flat_match(f: PrimExpr) -> PrimExpr:
                q = te.unflatten_index(f, lead)
                return select(match(*q), f, as_expr(-1))

            last = te.reduce("max", flat_match, (count,), "int64")
            q = te.unflatten_index(te.clamp_index(last, count), lead)
            return select(last >= 0, upd[(*q, *i[r:])], x[i])

        def over(kind: str, dtype: str,
                 term: Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]) -> PrimExpr:
            return te.reduce(kind, lambda *q: term(match(*q), upd[(*q, *i[r:])],
                                                   te.flat_index(q, lead)), lead, dtype)

        return _scatter_combine(red, x[i], over)

    checks = [index_check("scatter_nd", ind, x.shape[t], t) for t in range(r)]
    return te.compute(x.shape, element, x.dtype, "scatter_nd", checks=checks)


def _scatter_nd_ref(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, **attrs: Any) -> np.ndarray:
    red = _scatter_check(attrs)
    for t in range(idx.shape[-1] if idx.ndim else 0):
        check_indices("scatter_nd", idx[..., t], x.shape[t])
    out = x.copy()
    for pos in np.ndindex(*idx.shape[:-1]):
        key = tuple(int(k) + x.shape[t] if int(k) < 0 else int(k) for t, k in enumerate(idx[pos]))
        out[key] = upd[pos] if red == "none" else _NP_REDUCE[red](out[key], upd[pos])
    return out


register_op("scatter_nd", pattern="opaque", infer=_scatter_nd_infer, compute=_scatter_nd_compute,
            reference=_scatter_nd_ref)
