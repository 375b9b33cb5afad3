"""Quantized (8/16-bit integer) operators: quantize, dequantize, the integer products and
their requantizing forms (docs/quantization.md).

- `quantize_linear(x, scale, zero_point)`: `saturate(round_half_even(x / scale) + zp)`,
  the dtype of `zero_point` (int8, uint8, int16, uint16); attributes `axis` and
  `block_size` choose per-tensor (scalar scale), per-axis (1-D scale along `axis`) or
  blocked (scale of x's rank, `block_size` elements of `axis` per scale) parameters;
  `zero_point_first` rounds `x / scale + zp` instead (onnxruntime's QLinearAveragePool,
  kiln.transform.quantize_ops); with `as_uint8` too (int8 only) the zero point is
  onnxruntime's uint8 one, `zp + 128`, and 128 is taken off the rounded value (its
  QLinearAveragePool on an int8 group it runs as uint8, kiln.ops.quant_ort).
- `dequantize_linear(x, scale, zero_point)`: `(x - zp) * scale` in the scale's dtype
  (x may also be int32, a bias, with zero point 0); same attributes.
- `dynamic_quantize_linear(x)` -> (y uint8, scale, zero_point): ONNX DynamicQuantizeLinear.
- `matmul_integer(a, b, a_zp, b_zp)` and `conv_integer(x, w, x_zp, w_zp)`: int32
  `sum((a - a_zp) * (b - b_zp))` (ONNX MatMulInteger / ConvInteger; `b_zp`/`w_zp` is a
  scalar or one value per output column/channel; convolution pads with `x_zp`).
- `qlinear_matmul(a, b, bias, a_zp, b_zp, multiplier, y_zp)` and `qlinear_conv(x, w,
  bias, x_zp, w_zp, multiplier, y_zp)`: the integer product plus the int32 `bias`,
  then requantized: `clamp(round_half_even(float32(acc) * multiplier), qmin - y_zp,
  qmax - y_zp) + y_zp` with `multiplier` one float32 per tensor or per output
  channel (`a_scale * b_scale / y_scale`, computed in float32 by whoever builds the
  call). `qmin`/`qmax` narrow the output range: that is how a fused ReLU or Clip
  is applied (`kiln.transform.quantize_ops`). The `qlinear_*` ops are what ONNX
  QLinearConv/QLinearMatMul/QGemm import to and what the QDQ fusion pass builds.

Rounding is half to even (`round`, i.e. `rint` under the default rounding mode),
as ONNX QuantizeLinear specifies and onnxruntime computes. A NaN quantizes (and
requantizes) to the type's minimum, as onnxruntime's kernels give it: MLAS clamps with
`maxps(v, lo)`, which returns `lo` for a NaN `v`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import (
    Cast,
    PrimExpr,
    as_expr,
    compare,
    intrin,
    max_,
    min_,
    reinterpret,
    select,
)
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ops import spatial, te
from kiln.ops.nan_order import max_keep_first, max_keep_second, min_keep_first
from kiln.ops.nn import b_shape, conv_geometry, conv_ref, matmul_indexing, matmul_shapes
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]

#: The integer types a quantized tensor may have (4-bit and float8 types are refused).
QUANT_DTYPES = ("int8", "uint8", "int16", "uint16")
#: The operand types of the integer products (u8/s8 x u8/s8 -> s32).
PRODUCT_DTYPES = ("int8", "uint8")


def qrange(dtype: str) -> tuple[int, int]:
    """The saturation range [lo, hi] of a quantized dtype."""
    info = np.iinfo(dt.to_numpy(dtype))
    return int(info.min), int(info.max)


def out_range(attrs: Attrs, dtype: str) -> tuple[int, int]:
    """The output range of a requantizing op: the dtype's range narrowed by the
    attributes `qmin`/`qmax` (a fused ReLU or Clip)."""
    lo, hi = qrange(dtype)
    lo = max(lo, int(attrs.get("qmin", lo)))
    hi = min(hi, int(attrs.get("qmax", hi)))
    if lo > hi:
        raise IRError(f"requantization range [{lo}, {hi}] is empty")
    return lo, hi


def requantize_multiplier(in_scale: Any, w_scale: Any, out_scale: Any) -> np.ndarray:
    """`in_scale * w_scale / out_scale` in float32, left to right, as onnxruntime's
    QLinearConv/QLinearMatMul compute their output scales (a scalar or one per channel)."""
    a = np.float32(np.asarray(in_scale, np.float32).reshape(()))
    w = np.asarray(w_scale, np.float32)
    y = np.float32(np.asarray(out_scale, np.float32).reshape(()))
    return ((a * w).astype(np.float32) / y).astype(np.float32)


# --------------------------------------------------------------------------- parameters

def _axis(attrs: Attrs, ndim: int) -> int:
    axis = int(attrs.get("axis", 1))
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IRError(f"axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)


def _check_params(what: str, x: TensorType, scale: TensorType, zp: TensorType,
                  attrs: Attrs) -> None:
    """Check scale/zero-point shapes against `x` for the per-tensor, per-axis or blocked form."""
    if not dt.is_float(scale.dtype):
        raise IRError(f"{what}: the scale must be a float tensor, got {scale.dtype}")
    if tuple(scale.shape) != tuple(zp.shape):
        raise IRError(f"{what}: scale {shape_text(scale.shape)} and zero point "
                      f"{shape_text(zp.shape)} differ in shape")
    block = int(attrs.get("block_size", 0))
    if block < 0:
        raise IRError(f"{what}: block_size must be >= 0, got {block}")
    if scale.ndim == 0 and block == 0:
        return
    axis = _axis(attrs, x.ndim)
    if block == 0:
        if scale.ndim != 1 or scale.shape[0] != x.shape[axis]:
            raise IRError(f"{what}: a per-axis scale must be 1-D with {x.shape[axis]} "
                          f"values (dimension {axis} of {shape_text(x.shape)}), got "
                          f"{shape_text(scale.shape)}")
        return
    want = tuple(-(-d // block) if k == axis else d for k, d in enumerate(x.shape))
    if tuple(scale.shape) != want:
        raise IRError(f"{what}: a blocked scale (block_size {block} on axis {axis}) of "
                      f"{shape_text(x.shape)} must have shape {want}, got "
                      f"{shape_text(scale.shape)}")


def _param_index(attrs: Attrs, scale: te.Tensor, idx: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
    """The index of the scale/zero point that applies to element `idx` of x."""
    if scale.ndim == 0:
        return ()
    axis = _axis(attrs, len(idx))
    block = int(attrs.get("block_size", 0))
    if block == 0:
        return (idx[axis],)
    return tuple(i // block if k == axis else i for k, i in enumerate(idx))


def _expand(param: np.ndarray, shape: tuple[int, ...], attrs: Attrs) -> np.ndarray:
    """A scale/zero point broadcast to x's `shape` (numpy references)."""
    if param.ndim == 0:
        return param
    axis = _axis(attrs, len(shape))
    block = int(attrs.get("block_size", 0))
    if block == 0:
        view = [1] * len(shape)
        view[axis] = -1
        return param.reshape(view)
    return np.repeat(param, block, axis=axis).take(range(shape[axis]), axis=axis)


# --------------------------------------------------------------------------- quantize / dequantize

def _quantize_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, scale, zp = types
    if not dt.is_float(x.dtype):
        raise IRError(f"quantize_linear: the input must be a float tensor, got {x.dtype}")
    if zp.dtype not in QUANT_DTYPES:
        raise IRError(f"quantize_linear: kiln quantizes to {', '.join(QUANT_DTYPES)}, "
                      f"not {zp.dtype}")
    if attrs.get("as_uint8") and zp.dtype != "int8":
        raise IRError(f"quantize_linear: as_uint8 takes an int8 output (onnxruntime's "
                      f"shift of int8 to uint8), not {zp.dtype}")
    _check_params("quantize_linear", x, scale, zp, attrs)
    return TensorType(x.shape, zp.dtype)


def quantize_value(v: PrimExpr, scale: PrimExpr, zp: PrimExpr, lo: int, hi: int,
                   out_dtype: str, zero_point_first: bool = False, shift: int = 0) -> PrimExpr:
    """`saturate(round_half_even(v / scale) + zp)` for float32 `v` and `scale`
    (`zero_point_first`: `saturate(round_half_even(v / scale + zp + shift) - shift)`)."""
    if zero_point_first:
        zf = Cast("float32", zp) + float(shift) if shift else Cast("float32", zp)
        q = intrin("round", v / scale + zf)
        if shift:
            q = q - float(shift)
    else:
        q = intrin("round", v / scale) + Cast("float32", zp)
    # a NaN goes to `lo` (max_keep_second: one `maxps` on x86, as MLAS clamps)
    return Cast(out_dtype, min_(max_keep_second(q, as_expr(float(lo), "float32")), float(hi)))


def as_float32(v: PrimExpr) -> PrimExpr:
    """`v` as float32 (a cast unless it already is)."""
    return v if v.dtype == "float32" else Cast("float32", v)


def _quantize_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, scale, zp = inputs
    lo, hi = qrange(zp.dtype)

    def element(*i: PrimExpr) -> PrimExpr:
        p = _param_index(attrs, scale, i)
        return quantize_value(as_float32(x[i]), as_float32(scale[p]), zp[p], lo, hi, zp.dtype,
                              bool(attrs.get("zero_point_first")),
                              128 if attrs.get("as_uint8") else 0)

    return te.compute(x.shape, element, zp.dtype, "quantize")


def quantize_ref(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy QuantizeLinear in float32 arithmetic (as the kernels compute it)."""
    s = _expand(np.asarray(scale, np.float32), x.shape, attrs)
    z = _expand(np.asarray(zp), x.shape, attrs).astype(np.float32)
    lo, hi = qrange(dt.from_numpy(zp.dtype))
    shift = np.float32(128 if attrs.get("as_uint8") else 0)
    with np.errstate(all="ignore"):
        if attrs.get("zero_point_first"):
            q = np.rint((x.astype(np.float32) / s + (z + shift)).astype(np.float32)) - shift
        else:
            q = np.rint(x.astype(np.float32) / s) + z
    return np.clip(np.where(np.isnan(q), lo, q), lo, hi).astype(zp.dtype)


register_op("quantize_linear", pattern="elemwise", infer=_quantize_infer,
            compute=_quantize_compute, reference=quantize_ref)


def _dequantize_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, scale, zp = types
    if x.dtype not in (*QUANT_DTYPES, "int32"):
        raise IRError(f"dequantize_linear: kiln dequantizes {', '.join(QUANT_DTYPES)} and "
                      f"int32, not {x.dtype}")
    if zp.dtype != x.dtype:
        raise IRError(f"dequantize_linear: zero point dtype {zp.dtype} differs from the "
                      f"input's {x.dtype}")
    _check_params("dequantize_linear", x, scale, zp, attrs)
    return TensorType(x.shape, scale.dtype)


def _dequantize_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, scale, zp = inputs

    def element(*i: PrimExpr) -> PrimExpr:
        p = _param_index(attrs, scale, i)
        diff = Cast("int32", x[i]) - Cast("int32", zp[p])
        v = Cast("float32", diff) * as_float32(scale[p])
        return v if scale.dtype == "float32" else Cast(scale.dtype, v)

    return te.compute(x.shape, element, scale.dtype, "dequantize")


def _dequantize_ref(x: np.ndarray, scale: np.ndarray, zp: np.ndarray,
                    **attrs: Any) -> np.ndarray:
    s = _expand(np.asarray(scale, np.float32), x.shape, attrs)
    z = _expand(np.asarray(zp), x.shape, attrs).astype(np.int32)
    diff = (x.astype(np.int32) - z).astype(np.float32)
    return (diff * s).astype(scale.dtype)


register_op("dequantize_linear", pattern="elemwise", infer=_dequantize_infer,
            compute=_dequantize_compute, reference=_dequantize_ref)


# --------------------------------------------------------------------------- dynamic quantization

def _dynamic_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    (x,) = types
    if x.dtype != "float32":
        raise IRError(f"dynamic_quantize_linear: the input must be float32, got {x.dtype}")
    return TupleType((TensorType(x.shape, "uint8"), TensorType((), "float32"),
                      TensorType((), "uint8")))


def dynamic_scale(lo: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """DynamicQuantizeLinear's scale for the range [lo, hi] (lo <= 0 <= hi), float32."""
    return select(compare("eq", hi, lo), as_expr(1.0, "float32"), (hi - lo) / 255.0)


def dynamic_zero_point(lo: PrimExpr, scale: PrimExpr) -> PrimExpr:
    """DynamicQuantizeLinear's uint8 zero point for the range's minimum `lo`, clamped as
    onnxruntime clamps it (`std::max(0, std::min(255, initial))`: a NaN initial value, an
    infinite range's, gives 255)."""
    initial = as_expr(0.0, "float32") - lo / scale
    clamped = max_keep_first(as_expr(0.0, "float32"),
                             min_keep_first(as_expr(255.0, "float32"), initial))
    return Cast("uint8", intrin("round", clamped))


def _dynamic_compute(inputs: Sequence[te.Tensor], attrs: Attrs
                     ) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    (x,) = inputs
    every = tuple(x.shape)

    def extreme(kind: str) -> PrimExpr:
        # a NaN never replaces the extreme so far: onnxruntime's range skips NaN
        return te.reduce(kind, lambda *k: x[k], every, "float32")

    lo_t = te.compute((), lambda: min_(extreme("scan_min"), 0.0), "float32", "lo",
                      materialize=True)
    hi_t = te.compute((), lambda: max_(extreme("scan_max"), 0.0), "float32", "hi",
                      materialize=True)

    scale = te.compute((), lambda: dynamic_scale(lo_t[()], hi_t[()]), "float32", "scale",
                       materialize=True)
    zp = te.compute((), lambda: dynamic_zero_point(lo_t[()], scale[()]), "uint8",
                    "zero_point", materialize=True)
    y = te.compute(x.shape, lambda *i: quantize_value(x[i], scale[()], zp[()], 0, 255, "uint8"),
                   "uint8", "y")
    return y, scale, zp


def _dynamic_ref(x: np.ndarray, **attrs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = np.asarray(x, np.float32).ravel()
    lo = np.float32(np.fmin.reduce(flat, initial=0.0))  # NaN skipped, 0 included
    hi = np.float32(np.fmax.reduce(flat, initial=0.0))
    with np.errstate(all="ignore"):
        scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255.0))
        initial = np.float32(np.float32(0.0) - lo / scale)
    clamped = initial if initial < 255 else np.float32(255.0)  # std::min: NaN gives 255
    zp = np.uint8(np.rint(clamped if clamped > 0 else np.float32(0.0)))
    y = quantize_ref(x, np.asarray(scale), np.asarray(zp))
    return y, np.asarray(scale), np.asarray(zp)


register_op("dynamic_quantize_linear", pattern="opaque", infer=_dynamic_infer,
            compute=_dynamic_compute, reference=_dynamic_ref)


# --------------------------------------------------------------------------- integer products

def _check_zp(what: str, name: str, operand: TensorType, zp: TensorType,
              per_channel: int | None) -> None:
    if operand.dtype not in PRODUCT_DTYPES:
        raise IRError(f"{what}: {name} must be int8 or uint8, got {operand.dtype}")
    if zp.dtype != operand.dtype:
        raise IRError(f"{what}: the zero point of {name} is {zp.dtype}, {name} is "
                      f"{operand.dtype}")
    shapes: list[tuple[Any, ...]] = [()]
    if per_channel is not None:
        shapes.append((per_channel,))
    if tuple(zp.shape) not in shapes:
        raise IRError(f"{what}: the zero point of {name} must have shape "
                      f"{' or '.join(str(s) for s in shapes)}, got {shape_text(zp.shape)}")


def _zp_at(zp: te.Tensor, channel: PrimExpr) -> PrimExpr:
    return Cast("int32", zp[() if zp.ndim == 0 else (channel,)])


def _matmul_int_shape(what: str, types: Sequence[TensorType], attrs: Attrs) -> tuple[Any, ...]:
    a, b, a_zp, b_zp = types[0], types[1], types[-2], types[-1]
    logical = b_shape(b.shape, attrs)  # type: ignore[arg-type]
    n = logical[-1] if len(logical) >= 2 else 1
    _check_zp(what, "A", a, a_zp, None)
    _check_zp(what, "B", b, b_zp, n)
    return matmul_shapes(a.shape, logical)  # type: ignore[arg-type]


def _matmul_acc(a: te.Tensor, b: te.Tensor, a_zp: te.Tensor, b_zp: te.Tensor,
                attrs: Attrs) -> tuple[tuple[Any, ...], Any]:
    """(output shape, element(*i) -> (the int32 sum of (a - a_zp) * (b - b_zp), the
    output column))."""
    out_shape, k_extent, index = matmul_indexing(a, b, attrs)

    def element(*i: PrimExpr) -> tuple[PrimExpr, PrimExpr]:
        row, col, a_at, b_at = index(*i)
        za, zb = _zp_at(a_zp, row), _zp_at(b_zp, col)

        def term(k: PrimExpr) -> PrimExpr:
            return (Cast("int32", a[a_at(k)]) - za) * (Cast("int32", b[b_at(k)]) - zb)

        return te.reduce("sum", term, (k_extent,), "int32"), col

    return out_shape, element


def _matmul_int_ref(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray, b_zp: np.ndarray,
                    **attrs: Any) -> np.ndarray:
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    a64 = a.astype(np.int64) - np.asarray(a_zp, np.int64)
    b64 = b.astype(np.int64) - np.asarray(b_zp, np.int64)
    return np.matmul(a64, b64).astype(np.int32)


def _matmul_integer_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    return TensorType(_matmul_int_shape("matmul_integer", types, attrs), "int32")


def _matmul_integer_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, b, a_zp, b_zp = inputs
    shape, element = _matmul_acc(a, b, a_zp, b_zp, attrs)
    return te.compute(shape, lambda *i: element(*i)[0], "int32", "matmul_integer")


register_op("matmul_integer", pattern="anchor", infer=_matmul_integer_infer,
            compute=_matmul_integer_compute, reference=_matmul_int_ref)


def conv_int_shape(what: str, types: Sequence[TensorType], attrs: Attrs) -> tuple[Any, ...]:
    """Output shape of an integer convolution `what` (x, w and their zero points),
    checked like nn.conv's."""
    x, w, x_zp, w_zp = types
    xs, ws = x.shape, w.static_shape
    rank, strides, dilations, begins, ends = conv_geometry(xs, ws, attrs, what)
    group = int(attrs.get("group", 1))
    if group < 1 or xs[1] != ws[1] * group or ws[0] % group:
        raise IRError(f"{what}: input has {xs[1]} channels, weight {ws} with group {group} "
                      f"expects {ws[1] * group} (and out channels divisible by group)")
    _check_zp(what, "X", x, x_zp, None)
    _check_zp(what, "W", w, w_zp, ws[0])
    out = tuple(spatial.conv_out(xs[2 + k], ws[2 + k], strides[k], dilations[k], begins[k],
                                 ends[k]) for k in range(rank))
    if min(out) <= 0:
        raise IRError(f"{what}: output would be empty ({out})")
    return (xs[0], ws[0], *out)


def _conv_acc(x: te.Tensor, w: te.Tensor, x_zp: te.Tensor, w_zp: te.Tensor,
              attrs: Attrs) -> Any:
    """element(n, oc, *o) -> the int32 sum of (x - x_zp) * (w - w_zp), x padded with x_zp.

    The shifted input `x - x_zp` is materialized once as int16, zero-padded, so the
    reduction reads it without bounds tests and multiplies 16-bit values into an
    int32 sum (what `vpmaddwd` computes); the weights are shifted by their zero point
    as they are read."""
    rank, strides, dilations, begins, ends = conv_geometry(x.shape, w.shape, attrs, "conv")
    ci, kernel = w.shape[1], w.shape[2:]
    group = int(attrs.get("group", 1))
    per_group = w.shape[0] // group
    padded_shape = (*x.shape[:2], *(x.shape[2 + j] + begins[j] + ends[j] for j in range(rank)))

    def shifted(n: PrimExpr, c: PrimExpr, *p: PrimExpr) -> PrimExpr:
        pos = tuple(p[j] - begins[j] for j in range(rank))
        xv = te.padded(x, (n, c, *pos), x_zp[()])   # padding is the zero point
        return Cast("int16", Cast("int32", xv) - _zp_at(x_zp, as_expr(0)))

    xs = te.compute(padded_shape, shifted, "int16", "x_shifted", materialize=True)

    def element(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        first = (oc // per_group) * ci if group > 1 else as_expr(0)
        zw = _zp_at(w_zp, oc)

        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] for j in range(rank))
            return Cast("int32", xs[(n, first + c, *pos)]) * (Cast("int32", w[(oc, c, *k)]) - zw)

        return te.reduce("sum", term, (ci, *kernel), "int32")

    return element


def _conv_int_ref(x: np.ndarray, w: np.ndarray, x_zp: np.ndarray, w_zp: np.ndarray,
                  **attrs: Any) -> np.ndarray:
    zw = np.asarray(w_zp, np.int64)
    zw = zw.reshape(-1, *([1] * (w.ndim - 1))) if zw.ndim else zw
    xd = x.astype(np.int64) - np.asarray(x_zp, np.int64)
    return conv_ref(xd, w.astype(np.int64) - zw, **attrs).astype(np.int32)


def _conv_integer_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    return TensorType(conv_int_shape("conv_integer", types, attrs), "int32")


def _conv_integer_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, w, x_zp, w_zp = inputs
    shape = conv_int_shape("conv_integer", [TensorType(t.shape, t.dtype) for t in inputs],
                            attrs)
    return te.compute(shape, _conv_acc(x, w, x_zp, w_zp, attrs), "int32", "conv_integer")


register_op("conv_integer", pattern="anchor", infer=_conv_integer_infer,
            compute=_conv_integer_compute, reference=_conv_int_ref)


# --------------------------------------------------------------------------- requantizing ops

#: 1.5 * 2**23: a float32 `v` with |v| < 2**22 plus this has ulp 1, so the sum is `v`
#: rounded half to even (the default rounding mode) and its bits are MAGIC_BITS + that.
ROUNDING_MAGIC, MAGIC_BITS = 12582912.0, 0x4B400000


def requantize_value(acc: PrimExpr, multiplier: PrimExpr, zp: PrimExpr, lo: int, hi: int,
                     out_dtype: str, bounds_first: bool = False,
                     magic_round: bool = False, selects: bool = False,
                     packs: bool = False) -> PrimExpr:
    """`clamp(float32(acc) * multiplier, lo - zp, hi - zp)` rounded half to even, + zp
    (onnxruntime's MLAS requantization: the clamp before rounding is exact because the
    bounds are integers). The lower bound is always `v > lo ? v : lo`, one `vmaxps` on
    x86, which takes a NaN (a scale given at run time: NaN, or infinite times a zero
    sum) to `lo`, as MLAS's clamp does.

    `bounds_first` puts the bound first in the upper clamp's min: the same values, which
    LLVM, knowing the bound is no NaN, makes a compare and a masked move instead of two
    compares and a blend (the depthwise plane kernel takes it; in every int8 kernel it
    made whole models slower, so it is not the default).

    `magic_round` rounds and converts the clamped value (|v| <= 510) by adding
    ROUNDING_MAGIC and reading the sum's bits (two integer-exact operations instead of a
    rounding and a conversion).

    `selects` writes the upper clamp as a select on one ordered compare too (`v > hi ?
    hi : v`), which x86 makes one `vminps` where min costs a compare, an unordered
    compare, a mask OR and a blend (LLVM does not see that the bound is never NaN). The
    leaner body changes what LLVM unrolls and vectorizes around it, so a kernel takes it
    where its store loops were checked (the dot-form convolution's positions tile,
    kiln.kernels.int8.conv_tiles).

    `packs` (with `magic_round`) clamps the rounded integer to [lo, hi] as well: the
    same values (the float clamp put it there), but LLVM, now knowing the range, narrows
    the int32 lanes with saturating packs instead of masking each lane to a byte first
    (one instruction less a vector on AVX2: kiln.kernels.int8.conv_tile.narrows_by_packs;
    the channels tile, which narrows into a small buffer, gains nothing from it and does
    not take it)."""
    v = _scaled_clamped(acc, multiplier, zp, lo, hi, bounds_first, selects)
    if magic_round:
        bits = reinterpret(v + as_expr(ROUNDING_MAGIC, "float32"), "int32")
        q = bits - (as_expr(MAGIC_BITS, "int32") - Cast("int32", zp))
        if packs:
            q = min_(max_(q, as_expr(lo, "int32")), as_expr(hi, "int32"))
        return Cast(out_dtype, q)
    return Cast(out_dtype, Cast("int32", intrin("round", v)) + Cast("int32", zp))


def _scaled_clamped(acc: PrimExpr, multiplier: PrimExpr, zp: PrimExpr, lo: int, hi: int,
                    bounds_first: bool, selects: bool) -> PrimExpr:
    """`clamp(float32(acc) * multiplier, lo - zp, hi - zp)`, as `requantize_value` says."""
    z = Cast("float32", zp)
    v = Cast("float32", acc) * multiplier
    lo_, hi_ = as_expr(float(lo), "float32") - z, as_expr(float(hi), "float32") - z
    # the lower bound first, as `v > lo ? v : lo` (one `maxps`): a NaN (a NaN or
    # infinite scale given at run time) goes to `lo`, as onnxruntime's kernels give it
    v = select(compare("gt", v, lo_), v, lo_)
    if selects:
        return select(compare("gt", v, hi_), hi_, v)
    return min_(hi_, v) if bounds_first else min_(v, hi_)


def requantize_float(acc: PrimExpr, multiplier: PrimExpr, zp: PrimExpr, lo: int, hi: int,
                     shift: int = 0) -> PrimExpr:
    """`requantize_value(..., selects=True)`'s integer plus `shift`, as an exact float32:
    the clamped value rounded by adding ROUNDING_MAGIC, then less (ROUNDING_MAGIC - zp -
    shift), both exact (the sum is an integer within 510 of ROUNDING_MAGIC). For a
    value that float32 arithmetic takes next (a fused residual add,
    kiln.kernels.int8.conv_residual) without a conversion to an integer and back."""
    v = _scaled_clamped(acc, multiplier, zp, lo, hi, False, True)
    rounded = v + as_expr(ROUNDING_MAGIC, "float32")
    return rounded - (as_expr(ROUNDING_MAGIC - shift, "float32") - Cast("float32", zp))


def requantize_ref(acc: np.ndarray, multiplier: np.ndarray, zp: np.ndarray, lo: int, hi: int,
                   channel_axis: int) -> np.ndarray:
    """numpy requantization of int32 `acc` (multiplier per tensor or per `channel_axis`)."""
    m = np.asarray(multiplier, np.float32)
    if m.ndim:
        view = [1] * acc.ndim
        view[channel_axis] = -1
        m = m.reshape(view)
    z = np.float32(np.asarray(zp).astype(np.float32))
    with np.errstate(invalid="ignore"):
        v = acc.astype(np.float32) * m
    v = np.clip(np.where(np.isnan(v), np.float32(lo) - z, v), np.float32(lo) - z,
                np.float32(hi) - z)
    return (np.rint(v).astype(np.int32) + np.int32(z)).astype(zp.dtype)


def check_requant(what: str, n: Any, bias: TensorType, multiplier: TensorType,
                  y_zp: TensorType, attrs: Attrs) -> None:
    """IRError unless the requantizing epilogue's operands fit `n` output channels."""
    if bias.dtype != "int32" or tuple(bias.shape) != (n,):
        raise IRError(f"{what}: the bias must be int32 of shape ({n},), got {bias.dtype} "
                      f"{shape_text(bias.shape)}")
    if multiplier.dtype != "float32" or tuple(multiplier.shape) not in ((), (n,)):
        raise IRError(f"{what}: the multiplier must be float32 of shape () or ({n},), got "
                      f"{multiplier.dtype} {shape_text(multiplier.shape)}")
    if y_zp.dtype not in PRODUCT_DTYPES or y_zp.ndim != 0:
        raise IRError(f"{what}: the output zero point must be an int8 or uint8 scalar, got "
                      f"{y_zp.dtype} {shape_text(y_zp.shape)}")
    out_range(attrs, y_zp.dtype)


def _qmatmul_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, b, bias, a_zp, b_zp, multiplier, y_zp = types
    shape = _matmul_int_shape("qlinear_matmul", [a, b, a_zp, b_zp], attrs)
    logical = b_shape(b.shape, attrs)  # type: ignore[arg-type]
    check_requant("qlinear_matmul", logical[-1] if b.ndim >= 2 else 1, bias, multiplier, y_zp,
                   attrs)
    return TensorType(shape, y_zp.dtype)


def channel(t: te.Tensor, c: PrimExpr) -> PrimExpr:
    """Channel `c` of a per-channel parameter (or the scalar of a per-tensor one)."""
    return t[() if t.ndim == 0 else (c,)]


def _qmatmul_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, b, bias, a_zp, b_zp, multiplier, y_zp = inputs
    shape, element = _matmul_acc(a, b, a_zp, b_zp, attrs)
    lo, hi = out_range(attrs, y_zp.dtype)

    def value(*i: PrimExpr) -> PrimExpr:
        acc, col = element(*i)
        acc = acc + Cast("int32", bias[col])
        return requantize_value(acc, channel(multiplier, col), y_zp[()], lo, hi, y_zp.dtype)

    return te.compute(shape, value, y_zp.dtype, "qlinear_matmul")


def _qmatmul_ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray, a_zp: np.ndarray,
                 b_zp: np.ndarray, multiplier: np.ndarray, y_zp: np.ndarray,
                 **attrs: Any) -> np.ndarray:
    acc = _matmul_int_ref(a, b, a_zp, b_zp, **attrs) + bias.astype(np.int32)
    lo, hi = out_range(attrs, dt.from_numpy(y_zp.dtype))
    return requantize_ref(acc, multiplier, y_zp, lo, hi, acc.ndim - 1)


register_op("qlinear_matmul", pattern="anchor", infer=_qmatmul_infer,
            compute=_qmatmul_compute, reference=_qmatmul_ref)


def _qconv_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, w, bias, x_zp, w_zp, multiplier, y_zp = types
    shape = conv_int_shape("qlinear_conv", [x, w, x_zp, w_zp], attrs)
    check_requant("qlinear_conv", w.shape[0], bias, multiplier, y_zp, attrs)
    return TensorType(shape, y_zp.dtype)


def _qconv_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, w, bias, x_zp, w_zp, multiplier, y_zp = inputs
    shape = conv_int_shape("qlinear_conv", [TensorType(t.shape, t.dtype)
                                             for t in (x, w, x_zp, w_zp)], attrs)
    acc_of = _conv_acc(x, w, x_zp, w_zp, attrs)
    lo, hi = out_range(attrs, y_zp.dtype)

    def value(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        acc = acc_of(n, oc, *o) + bias[oc]
        return requantize_value(acc, channel(multiplier, oc), y_zp[()], lo, hi, y_zp.dtype)

    return te.compute(shape, value, y_zp.dtype, "qlinear_conv")


def _qconv_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
               w_zp: np.ndarray, multiplier: np.ndarray, y_zp: np.ndarray,
               **attrs: Any) -> np.ndarray:
    acc = _conv_int_ref(x, w, x_zp, w_zp, **attrs)
    acc = acc + bias.astype(np.int32).reshape(-1, *([1] * (acc.ndim - 2)))
    lo, hi = out_range(attrs, dt.from_numpy(y_zp.dtype))
    return requantize_ref(acc, multiplier, y_zp, lo, hi, 1)


register_op("qlinear_conv", pattern="anchor", infer=_qconv_infer, compute=_qconv_compute,
            reference=_qconv_ref)
