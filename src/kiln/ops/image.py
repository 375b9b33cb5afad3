"""Image operators: resize (nearest, linear, cubic; every ONNX coordinate mode).

Resizing is separable: along each resized axis, output position `o` reads a
few input positions `idx[o, t]` with weights `coef[o, t]`. `axis_tables`
computes those tables once, in float64 numpy, following ONNX's definition
(coordinate transformation, nearest rounding, cubic and antialias kernels,
exclude_outside, tf_crop_and_resize extrapolation). The lowering bakes the
tables into the kernel as constants (`te.const_tensor`) and the numpy reference
applies them axis by axis, so both agree on every rounding decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.tensor import Cast, PrimExpr, as_expr, intrin, max_, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.onnx_map import GraphContext, need_constant, onnx_op
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]

MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# --------------------------------------------------------------------------- tables

def _source_coords(coord_mode: str, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate of every output position, and the extrapolated mask."""
    y = np.arange(out_len, dtype=np.float64)
    out_width = scale * in_len       # the "ideal" output length
    outside = None
    if coord_mode == "align_corners":
        x = np.zeros(out_len) if out_width == 1 else y * (in_len - 1) / (out_width - 1)
    elif coord_mode == "asymmetric":
        x = y / scale
    elif coord_mode == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        if out_width == 1:
            x = np.full(out_len, (hi - lo) * (in_len - 1) / 2)
        else:
            x = y * (hi - lo) * (in_len - 1) / (out_width - 1)
        x = x + lo * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif coord_mode == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_width == 1 else (y + 0.5) / scale - 0.5
    elif coord_mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coord_mode == "tf_half_pixel_for_nn":      # Resize-11 only
        x = (y + 0.5) / scale
    elif coord_mode == "half_pixel_symmetric":
        adjustment = out_len / out_width
        x = in_len / 2 * (1 - adjustment) + (y + 0.5) / scale - 0.5
    else:
        raise IRError(f"resize: unknown coordinate_transformation_mode {coord_mode!r}; "
                      f"known: {', '.join(COORD_MODES)}")
    return x, outside


def _coeff_fn(attrs: Attrs) -> Callable[[float, float], np.ndarray]:
    """ratio (in (0, 1]) and scale -> the weights of the taps around the source point."""
    mode = str(attrs.get("mode", "nearest"))
    antialias = bool(attrs.get("antialias", 0))
    a = float(attrs.get("cubic_coeff_a", -0.75))
    if mode == "nearest":
        nearest = str(attrs.get("nearest_mode", "round_prefer_floor"))
        if nearest not in NEAREST_MODES:
            raise IRError(f"resize: unknown nearest_mode {nearest!r}; known: "
                          f"{', '.join(NEAREST_MODES)}")

        def near(ratio: float, scale: float) -> np.ndarray:
            if float(ratio).is_integer():
                return np.array([0.0, 1.0])
            take_right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                          "floor": False, "ceil": True}[nearest]
            return np.array([0.0, 1.0]) if take_right else np.array([1.0, 0.0])
        return near
    if mode == "linear":
        if not antialias:
            return lambda ratio, scale: np.array([1 - ratio, ratio])

        def linear_aa(ratio: float, scale: float) -> np.ndarray:
            s = min(scale, 1.0)
            start = int(np.floor(-1 / s) + 1)
            args = (np.arange(start, 2 - start) - ratio) * s
            c = np.clip(1 - np.abs(args), 0, 1)
            return np.asarray(c / c.sum())
        return linear_aa
    if mode == "cubic":
        def cubic_kernel(x: float) -> float:
            x = abs(x)
            if x <= 1:
                return ((a + 2) * x - (a + 3)) * x * x + 1
            if x < 2:
                return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
            return 0.0

        if not antialias:
            return lambda ratio, scale: np.array(
                [cubic_kernel(ratio + 1), cubic_kernel(ratio), cubic_kernel(1 - ratio),
                 cubic_kernel(2 - ratio)])

        def cubic_aa(ratio: float, scale: float) -> np.ndarray:
            s = min(scale, 1.0)
            start = int(np.floor(-2 / s) + 1)
            c = np.array([cubic_kernel(s * (i - ratio)) for i in range(start, 2 - start)])
            return np.asarray(c / c.sum())
        return cubic_aa
    raise IRError(f"resize: unknown mode {mode!r}; known: {', '.join(MODES)}")


def axis_tables(in_len: int, out_len: int, scale: float, attrs: Attrs,
                roi: tuple[float, float] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(idx[out, taps] int64 in [0, in_len), coef[out, taps] float64, extrapolated[out] | None)."""
    x, outside = _source_coords(str(attrs.get("coordinate_transformation_mode", "half_pixel")),
                                out_len, in_len, scale, roi)
    base = np.floor(x)
    ratios = np.where(x == base, 1.0, x - base)  # in (0, 1]: prefer the left pixel
    coeffs_of = _coeff_fn(attrs)
    coef = np.stack([coeffs_of(float(r), scale) for r in ratios]) if out_len else \
        np.zeros((0, 2))
    taps = coef.shape[1]
    # the `taps` positions nearest to x (ties toward the smaller index), as ONNX picks them
    pad = math.ceil(taps / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    idx = (p + offset)[:, None] + np.arange(taps)[None, :] - pad
    if bool(attrs.get("exclude_outside", 0)):
        coef = np.where((idx < 0) | (idx >= in_len), 0.0, coef)
        total = coef.sum(axis=1, keepdims=True)
        coef = coef / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, in_len - 1)
    if str(attrs.get("mode", "nearest")) == "nearest":
        # a single tap: the one with weight 1
        pick = np.argmax(coef, axis=1) if out_len else np.zeros(0, np.int64)
        idx = np.take_along_axis(idx, pick[:, None], axis=1)
        coef = np.ones_like(idx, dtype=np.float64)
    return idx.astype(np.int64), coef, outside


def _resize_axes(in_shape: Sequence[int], attrs: Attrs) -> list[int]:
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


def _roi(attrs: Attrs, k: int, rank: int) -> tuple[float, float] | None:
    roi = attrs.get("roi")
    return None if roi is None else (float(roi[k]), float(roi[k + rank]))


# --------------------------------------------------------------------------- the op

def _resize_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if not (dt.is_float(x.dtype) or dt.is_int(x.dtype)):
        raise IRError(f"resize needs a numeric tensor, got {x}")
    _resize_axes(x.static_shape, attrs)
    _coeff_fn(attrs)
    return TensorType(tuple(int(d) for d in attrs["sizes"]), x.dtype)


def _resize_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    rank = x.ndim
    axes = _resize_axes(x.shape, attrs)
    sizes = tuple(int(d) for d in attrs["sizes"])
    scales = tuple(float(s) for s in attrs["scales"])
    acc = "float64" if x.dtype == "float64" else "float32"
    np_acc = np.float64 if acc == "float64" else np.float32
    tables = {}
    masks = []
    for k in axes:
        idx, coef, outside = axis_tables(x.shape[k], sizes[k], scales[k], attrs,
                                         _roi(attrs, k, rank))
        tables[k] = (te.const_tensor(idx, f"idx{k}"), te.const_tensor(coef.astype(np_acc),
                                                                       f"coef{k}"),
                     idx.shape[1])
        if outside is not None and outside.any():
            masks.append((k, te.const_tensor(outside.astype(np.uint8), f"outside{k}")))
    nearest = str(attrs.get("mode", "nearest")) == "nearest"

    def element(*i: PrimExpr) -> PrimExpr:
        def term(*t: PrimExpr) -> PrimExpr:
            src = list(i)
            weight: PrimExpr | None = None
            for k, tap in zip(axes, t):
                idx_t, coef_t, _ = tables[k]
                src[k] = idx_t[i[k], tap]
                if not nearest:
                    w = coef_t[i[k], tap]
                    weight = w if weight is None else weight * w
            v = x[tuple(src)]
            v = v if v.dtype == acc else Cast(acc, v)
            return v if weight is None else v * weight

        taps = tuple(tables[k][2] for k in axes)
        if all(n == 1 for n in taps):
            value = term(*(as_expr(0) for _ in taps))
        else:
            value = te.reduce("sum", term, taps, acc)
        for k, mask in masks:
            value = select(mask[i[k]].ne(0), as_expr(float(attrs.get("extrapolation_value", 0.0)),
                                                     acc), value)
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
    rank = x.ndim
    sizes = tuple(int(d) for d in attrs["sizes"])
    scales = tuple(float(s) for s in attrs["scales"])
    out = x.astype(np.float64)
    for k in _resize_axes(x.shape, attrs):
        idx, coef, outside = axis_tables(x.shape[k], sizes[k], scales[k], attrs,
                                         _roi(attrs, k, rank))
        gathered = np.take(out, idx, axis=k)           # (..., out_k, taps, ...)
        shape = [1] * gathered.ndim
        shape[k], shape[k + 1] = coef.shape
        out = (gathered * coef.reshape(shape)).sum(axis=k + 1)
        if outside is not None:
            mshape = [1] * out.ndim
            mshape[k] = sizes[k]
            out = np.where(outside.reshape(mshape), float(attrs.get("extrapolation_value", 0.0)),
                           out)
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        out = np.clip(np.rint(out), info.min, info.max)
    return out.astype(x.dtype)


register_op("resize", pattern="injective", infer=_resize_infer, compute=_resize_compute,
            reference=_resize_ref)


# --------------------------------------------------------------------------- ONNX mapping

def _static(ctx: GraphContext, expr: g.Expr | None, what: str) -> np.ndarray | None:
    if expr is None:
        return None
    value = need_constant(ctx, expr, what)
    return value if value.size else None


# Bytes of coordinate tables per output position of one axis (an estimate: 4 taps).
_TABLE_BYTES = 64


def resize_call(ctx: GraphContext, x: g.Expr, *, scales: Sequence[float] | None,
                sizes: Sequence[int] | None, roi: Sequence[float] | None,
                axes: Sequence[int] | None, policy: str, **attrs: Any) -> g.Expr:
    """A resize call with the output shape and per-axis scales resolved (ONNX rules)."""
    shape = ctx.tensor_type(x).static_shape
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    full_scales = [1.0] * rank
    full_sizes = list(shape)
    if sizes is not None:
        if len(sizes) != len(axes):
            raise IRError(f"Resize sizes {tuple(sizes)} need {len(axes)} values")
        for n, a in enumerate(axes):
            if shape[a] == 0 and sizes[n] != 0:  # no elements to interpolate from
                raise IRError(f"Resize: axis {a} of {shape} is empty and cannot be resized "
                              f"to {sizes[n]}")
            if shape[a] == 0 and policy != "stretch":  # its ratio is 0/0
                raise IRError(f"Resize: axis {a} of {shape} is empty: it has no scale for "
                              f"keep_aspect_ratio_policy {policy!r}")
        # an empty axis resized to 0 stays empty whatever its scale
        ratio = [sizes[n] / shape[a] if shape[a] else 1.0 for n, a in enumerate(axes)]
        if policy in ("not_larger", "not_smaller"):
            common = min(ratio) if policy == "not_larger" else max(ratio)
            for a in axes:
                full_scales[a] = common
                full_sizes[a] = int(common * shape[a] + 0.5)
        elif policy == "stretch":
            for n, a in enumerate(axes):
                full_scales[a] = ratio[n]
                full_sizes[a] = int(sizes[n])
        else:
            raise IRError(f"Resize keep_aspect_ratio_policy {policy!r} is unknown; known: "
                          "stretch, not_larger, not_smaller")
    elif scales is not None:
        if len(scales) != len(axes):
            raise IRError(f"Resize scales {tuple(scales)} need {len(axes)} values")
        for n, a in enumerate(axes):
            if scales[n] <= 0:
                raise IRError(f"Resize scales must be positive, got {tuple(scales)}")
            full_scales[a] = float(scales[n])
            full_sizes[a] = math.floor(shape[a] * float(scales[n]))
    else:
        raise IRError("Resize needs scales or sizes")
    full_roi = None
    if roi is not None:
        full_roi = [0.0] * rank + [1.0] * rank
        for n, a in enumerate(axes):
            full_roi[a] = float(roi[n])
            full_roi[a + rank] = float(roi[n + len(axes)])
    if any(not math.isfinite(s) for s in full_scales) or any(d < 0 for d in full_sizes):
        raise IRError(f"Resize to shape {tuple(full_sizes)} with scales {tuple(full_scales)} "
                      "is impossible")
    # The kernel's per-axis coordinate tables (an index and a weight per tap) are
    # computed at compile time: bound them like a folded constant.
    ctx.check_materialize(_TABLE_BYTES * sum(full_sizes), f"Resize to shape {tuple(full_sizes)}")
    return ctx.call("resize", x, sizes=tuple(full_sizes), scales=tuple(full_scales),
                    roi=None if full_roi is None else tuple(full_roi), **attrs)


@onnx_op("Resize")
def _resize_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    mode = str(attrs.get("mode", "nearest"))
    if ctx.opset < 11:
        # Resize-10: Resize(X, scales), asymmetric coordinates, nearest rounds down
        scales = _static(ctx, inputs[1], "Resize scales")
        return [resize_call(ctx, x, scales=None if scales is None else scales.tolist(),
                            sizes=None, roi=None, axes=None, policy="stretch", mode=mode,
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    get = lambda k: inputs[k] if len(inputs) > k else None  # noqa: E731
    coord = str(attrs.get("coordinate_transformation_mode", "half_pixel"))
    roi = _static(ctx, get(1), "Resize roi") if coord == "tf_crop_and_resize" else None
    scales = _static(ctx, get(2), "Resize scales")
    sizes = _static(ctx, get(3), "Resize sizes")
    return [resize_call(
        ctx, x, scales=None if scales is None else scales.tolist(),
        sizes=None if sizes is None else [int(s) for s in sizes],
        roi=None if roi is None else roi.tolist(), axes=attrs.get("axes"),
        policy=str(attrs.get("keep_aspect_ratio_policy", "stretch")), mode=mode,
        coordinate_transformation_mode=coord,
        nearest_mode=str(attrs.get("nearest_mode", "round_prefer_floor")),
        cubic_coeff_a=float(attrs.get("cubic_coeff_a", -0.75)),
        exclude_outside=bool(attrs.get("exclude_outside", 0)),
        extrapolation_value=float(attrs.get("extrapolation_value", 0.0)),
        antialias=bool(attrs.get("antialias", 0)))]


@onnx_op("Upsample")
def _upsample_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    if ctx.opset >= 9:
        scales = _static(ctx, inputs[1] if len(inputs) > 1 else None, "Upsample scales")
        if scales is None:
            raise IRError("Upsample needs scales")
        scale_list = [float(s) for s in scales.reshape(-1)]
    else:
        scale_list = [float(s) for s in attrs["scales"]]
    mode = str(attrs.get("mode", "nearest"))
    if mode == "bilinear":
        mode = "linear"
    return [resize_call(ctx, x, scales=scale_list, sizes=None, roi=None, axes=None,
                        policy="stretch", mode=mode, coordinate_transformation_mode="asymmetric",
                        nearest_mode="floor")]


__all__ = ["axis_tables", "resize_call"]
