"""Integer global average pooling of quantized models, as onnxruntime computes it
(docs/quantization.md, "The pass").

`qlinear_global_average_pool(x, x_scale, x_zp, y_scale, y_zp)` (attribute
`channels_last`, 0 or 1) is MLAS's QLinearGlobalAveragePool, which onnxruntime runs for
`DequantizeLinear -> GlobalAveragePool -> QuantizeLinear` and for the com.microsoft node:
the int32 sum over the image minus `x_zp * size`, requantized like a product's
accumulator: `saturate(round_half_even(float32(acc) * (x_scale / (y_scale *
float32(size)))) + y_zp)`, the product clamped to `[qmin - y_zp, qmax - y_zp]` first.
The output keeps the pooled axes with extent 1; `x` and `y_zp` are both int8 or both
uint8, the scales float32 scalars. With attribute `in_layout` NCHW4c (set by
kiln.transform.quant_layout where the convolutions before it keep their activations in
words of 4 channels) `x` is `[N][C / 4][H][W][4]` and the output NCHW `[N][C][1][1]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import Cast, PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.layout import blocked_layout, from_blocked
from kiln.ops.quant import PRODUCT_DTYPES, qrange, requantize_ref, requantize_value
from kiln.ops.quant_words import GROUP
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
GLOBAL_AVERAGE = "qlinear_global_average_pool"
#: The words-of-4-channels layout (kiln.ops.quant_conv_words.WORDS_LAYOUT)
WORDS = blocked_layout(GROUP)


def words_input(attrs: Attrs) -> bool:
    """Whether the input is in words of 4 channels (attribute `in_layout`: "NCHW", the
    default, or NCHW4c)."""
    value = str(attrs.get("in_layout", "NCHW"))
    if value not in ("NCHW", WORDS):
        raise IRError(f"{GLOBAL_AVERAGE}: in_layout must be 'NCHW' or {WORDS!r}, got {value!r}")
    return value == WORDS


def pooled_axes(rank: int, attrs: Attrs) -> tuple[int, ...]:
    """The image axes: 1 .. rank-2 for channels last, else 2 .. rank-1."""
    return tuple(range(1, rank - 1)) if attrs.get("channels_last") else tuple(range(2, rank))


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, x_scale, x_zp, y_scale, y_zp = types
    what = GLOBAL_AVERAGE
    if x.ndim < 3:
        raise IRError(f"{what}: the input must have rank >= 3, got {shape_text(x.shape)}")
    if x.dtype not in PRODUCT_DTYPES or {x_zp.dtype, y_zp.dtype} != {x.dtype}:
        raise IRError(f"{what}: the input and both zero points must all be int8 or all "
                      f"uint8, got {x.dtype}, {x_zp.dtype} and {y_zp.dtype}")
    if any(t.dtype != "float32" or t.ndim for t in (x_scale, y_scale)) or x_zp.ndim \
            or y_zp.ndim:
        raise IRError(f"{what}: the scales must be float32 scalars and the zero points "
                      "scalars")
    if words_input(attrs):
        if x.ndim != 5 or x.shape[4] != GROUP or attrs.get("channels_last") \
                or not all(isinstance(d, int) for d in x.shape[1:]):
            raise IRError(f"{what}: a {WORDS} input is 5-D [N][C / 4][H][W][{GROUP}], "
                          f"static but for the batch, got {shape_text(x.shape)}")
        return TensorType((x.shape[0], cast(int, x.shape[1]) * GROUP, 1, 1), x.dtype)
    if not all(isinstance(x.shape[k], int) for k in pooled_axes(x.ndim, attrs)):
        raise IRError(f"{what}: the image size must be static, got {shape_text(x.shape)}")
    axes = pooled_axes(x.ndim, attrs)
    return TensorType(tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, x_scale, x_zp, y_scale, y_zp = inputs
    words = words_input(attrs)
    axes = (2, 3) if words else pooled_axes(x.ndim, attrs)
    extents = [int(x.shape[k]) for k in axes]
    size = int(np.prod(extents))
    lo, hi = qrange(y_zp.dtype)
    out_type = _infer([TensorType(t.shape, t.dtype) for t in inputs], attrs)
    assert isinstance(out_type, TensorType)

    def element(*i: PrimExpr) -> PrimExpr:
        def term(*k: PrimExpr) -> PrimExpr:
            if words:  # channel c is byte c % 4 of word c // 4
                n, c = i[0], i[1]
                return Cast("int32", x[(n, c // GROUP, *k, c % GROUP)])
            at = list(i)
            for axis, kk in zip(axes, k, strict=True):
                at[axis] = kk
            return Cast("int32", x[tuple(at)])

        acc = te.reduce("sum", term, extents, "int32") - Cast("int32", x_zp[()]) * size
        multiplier = x_scale[()] / (y_scale[()] * float(size))
        return requantize_value(acc, multiplier, y_zp[()], lo, hi, y_zp.dtype)

    return te.compute(te.dims(out_type.shape), element, x.dtype, GLOBAL_AVERAGE)


def _reference(x: np.ndarray, x_scale: np.ndarray, x_zp: np.ndarray, y_scale: np.ndarray,
               y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    if words_input(attrs):
        x = from_blocked(x, x.shape[1] * GROUP)
        attrs = {k: v for k, v in attrs.items() if k != "in_layout"}
    axes = pooled_axes(x.ndim, attrs)
    size = int(np.prod([x.shape[k] for k in axes]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(x_zp) * size
    multiplier = np.float32(np.float32(x_scale) / np.float32(np.float32(y_scale)
                                                             * np.float32(size)))
    lo, hi = qrange(dt.from_numpy(y_zp.dtype))
    return requantize_ref(acc.astype(np.int32), np.asarray(multiplier), np.asarray(y_zp), lo, hi, 0)


register_op(GLOBAL_AVERAGE, pattern="reduce", infer=_infer, compute=_compute,
            reference=_reference)
