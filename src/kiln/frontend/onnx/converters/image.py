"""ONNX Resize and Upsample onto kiln.ops.image's `resize`: the output shape and the
per-axis scales resolved by ONNX's rules (Resize-10's form, sizes or scales, roi,
axes, keep_aspect_ratio_policy) and the attribute defaults passed on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, need_constant, onnx_op
from kiln.ir import graph as g


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
