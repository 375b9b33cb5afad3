"""Image operators: resize (nearest, linear, cubic; every ONNX coordinate mode).

Resizing is separable: along each resized axis, output position `o` reads a
few input positions `idx[o, t]` with weights `coef[o, t]`. `axis_tables`
computes those tables once in numpy (coordinate transformation, nearest rounding,
cubic and antialias kernels, exclude_outside, tf_crop_and_resize extrapolation).
The taps are onnxruntime's, so a NaN or an infinity reaches the same outputs
(docs/onnx.md, *Non-finite values*): its bilinear kernel reads a pixel and the next
one even where the next weighs 0 (0 x inf is NaN), its cubic one the four around the
point, clamped, and its antialias one a window cut to the image whose outside
weights go to the edge pixel. The lowering bakes the tables into the kernel as
constants (`te.const_tensor`) and sums in onnxruntime's order: linear over every
tap at once, cubic and antialias one axis after the other, last axis first. The
numpy reference applies the same tables axis by axis, in float64, or for cubic and
antialias in the kernel's order and accumulator type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.tensor import Cast, PrimExpr, as_expr, intrin, max_, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]

MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# --------------------------------------------------------------------------- tables

F32 = np.float32


def _source_coords(coord_mode: str, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate of every output position (in float32, as onnxruntime computes
    them), and the extrapolated mask."""
    y = np.arange(out_len, dtype=F32)
    s, n = F32(scale), F32(in_len)
    out_width = s * n       # the "ideal" output length
    outside = None
    if coord_mode == "align_corners":
        x = np.zeros(out_len, F32) if out_width == 1 else y * (n - 1) / (out_width - 1)
    elif coord_mode == "asymmetric":
        x = y / s
    elif coord_mode == "tf_crop_and_resize":
        lo, hi = (F32(v) for v in roi) if roi is not None else (F32(0.0), F32(1.0))
        if out_width == 1:
            x = np.full(out_len, 0.5 * float(lo + hi) * float(n - 1), F32)
        else:
            x = y * (hi - lo) * (n - 1) / (out_width - 1)
            x = x + lo * (n - 1)
        outside = (x < 0) | (x > n - 1)
    elif coord_mode == "pytorch_half_pixel":
        x = np.full(out_len, -0.5, F32) if out_width == 1 else (y + F32(0.5)) / s - F32(0.5)
    elif coord_mode == "half_pixel":
        x = (y + F32(0.5)) / s - F32(0.5)
    elif coord_mode == "tf_half_pixel_for_nn":      # Resize-11 only
        x = (y + F32(0.5)) / s
    elif coord_mode == "half_pixel_symmetric":  # onnxruntime's float and double steps
        offset = n / 2 * (1 - F32(out_len) / out_width)
        x = float(offset) + (y.astype(np.float64) + 0.5) / float(s) - 0.5
    else:
        raise IRError(f"resize: unknown coordinate_transformation_mode {coord_mode!r}; "
                      f"known: {', '.join(COORD_MODES)}")
    return np.asarray(x, F32), outside


def _check_modes(attrs: Attrs) -> None:
    mode = str(attrs.get("mode", "nearest"))
    if mode not in MODES:
        raise IRError(f"resize: unknown mode {mode!r}; known: {', '.join(MODES)}")
    nearest = str(attrs.get("nearest_mode", "round_prefer_floor"))
    if mode == "nearest" and nearest not in NEAREST_MODES:
        raise IRError(f"resize: unknown nearest_mode {nearest!r}; known: "
                      f"{', '.join(NEAREST_MODES)}")


@dataclass(frozen=True)
class AxisTaps:
    """The taps of one resized axis: output position `o` reads input positions
    `idx[o, t]` (in [0, in_len)) times `coef[o, t]` where `valid[o, t]` (None: every
    tap is read); `outside[o]` marks the extrapolated outputs (None: none)."""

    idx: np.ndarray
    coef: np.ndarray
    outside: np.ndarray | None = None
    valid: np.ndarray | None = None


def _nearest_taps(x: np.ndarray, in_len: int, attrs: Attrs) -> AxisTaps:
    """One tap: the pixel `nearest_mode` rounds x to (x itself when integral)."""
    base = np.floor(x)
    frac = x - base
    take_right = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
                  "floor": np.zeros_like(frac, bool), "ceil": np.ones_like(frac, bool)}[
        str(attrs.get("nearest_mode", "round_prefer_floor"))]
    idx = np.where((frac != 0) & take_right, base + 1, base).astype(np.int64)
    idx = np.clip(idx, 0, in_len - 1)[:, None]
    return AxisTaps(idx, np.ones(idx.shape, np.float64))


def _linear_taps(x: np.ndarray, in_len: int) -> AxisTaps:
    """onnxruntime's bilinear taps: x clamped into the image, its pixel and the next
    one (the same pixel twice, each weighing 0.5, at the last one). Both are read,
    a weight of 0 included."""
    c = np.clip(x, F32(0), F32(in_len - 1))
    lo = np.minimum(c.astype(np.int64), in_len - 1)
    hi = np.minimum(lo + 1, in_len - 1)
    w_lo, w_hi = np.abs(c - hi.astype(F32)), np.abs(c - lo.astype(F32))
    same = lo == hi
    w_lo, w_hi = np.where(same, F32(0.5), w_lo), np.where(same, F32(0.5), w_hi)
    return AxisTaps(np.stack([lo, hi], 1), np.stack([w_lo, w_hi], 1).astype(np.float64))


def _cubic_coeffs(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' weights of the taps floor(x) - 1 .. floor(x) + 2 at s = x - floor(x), in
    onnxruntime's float32 formulas."""
    a32, s = F32(a), np.abs(s).astype(F32)
    near = lambda d: ((a32 + 2) * d - (a32 + 3)) * d * d + 1  # noqa: E731
    far = lambda d: ((a32 * d - 5 * a32) * d + 8 * a32) * d - 4 * a32  # noqa: E731
    return np.stack([far(s + 1), near(s), near(1 - s), far(2 - s)], 1).astype(F32)


def _cubic_taps(x: np.ndarray, in_len: int, attrs: Attrs) -> AxisTaps:
    """onnxruntime's bicubic taps: floor(x) - 1 .. floor(x) + 2, clamped into the image
    (an edge pixel read once per tap); with exclude_outside those outside weigh 0 (and
    are still read) and the rest are renormalized."""
    base = np.floor(x)
    coef = _cubic_coeffs(x - base, float(attrs.get("cubic_coeff_a", -0.75)))
    idx = base.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    if bool(attrs.get("exclude_outside", 0)):
        coef = np.where((idx < 0) | (idx >= in_len), F32(0), coef)
        total = coef[:, 0] + coef[:, 1] + coef[:, 2] + coef[:, 3]
        coef = coef / np.where(total == 0, F32(1), total)[:, None]
    return AxisTaps(np.clip(idx, 0, in_len - 1), coef.astype(np.float64))


def _aa_filter(mode: str, a: float) -> Callable[[np.ndarray], np.ndarray]:
    """The antialias kernel: the triangle (linear) or Keys' cubic."""
    if mode == "linear":
        return lambda d: np.maximum(F32(1) - np.abs(d), F32(0))
    a32 = F32(a)

    def cubic(d: np.ndarray) -> np.ndarray:
        d = np.abs(d)
        near = ((a32 + 2) * d - (a32 + 3)) * d * d + 1
        far = (((d - 5) * d + 8) * d - 4) * a32
        return np.where(d < 1, near, np.where(d < 2, far, F32(0))).astype(F32)
    return cubic


def _aa_row(center: F32, support: F32, inv_scale: F32, in_len: int, exclude: bool,
            kernel: Callable[[np.ndarray], np.ndarray]) -> tuple[int, np.ndarray]:
    """onnxruntime's antialias window of one output: its first pixel and weights. The
    window is cut to the image; without exclude_outside, the weights of the pixels
    outside are added to the edge pixel's."""
    lo_real = int(np.floor(center - support + F32(0.5)))
    hi_real = int(np.floor(center + support + F32(0.5)))
    lo_cut, hi_cut = max(lo_real, 0), min(hi_real, in_len)
    lo, hi = (lo_cut, hi_cut) if exclude else (lo_real, hi_real)
    w = kernel((np.arange(lo, hi).astype(F32) - center + F32(0.5)) * inv_scale).astype(F32)
    total = F32(0)
    for v in w:
        total = F32(total + v)
    if not exclude and w.size:
        below = max(-lo, 0)
        above = max(hi - in_len, 0)
        w[below] += w[:below].sum(dtype=F32)
        w[w.size - above - 1] += w[w.size - above:].sum(dtype=F32)
        w = w[below:w.size - above]
    w = w * (F32(1) / total if total != 0 else F32(1))
    return lo_cut, w[:max(hi_cut - lo_cut, 0)]


def _aa_taps(x: np.ndarray, in_len: int, scale: float, attrs: Attrs) -> AxisTaps:
    """onnxruntime's antialias taps (its filter windows): a variable number of pixels
    per output, each read once; `valid` marks the padding of the shorter windows."""
    mode = str(attrs.get("mode", "linear"))
    support_size = F32(2.0 if mode == "linear" else 4.0)
    widen = F32(1) / F32(scale)
    support = support_size * F32(0.5) * (widen if widen >= 1 else F32(1))
    inv_scale = F32(1) / widen if widen >= 1 else F32(1)
    kernel = _aa_filter(mode, float(attrs.get("cubic_coeff_a", -0.75)))
    exclude = bool(attrs.get("exclude_outside", 0))
    rows = [_aa_row(F32(0.5) + c, support, inv_scale, in_len, exclude, kernel) for c in x]
    taps = max([w.size for _, w in rows] + [1])
    idx = np.zeros((len(rows), taps), np.int64)
    coef = np.zeros((len(rows), taps), np.float64)
    valid = np.zeros((len(rows), taps), bool)
    for o, (lo, w) in enumerate(rows):
        idx[o, :w.size], coef[o, :w.size], valid[o, :w.size] = lo + np.arange(w.size), w, True
    return AxisTaps(idx, coef, valid=None if valid.all() else valid)


def axis_tables(in_len: int, out_len: int, scale: float, attrs: Attrs,
                roi: tuple[float, float] | None = None, identity: bool = False) -> AxisTaps:
    """The taps of one resized axis, onnxruntime's: which input positions each output
    reads and their weights. `identity`: an axis of scale 1 that onnxruntime still
    interpolates (the other axis of a bilinear resize): its coordinates are the output
    positions."""
    if identity:
        x, outside = np.arange(out_len, dtype=F32), None
    else:
        x, outside = _source_coords(
            str(attrs.get("coordinate_transformation_mode", "half_pixel")), out_len, in_len,
            scale, roi)
    mode = str(attrs.get("mode", "nearest"))
    if mode == "nearest":
        taps = _nearest_taps(x, in_len, attrs)
    elif attrs.get("antialias", 0):
        taps = _aa_taps(x, in_len, scale, attrs)
    elif mode == "linear":
        taps = _linear_taps(x, in_len)
    else:
        taps = _cubic_taps(x, in_len, attrs)
    return AxisTaps(taps.idx, taps.coef, outside, taps.valid)


def _resized(in_shape: Sequence[int], attrs: Attrs) -> list[int]:
    """The axes whose size, scale or region changes."""
    sizes = tuple(int(d) for d in attrs["sizes"])
    scales = tuple(float(s) for s in attrs["scales"])
    if len(sizes) != len(in_shape) or len(scales) != len(in_shape):
        raise IRError(f"resize: sizes {sizes} and scales {scales} need one entry per dim of "
                      f"{tuple(in_shape)}")
    roi = attrs.get("roi")
    axes = []
    for k, (i, o, s) in enumerate(zip(in_shape, sizes, scales)):
        identity_roi = roi is None or (float(roi[k]) == 0.0 and float(roi[k + len(sizes)]) == 1.0)
        if not (i == o and math.isclose(s, 1.0) and identity_roi):
            axes.append(k)
    return axes


def _image_axes(rank: int, scales: Sequence[float], mode: str) -> tuple[int, ...]:
    """The axes onnxruntime's linear and cubic kernels interpolate, resized or not: both
    of a 2-D tensor, H and W of NCHW (axes 1 and 2, NHWC's H and W, when the second
    axis's scale is not 1 and the last one's is), D, H and W of a 3-D or 5-D tensor
    (linear only)."""
    if rank == 2:
        return (0, 1)
    if rank == 4:
        return (2, 3) if scales[1] == 1 or scales[3] != 1 else (1, 2)
    if mode == "linear" and rank in (3, 5):
        return tuple(range(rank - 3, rank))
    return ()


def _resize_axes(in_shape: Sequence[int], attrs: Attrs) -> list[int]:
    """The axes the kernel interpolates: the resized ones, and with them the others
    onnxruntime's image kernels interpolate too (at their own positions, where a tap of
    weight 0 still reads the next pixel)."""
    axes = _resized(in_shape, attrs)
    mode = str(attrs.get("mode", "nearest"))
    image = _image_axes(len(in_shape), [float(s) for s in attrs["scales"]], mode)
    if mode == "nearest" or not axes or not set(axes) <= set(image):
        return axes
    if attrs.get("antialias", 0):  # its antialias passes copy an axis of the same length
        sizes = [int(d) for d in attrs["sizes"]]
        return [k for k in image if sizes[k] != in_shape[k]]
    return list(image)


def _roi(attrs: Attrs, k: int, rank: int) -> tuple[float, float] | None:
    roi = attrs.get("roi")
    return None if roi is None else (float(roi[k]), float(roi[k + rank]))


# --------------------------------------------------------------------------- the op

def _resize_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if not (dt.is_float(x.dtype) or dt.is_int(x.dtype)):
        raise IRError(f"resize needs a numeric tensor, got {x}")
    _resize_axes(x.static_shape, attrs)
    _check_modes(attrs)
    return TensorType(tuple(int(d) for d in attrs["sizes"]), x.dtype)


def _axis_taps(shape: Sequence[int], attrs: Attrs) -> dict[int, AxisTaps]:
    """The taps of every interpolated axis (`_resize_axes`)."""
    sizes = tuple(int(d) for d in attrs["sizes"])
    scales = tuple(float(s) for s in attrs["scales"])
    resized = _resized(shape, attrs)
    return {k: axis_tables(shape[k], sizes[k], scales[k], attrs, _roi(attrs, k, len(shape)),
                           identity=k not in resized)
            for k in _resize_axes(shape, attrs)}


def _separable(dtype: str, attrs: Attrs) -> bool:
    """Whether onnxruntime interpolates one axis after the other (last axis first, each
    pass rounded to the type: its cubic and antialias kernels) rather than summing the
    products of every axis's weights at once (its bilinear and trilinear ones)."""
    mode = str(attrs.get("mode", "nearest"))
    return dt.is_float(dtype) and mode != "nearest" and (
        mode == "cubic" or bool(attrs.get("antialias", 0)))


@dataclass(frozen=True)
class _Tables:
    """An axis's taps as constant tensors of the kernel."""

    idx: te.Tensor
    coef: te.Tensor
    valid: te.Tensor | None
    taps: int

    @staticmethod
    def of(k: int, taps: AxisTaps, acc: str) -> _Tables:
        return _Tables(te.const_tensor(taps.idx, f"idx{k}"),
                       te.const_tensor(taps.coef.astype(dt.to_numpy(acc)), f"coef{k}"),
                       None if taps.valid is None else
                       te.const_tensor(taps.valid.astype(np.uint8), f"valid{k}"),
                       taps.idx.shape[1])


def _gather_sum(src: te.Tensor, i: Sequence[PrimExpr], axes: Sequence[int],
                tables: Mapping[int, _Tables], acc: str, weighted: bool) -> PrimExpr:
    """Sum over the taps of `axes` (in index order) of src at the taps times the product
    of their weights (the last axis's first), a padding tap of an antialias window
    adding 0."""
    def term(*t: PrimExpr) -> PrimExpr:
        at = list(i)
        for k, tap in zip(axes, t):
            at[k] = tables[k].idx[i[k], tap]
        v = src[tuple(at)]
        v = v if v.dtype == acc else Cast(acc, v)
        if weighted:
            weight: PrimExpr | None = None
            for k, tap in reversed(list(zip(axes, t))):
                w = tables[k].coef[i[k], tap]
                weight = w if weight is None else weight * w
            v = v if weight is None else v * weight
        for k, tap in zip(axes, t):
            valid = tables[k].valid
            if valid is not None:
                v = select(valid[i[k], tap].ne(0), v, as_expr(0.0, acc))
        return v

    counts = tuple(tables[k].taps for k in axes)
    if all(n == 1 for n in counts):
        return term(*(as_expr(0) for _ in counts))
    return te.reduce("sum", term, counts, acc)


def _resize_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    sizes = tuple(int(d) for d in attrs["sizes"])
    acc = "float64" if x.dtype == "float64" else "float32"
    taps = _axis_taps(x.shape, attrs)
    axes = list(taps)
    tables = {k: _Tables.of(k, t, acc) for k, t in taps.items()}
    masks = [(k, te.const_tensor(t.outside.astype(np.uint8), f"outside{k}"))
             for k, t in taps.items() if t.outside is not None and t.outside.any()]
    weighted = str(attrs.get("mode", "nearest")) != "nearest"
    passes = [[k] for k in reversed(axes)] if _separable(x.dtype, attrs) else [axes]
    src, shape = x, list(x.shape)
    for done in passes[:-1]:  # one axis after the other, each into a temporary
        for k in done:
            shape[k] = sizes[k]
        src = te.compute(tuple(shape), lambda *i, s=src, a=done: _gather_sum(
            s, i, a, tables, acc, weighted), acc, "resize_pass", materialize=True)
    last = passes[-1]
    fill = as_expr(float(attrs.get("extrapolation_value", 0.0)), acc)

    def element(*i: PrimExpr) -> PrimExpr:
        value = _gather_sum(src, i, last, tables, acc, weighted)
        for k, mask in masks:
            value = select(mask[i[k]].ne(0), fill, value)
        return _to_dtype(value, x.dtype)

    return te.compute(sizes, element, x.dtype, "resize")


def _to_dtype(v: PrimExpr, dtype: str) -> PrimExpr:
    if v.dtype == dtype:
        return v
    if dt.is_int(dtype):
        # round half to even and saturate, like ONNX's reference (saturate_cast)
        info = np.iinfo(dt.to_numpy(dtype))
        v = intrin("round", v)
        v = min_(max_(v, as_expr(float(info.min), v.dtype)), as_expr(float(info.max), v.dtype))
    return Cast(dtype, v)


def _resize_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    """Axis by axis in float64; the kernel's separable passes (cubic, antialias) in its
    order and accumulator type, where a pass can overflow as the kernel's does."""
    sizes = tuple(int(d) for d in attrs["sizes"])
    taps_of = _axis_taps(x.shape, attrs)
    order = list(taps_of)
    acc: Any = np.float64
    if _separable(dt.from_numpy(x.dtype), attrs):
        order, acc = order[::-1], np.float64 if x.dtype == np.float64 else np.float32
    out = x.astype(acc)
    for k in order:
        taps = taps_of[k]
        gathered = np.take(out, taps.idx, axis=k)           # (..., out_k, taps, ...)
        shape = [1] * gathered.ndim
        shape[k], shape[k + 1] = taps.coef.shape
        with np.errstate(invalid="ignore", over="ignore"):  # 0 x inf is NaN, as in the kernel
            terms = gathered * taps.coef.astype(acc).reshape(shape)
            if taps.valid is not None:
                terms = np.where(taps.valid.reshape(shape), terms, 0.0)
            out = terms.sum(axis=k + 1)
        if taps.outside is not None:
            mshape = [1] * out.ndim
            mshape[k] = sizes[k]
            out = np.where(taps.outside.reshape(mshape),
                           float(attrs.get("extrapolation_value", 0.0)), out)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    with np.errstate(over="ignore"):  # beyond the type's range: its infinity
        return out.astype(x.dtype)


register_op("resize", pattern="injective", infer=_resize_infer, compute=_resize_compute,
            reference=_resize_ref)


__all__ = ["axis_tables"]
