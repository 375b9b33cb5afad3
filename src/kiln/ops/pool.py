"""Pooling over 1-3 spatial dims: max_pool{1,2,3}d, avg_pool{1,2,3}d, lp_pool{1,2,3}d,
and global_{avg,max}_pool.

Attributes: kernel_shape, strides, pads (begins..., ends...), dilations,
ceil_mode, count_include_pad (avg), p (lp) — ONNX's meanings (kiln.ops.spatial).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import is_static, shape_text, simplify_dim
from kiln.ir.tensor import (
    Cast,
    Const,
    PrimExpr,
    as_expr,
    intrin,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import nan_order, spatial, te
from kiln.ops.reduce import REDUCTIONS, Reduction, mean_of
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


def max_floor(dtype: str) -> PrimExpr:
    """Where a max pool's window starts and what its padding holds: the most negative
    finite value of a float `dtype` (onnxruntime's initial value, -3.4028235e38 for
    float32: a window of -inf, NaN and padding alone gives it), the smallest value of an
    integer one."""
    if not dt.is_float(dtype):
        return te.lowest_value(dtype)
    top = (2 - 2 ** -7) * 2.0 ** 127 if dtype == "bfloat16" else \
        float(np.finfo(dt.to_numpy(dtype)).max)
    return Const(-top, dtype)


def window_max(acc: PrimExpr, v: PrimExpr) -> PrimExpr:
    """A max pool's step: `v` where strictly greater than `acc` (a NaN `v` is skipped;
    from `max_floor`, `acc` is never NaN), onnxruntime's MaxPool rule
    (kiln.ops.nan_order.max_keep_first: one `maxps` on x86)."""
    return nan_order.max_keep_first(acc, v)


def first_tap(o: PrimExpr, stride: int, pad: int, dilation: int) -> PrimExpr:
    """The input index of output `o`'s first window tap inside the input along one axis
    (every window has one: its pads are smaller than it)."""
    skipped = max_(as_expr(0, o.dtype), (pad - o * stride + (dilation - 1)) // dilation)
    return o * stride - pad + skipped * dilation


class Window:
    """The checked geometry of a pooling op on an input of `shape` (its attributes
    `attrs`): kernel, strides, dilations, pads, and the output size."""

    def __init__(self, shape: Sequence[Any], attrs: Attrs) -> None:
        self.rank = spatial.spatial_rank(shape, "pooling")
        if "kernel_shape" not in attrs:
            raise IRError("pooling needs a kernel_shape attribute")
        r = self.rank
        self.kernel = spatial.ints(attrs, "kernel_shape", r, 1)
        self.strides = spatial.ints(attrs, "strides", r, 1)
        self.dilations = spatial.ints(attrs, "dilations", r, 1)
        self.begins, self.ends = spatial.pads(attrs, r)
        for j, (k, d) in enumerate(zip(self.kernel, self.dilations)):
            extent = d * (k - 1) + 1
            if max(self.begins[j], self.ends[j]) >= extent:  # onnxruntime's rule too
                raise IRError(f"pooling: pads ({self.begins[j]}, {self.ends[j]}) of spatial "
                              f"axis {j} must be smaller than the window ({extent})")
        ceil = bool(attrs.get("ceil_mode", False))
        # Any: ints for kernels; a symbolic dimension only reaches the type (infer).
        self.size: tuple[Any, ...] = tuple(simplify_dim(d) for d in shape[2:])
        if 0 in self.size:  # pads would make windows of padding alone (onnxruntime refuses)
            raise IRError(f"pooling over an empty spatial axis of {shape_text(shape)}")
        if ceil and not is_static(self.size):
            raise IRError(f"pooling with ceil_mode over symbolic dimensions {shape_text(shape)} "
                          "is not supported")
        self.out: tuple[Any, ...] = tuple(simplify_dim(spatial.pool_out(
            self.size[j], self.kernel[j], self.strides[j], self.dilations[j], self.begins[j],
            self.ends[j], ceil)) for j in range(r))
        if min((d for d in self.out if isinstance(d, int)), default=1) <= 0:
            raise IRError(f"pooling output would be empty ({self.out})")
        self.out_shape: tuple[Any, ...] = (shape[0], shape[1], *self.out)

    def positions(self, o: Sequence[PrimExpr], k: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
        return tuple(o[j] * self.strides[j] + k[j] * self.dilations[j] - self.begins[j]
                     for j in range(self.rank))

    def first_inside(self, o: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
        """The position of output `o`'s first window element inside the input (row-major;
        every window has one: its pads are smaller than it)."""
        return tuple(first_tap(o[j], self.strides[j], self.begins[j], self.dilations[j])
                     for j in range(self.rank))


def scans_from_first(attrs: Attrs, dtype: str) -> bool:
    """Whether a max pool of a `dtype` input with `attrs` takes onnxruntime's scan from
    each window's first element inside the input (a leading NaN stays, a later one is
    skipped, a window of -inf gives -inf): its kernel for dilated float windows. Other
    max pools are its MLAS kernels' (`max_floor`, `window_max`); integers give the same
    values either way."""
    return dt.is_float(dtype) and any(int(d) > 1 for d in attrs.get("dilations", ()) or ())


def _pool_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(Window(x.shape, attrs).out_shape, x.dtype)


def _acc(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _max_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    win = Window(x.shape, attrs)
    # onnxruntime's MaxPool: NaN skipped, from the most negative finite value (max_floor,
    # window_max), or each window scanned from its first element (scans_from_first)
    scan = scans_from_first(attrs, x.dtype)
    floor = te.lowest_value(x.dtype) if scan else max_floor(x.dtype)

    def element(n: PrimExpr, c: PrimExpr, *o: PrimExpr) -> PrimExpr:
        total = te.reduce("scan_max", lambda *k: te.padded(x, (n, c, *win.positions(o, k)),
                                                           floor), win.kernel, x.dtype, floor)
        if not scan:
            return total
        return nan_order.with_leading_nan(x[(n, c, *win.first_inside(o))], total)

    return te.compute(win.out_shape, element, x.dtype, "max_pool")


def _count_inside(start: PrimExpr, k: int, d: int, lo: int, hi: int) -> PrimExpr:
    """How many of start, start+d, ..., start+(k-1)d lie in [lo, hi)."""
    total: PrimExpr = as_expr(0)
    for j in range(k):
        pos = start + j * d
        total = total + select((pos >= lo) & (pos < hi), as_expr(1), as_expr(0))
    return total


def _avg_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    win = Window(x.shape, attrs)
    include_pad = bool(attrs.get("count_include_pad", False))
    acc = _acc(x.dtype)

    def element(n: PrimExpr, c: PrimExpr, *o: PrimExpr) -> PrimExpr:
        def term(*k: PrimExpr) -> PrimExpr:
            v = te.padded(x, (n, c, *win.positions(o, k)), 0)
            return v if v.dtype == acc else Cast(acc, v)

        total = te.reduce("sum", term, win.kernel, acc)
        count: PrimExpr = as_expr(1)
        for j in range(win.rank):
            start = o[j] * win.strides[j] - win.begins[j]
            if include_pad and win.dilations[j] == 1:
                # windows are clipped to the padded extent (ONNX semantics)
                end = min_(start + win.kernel[j], win.size[j] + win.ends[j])
                count = count * (end - start)
            elif include_pad:
                count = count * _count_inside(start, win.kernel[j], win.dilations[j],
                                              -win.begins[j], win.size[j] + win.ends[j])
            else:
                count = count * _count_inside(start, win.kernel[j], win.dilations[j], 0,
                                              win.size[j])
        v = total / Cast(acc, count)
        return v if acc == x.dtype else Cast(x.dtype, v)

    return te.compute(win.out_shape, element, x.dtype, "avg_pool")


def _lp_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    win = Window(x.shape, attrs)
    p = float(attrs.get("p", 2))
    acc = _acc(x.dtype)

    def element(n: PrimExpr, c: PrimExpr, *o: PrimExpr) -> PrimExpr:
        def term(*k: PrimExpr) -> PrimExpr:
            v = te.padded(x, (n, c, *win.positions(o, k)), 0)
            v = intrin("abs", v if v.dtype == acc else Cast(acc, v))
            return v * v if p == 2 else intrin("pow", v, as_expr(p, acc))

        total = te.reduce("sum", term, win.kernel, acc)
        v = intrin("sqrt", total) if p == 2 else intrin("pow", total, as_expr(1.0 / p, acc))
        return v if acc == x.dtype else Cast(x.dtype, v)

    return te.compute(win.out_shape, element, x.dtype, "lp_pool")


def _pool_ref(x: np.ndarray, attrs: Attrs, kind: str) -> np.ndarray:
    """Window by window over an explicitly padded copy (independent of the lowering)."""
    win = Window(x.shape, attrs)
    r = win.rank
    # pad enough on the high side for ceil-mode windows that run past the padding
    hi = [max(win.ends[j], (win.out[j] - 1) * win.strides[j]
              + (win.kernel[j] - 1) * win.dilations[j] + 1 - win.size[j] - win.begins[j])
          for j in range(r)]
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *zip(win.begins, hi)),
                constant_values=fill)
    scan = kind == "max" and scans_from_first(attrs, dt.from_numpy(x.dtype))
    if kind == "max":
        firsts = np.isnan(xp)
        xp = np.where(firsts, -np.inf, xp)  # skipped (max_floor bounds the result)
    inside = np.pad(np.ones(win.size), tuple(zip(win.begins, hi)))
    in_pad = np.pad(np.ones(tuple(win.size[j] + win.begins[j] + win.ends[j] for j in range(r))),
                    tuple((0, hi[j] - win.ends[j]) for j in range(r)))
    out: Any = np.zeros(win.out_shape)
    p = float(attrs.get("p", 2))
    for o in itertools.product(*(range(d) for d in win.out)):
        sl = tuple(slice(o[j] * win.strides[j], o[j] * win.strides[j]
                         + (win.kernel[j] - 1) * win.dilations[j] + 1, win.dilations[j])
                   for j in range(r))
        block = xp[(slice(None), slice(None), *sl)]
        axes = tuple(range(2, 2 + r))
        if scan:  # NaN where the window's first element inside the input is NaN
            lead = np.argmax(inside[sl].reshape(-1))
            first_nan = firsts[(slice(None), slice(None), *sl)].reshape(*x.shape[:2], -1)
            value = np.where(first_nan[..., lead], np.nan, block.max(axis=axes))
        elif kind == "max":
            value = np.maximum(block.max(axis=axes), _floor_ref(x.dtype))
        elif kind == "lp":
            value = (np.abs(block) ** p).sum(axis=axes) ** (1.0 / p)
        else:
            mask = in_pad if attrs.get("count_include_pad", False) else inside
            value = block.sum(axis=axes) / mask[sl].sum()
        out[(slice(None), slice(None), *o)] = value
    return out.astype(x.dtype)


def _floor_ref(dtype: np.dtype) -> float:
    """`max_floor` of `dtype` as a number."""
    floor = max_floor(dt.from_numpy(dtype))
    assert isinstance(floor, Const)
    return float(floor.value)


for _rank in spatial.SPATIAL_RANKS:
    _sfx = spatial.SUFFIX[_rank]
    # max_pool2d and avg_pool2d: their hand-built kernels are kiln.kernels.pool's
    register_op(f"max_pool{_sfx}", pattern="opaque", infer=_pool_infer,
                compute=_max_pool_compute, reference=lambda x, **a: _pool_ref(x, a, "max"))
    register_op(f"avg_pool{_sfx}", pattern="opaque", infer=_pool_infer,
                compute=_avg_pool_compute, reference=lambda x, **a: _pool_ref(x, a, "avg"))
    register_op(f"lp_pool{_sfx}", pattern="opaque", infer=_pool_infer,
                compute=_lp_pool_compute, reference=lambda x, **a: _pool_ref(x, a, "lp"))


def _global_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if x.ndim < 3:
        raise IRError(f"global pooling expects N, C and spatial dims, got {x}")
    return TensorType((*x.shape[:2], *([1] * (x.ndim - 2))), x.dtype)


def _global_compute(kind: str) -> Any:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        spatial_shape = x.shape[2:]
        count = int(np.prod(spatial_shape))
        acc = _acc(x.dtype)

        def element(n: PrimExpr, c: PrimExpr, *_: PrimExpr) -> PrimExpr:
            def body(*r: PrimExpr) -> PrimExpr:
                v = x[(n, c, *r)]
                return v if v.dtype == acc else Cast(acc, v)
            if kind == "avg":
                total = te.reduce("sum", body, spatial_shape, acc)
            else:  # MaxPool's rule (max_floor): NaN skipped
                total = te.reduce("scan_max", body, spatial_shape, acc, max_floor(x.dtype))
            v = total / count if kind == "avg" else total
            return v if acc == x.dtype else Cast(x.dtype, v)

        shape = (*x.shape[:2], *([1] * len(spatial_shape)))
        return te.compute(shape, element, x.dtype, f"global_{kind}_pool")
    return compute


def _global_ref(kind: str) -> Any:
    def ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
        axes = tuple(range(2, x.ndim))
        x64 = x.astype(np.float64)
        if kind == "avg":
            return x64.mean(axis=axes, keepdims=True).astype(x.dtype)
        top = np.where(np.isnan(x64), -np.inf, x64).max(axis=axes, keepdims=True)
        return np.maximum(top, _floor_ref(x.dtype)).astype(x.dtype)
    return ref


def _spatial_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    return tuple(range(2, ndim))


# Built by hand as reductions over the trailing (spatial) axes (kiln.kernels.rows).
register_op("global_avg_pool", pattern="reduce", infer=_global_infer,
            compute=_global_compute("avg"), reference=_global_ref("avg"))
REDUCTIONS["global_avg_pool"] = Reduction("sum", None, mean_of, _spatial_axes)
# A max over the row's values floored at max_floor (a NaN becomes it): MaxPool's rule.
register_op("global_max_pool", pattern="reduce", infer=_global_infer,
            compute=_global_compute("max"), reference=_global_ref("max"))
REDUCTIONS["global_max_pool"] = Reduction(
    "max", lambda v: window_max(max_floor(v.dtype), v), None, _spatial_axes)
