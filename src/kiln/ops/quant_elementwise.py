"""Elementwise integer operators of quantized models, computed as onnxruntime computes
them (docs/quantization.md, "The pass").

onnxruntime runs `DequantizeLinear x2 -> Add|Mul -> QuantizeLinear` as one QLinearAdd /
QLinearMul kernel (its QDQ transformer, and the com.microsoft QOperator nodes), whose
float32 formula is not dequantize-add-quantize: the results differ by one quantum at
some rounding boundaries, and later layers carry that on. These ops are that formula:

- `qlinear_add(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)`, MLAS's QLinearAdd:
  with `ra = a_scale / y_scale`, `rb = b_scale / y_scale` and
  `fixed = y_zp - fma(ra, a_zp, rb * b_zp)` (float32),
  `y = saturate(round_half_even(fma(a, ra, fma(b, rb, fixed))))`. onnxruntime's
  broadcasting loop hands MLAS spans of the output's innermost varying axis, and puts an
  operand constant along that axis second: where `a` is that operand (a scalar, or a
  per-channel tensor broadcast over the image) the roles of `a` and `b` swap;
- `qlinear_mul(...)` (same operands), MLAS's QLinearMul:
  `y = saturate(round_half_even(float32((a - a_zp) * (b - b_zp)) * (a_scale * b_scale /
  y_scale) + y_zp))`.

- `qlinear_concat(x_1, ..., x_n)` (attributes `axis`, `x_scales`, `x_zero_points`,
  `y_scale`, `y_zero_point`, `dtype`), onnxruntime's QLinearConcat: the concat of the
  inputs, each one whose scale, zero point and type are not the output's requantized,
  `saturate(round_half_even(float32(x - x_zp) * x_scale / y_scale) + y_zp)` (its table
  of 256 values holds exactly these), the others copied.

The operands of qlinear_add and qlinear_mul broadcast like numpy; `a`, `b` and `y_zp`
are all int8 or all uint8, the scales float32 scalars and the zero points scalars of
their tensor's type. With `as_uint8` (int8 operands only), the formula runs on the
uint8 values onnxruntime computes with after its QDQS8ToU8Transformer has shifted an
int8 group to uint8 (kiln.ops.quant_ort): every operand and zero point + 128, the
result saturated to [0, 255], then - 128. The float32 steps round differently from
the int8 formula's, so the two are different ops.

`qlinear_add` of two operands of the output's static shape and `qlinear_concat` run on
hand-built kernels (kiln.kernels.int8.elementwise) computing these formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import Cast, PrimExpr, as_expr, intrin, min_
from kiln.ir.types import TensorType, Type
from kiln.ops import get_op, te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.nan_order import max_keep_second
from kiln.ops.quant import PRODUCT_DTYPES, as_float32, qrange, quantize_ref, quantize_value
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
ADD = "qlinear_add"
MUL = "qlinear_mul"


def swaps_operands(a_shape: Sequence[Any], b_shape: Sequence[Any]) -> bool:
    """Whether onnxruntime's QLinearAdd computes `a` in the role of `b`: its broadcasting
    loop calls MLAS on spans of the output's innermost axis of extent > 1 and passes an
    operand that is constant along that axis second; `a` is when its extent there is 1
    and `b`'s is not (or when every output extent is 1)."""
    out = broadcast_shapes(a_shape, b_shape)
    for k in range(len(out) - 1, -1, -1):
        if isinstance(out[k], int) and out[k] == 1:
            continue
        return _dim_at(a_shape, k, len(out)) == 1 and _dim_at(b_shape, k, len(out)) != 1
    return True


def _dim_at(shape: Sequence[Any], k: int, rank: int) -> Any:
    pos = k - (rank - len(shape))
    return shape[pos] if pos >= 0 else 1


#: What `as_uint8` adds to an int8 value: onnxruntime's shift of int8 to uint8.
UINT8_SHIFT = 128


def uint8_shift(attrs: Attrs) -> int:
    """The shift of the `as_uint8` attribute: 128 when set, else 0."""
    return UINT8_SHIFT if attrs.get("as_uint8") else 0


def _check(what: str, types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = types
    if a.dtype not in PRODUCT_DTYPES or {b.dtype, y_zp.dtype} != {a.dtype}:
        raise IRError(f"{what}: A, B and the output zero point must all be int8 or all "
                      f"uint8, got {a.dtype}, {b.dtype} and {y_zp.dtype}")
    if attrs.get("as_uint8") and a.dtype != "int8":
        raise IRError(f"{what}: as_uint8 computes int8 operands as onnxruntime's uint8 "
                      f"kernel does; the operands are {a.dtype}")
    for name, scale, zp, like in (("A", a_scale, a_zp, a), ("B", b_scale, b_zp, b),
                                  ("the output", y_scale, y_zp, y_zp)):
        if scale.dtype != "float32" or scale.ndim or zp.ndim or zp.dtype != like.dtype:
            raise IRError(f"{what}: the scale and zero point of {name} must be a float32 "
                          f"scalar and a {like.dtype} scalar, got {scale.dtype} "
                          f"{shape_text(scale.shape)} and {zp.dtype} {shape_text(zp.shape)}")
    return TensorType(broadcast_shapes(a.shape, b.shape), y_zp.dtype)


def _infer(what: str) -> Callable[[Sequence[TensorType], Attrs], Type]:
    return lambda types, attrs: _check(what, types, attrs)


def _saturate(v: PrimExpr, dtype: str, shift: int = 0) -> PrimExpr:
    """`saturate(round_half_even(v) - shift)` of float32 `v` in `dtype` (`shift`: 128 for
    a value computed in uint8 and stored as int8, `as_uint8`). A NaN (a scale given at run
    time) gives the type's minimum, as MLAS's conversion and saturating packs do; the
    lower clamp is one `vmaxps`, the upper one a `vminps`."""
    lo, hi = qrange(dtype)
    rounded = intrin("round", v)
    if shift:
        rounded = rounded - float(shift)
    return Cast(dtype, min_(as_expr(float(hi), "float32"),
                            max_keep_second(rounded, as_expr(float(lo), "float32"))))


def _elementwise(inputs: Sequence[te.Tensor], name: str,
                 value: Callable[[PrimExpr, PrimExpr, Sequence[PrimExpr]], PrimExpr],
                 shift: int = 0) -> te.Tensor:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    shape = broadcast_shapes(a.shape, b.shape)

    def element(*i: PrimExpr) -> PrimExpr:
        params = [t[()] for t in (a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)]
        av, bv = a[broadcast_index(i, a.shape)], b[broadcast_index(i, b.shape)]
        return _saturate(value(av, bv, params), y_zp.dtype, shift)

    return te.compute(te.dims(shape), element, y_zp.dtype, name)


# --------------------------------------------------------------------------- qlinear_add

def shifted(v: PrimExpr, shift: int) -> PrimExpr:
    """`v` as float32, plus `shift` (exact: an 8-bit value plus 128)."""
    return as_float32(v) + float(shift) if shift else as_float32(v)


def add_value(swap: bool, shift: int = 0
              ) -> Callable[[PrimExpr, PrimExpr, Sequence[PrimExpr]], PrimExpr]:
    """MLAS's QLinearAdd of one element (the module docstring), before saturation; the
    operands and zero points + `shift` (`as_uint8`)."""

    def value(av: PrimExpr, bv: PrimExpr, params: Sequence[PrimExpr]) -> PrimExpr:
        span, other = (bv, av) if swap else (av, bv)
        return add_combine(shifted(span, shift), shifted(other, shift),
                           add_coefficients(params, swap, shift))

    return value


def add_coefficients(params: Sequence[PrimExpr], swap: bool, shift: int = 0
                     ) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
    """MLAS's QLinearAdd coefficients `(rs, ro, fixed)` of the span operand, the other
    one and the constant term (the module docstring), from the scalars `params` (a_scale,
    a_zp, b_scale, b_zp, y_scale, y_zp); `swap`: `b` is the span."""
    sa, za, sb, zb, sy, zy = params
    span_scale, span_zp, other_scale, other_zp = (sb, zb, sa, za) if swap else (sa, za, sb, zb)
    rs, ro = span_scale / sy, other_scale / sy
    fixed = shifted(zy, shift) - intrin("fma", rs, shifted(span_zp, shift),
                                         ro * shifted(other_zp, shift))
    return rs, ro, fixed


def add_combine(span: PrimExpr, other: PrimExpr, coefficients: Sequence[PrimExpr]
                ) -> PrimExpr:
    """QLinearAdd of one span and one other element (float32, `shifted`) by
    `add_coefficients`' `(rs, ro, fixed)`, before saturation."""
    rs, ro, fixed = coefficients
    return intrin("fma", span, rs, intrin("fma", other, ro, fixed))


def add_tensors(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression definition of `qlinear_add` (also the residual add fused into
    a dot-form convolution, kiln.ops.quant_conv_words)."""
    shift = uint8_shift(attrs)
    return _elementwise(inputs, ADD, add_value(swaps_operands(inputs[0].shape,
                                                              inputs[3].shape), shift), shift)


def fma_f32(a: Any, b: Any, c: Any) -> np.ndarray:
    """float32 `a * b + c` rounded once (IEEE fusedMultiplyAdd), elementwise in numpy.

    The product of two float32 values is exact in float64; the float64 sum's error is
    recovered exactly (TwoSum), and when the float64 sum lies exactly halfway between two
    float32 values the error says which way the exact sum rounds."""
    a, b, c = (np.asarray(x, np.float32).astype(np.float64) for x in (a, b, c))
    p = a * b
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))
    r = s.astype(np.float32)
    other = np.nextafter(r, np.where(s > r, np.float32(np.inf), np.float32(-np.inf)))
    tie = (r.astype(np.float64) + other.astype(np.float64) == 2 * s) & (err != 0)
    nudged = np.where(err > 0, np.nextafter(s, np.inf), np.nextafter(s, -np.inf))
    return np.where(tie, nudged.astype(np.float32), r).astype(np.float32)


def _saturate_ref(v: np.ndarray, zp: np.ndarray, shift: int = 0) -> np.ndarray:
    lo, hi = qrange(dt.from_numpy(zp.dtype))
    q = np.rint(v) - shift
    return np.clip(np.where(np.isnan(q), lo, q), lo, hi).astype(zp.dtype)


def _params(*xs: np.ndarray) -> list[np.float32]:
    return [np.float32(np.asarray(x).reshape(())) for x in xs]


def qlinear_add_ref(a: np.ndarray, a_scale: np.ndarray, a_zp: np.ndarray, b: np.ndarray,
                    b_scale: np.ndarray, b_zp: np.ndarray, y_scale: np.ndarray,
                    y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy QLinearAdd as MLAS computes it (the module docstring)."""
    shift = uint8_shift(attrs)
    sa, za, sb, zb, sy, zy = _params(a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)
    za, zb, zy = (np.float32(z + shift) for z in (za, zb, zy))
    af, bf = np.broadcast_arrays(a.astype(np.float32) + np.float32(shift),
                                 b.astype(np.float32) + np.float32(shift))
    span, ss, zs, other, so, zo = (bf, sb, zb, af, sa, za) \
        if swaps_operands(a.shape, b.shape) else (af, sa, za, bf, sb, zb)
    with np.errstate(all="ignore"):
        rs, ro = np.float32(ss / sy), np.float32(so / sy)
        fixed = np.float32(zy - fma_f32(rs, zs, np.float32(ro * zo)))
        v = fma_f32(span, rs, fma_f32(other, ro, fixed))
    return _saturate_ref(v, np.asarray(y_zp), shift)


# "injective": a kernel of its own (it may head a fused elementwise chain), never a tail
# fused into the integer convolution before it, whose hand-built tiles would then lose
# their vectorized epilogue (and run far slower).
register_op(ADD, pattern="injective", infer=_infer(ADD), compute=add_tensors,
            reference=qlinear_add_ref)


# --------------------------------------------------------------------------- qlinear_mul

def _mul_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    shift = uint8_shift(attrs)

    def value(av: PrimExpr, bv: PrimExpr, params: Sequence[PrimExpr]) -> PrimExpr:
        sa, za, sb, zb, sy, zy = params
        da = Cast("int32", av) - Cast("int32", za)
        db = Cast("int32", bv) - Cast("int32", zb)
        return Cast("float32", da * db) * (sa * sb / sy) + shifted(zy, shift)

    return _elementwise(inputs, MUL, value, shift)


def qlinear_mul_ref(a: np.ndarray, a_scale: np.ndarray, a_zp: np.ndarray, b: np.ndarray,
                    b_scale: np.ndarray, b_zp: np.ndarray, y_scale: np.ndarray,
                    y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy QLinearMul as MLAS computes it (the module docstring)."""
    shift = uint8_shift(attrs)
    sa, _, sb, _, sy, zy = _params(a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)
    da = a.astype(np.int32) - np.int32(np.asarray(a_zp))
    db = b.astype(np.int32) - np.int32(np.asarray(b_zp))
    with np.errstate(all="ignore"):
        ratio = np.float32(np.float32(sa * sb) / sy)
        v = ((da * db).astype(np.float32) * ratio + np.float32(zy + shift)).astype(np.float32)
    return _saturate_ref(v, np.asarray(y_zp), shift)


register_op(MUL, pattern="injective", infer=_infer(MUL), compute=_mul_compute,
            reference=qlinear_mul_ref)


# --------------------------------------------------------------------------- qlinear_concat

CONCAT = "qlinear_concat"


def concat_params(n: int, attrs: Attrs) -> tuple[list[float], list[int], float, int, str]:
    """(x_scales, x_zero_points, y_scale, y_zero_point, dtype) of a qlinear_concat of `n`
    inputs, checked."""
    scales = [float(s) for s in attrs["x_scales"]]
    zps = [int(z) for z in attrs["x_zero_points"]]
    dtype = str(attrs["dtype"])
    if len(scales) != n or len(zps) != n:
        raise IRError(f"{CONCAT}: {n} inputs need {n} scales and zero points, got "
                      f"{len(scales)} and {len(zps)}")
    if dtype not in PRODUCT_DTYPES:
        raise IRError(f"{CONCAT}: the output must be one of {', '.join(PRODUCT_DTYPES)}, "
                      f"not {dtype}")
    return scales, zps, float(attrs["y_scale"]), int(attrs["y_zero_point"]), dtype


def copies_input(t: Any, scale: float, zp: int, y_scale: float, y_zp: int,
                 dtype: str) -> bool:
    """Whether an input is its own requantization: quantize(dequantize(v)) = v for one
    positive scale, zero point and type."""
    return t.dtype == dtype and scale == y_scale and zp == y_zp and scale > 0


def _concat_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    _, zps, _, y_zp, dtype = concat_params(len(types), attrs)
    for t, z in zip(types, zps):
        if t.dtype not in PRODUCT_DTYPES:
            raise IRError(f"{CONCAT}: the inputs must be int8 or uint8, got {t.dtype}")
        lo, hi = qrange(t.dtype)
        if not lo <= z <= hi:
            raise IRError(f"{CONCAT}: zero point {z} is out of {t.dtype}'s range")
    lo, hi = qrange(dtype)
    if not lo <= y_zp <= hi:
        raise IRError(f"{CONCAT}: output zero point {y_zp} is out of {dtype}'s range")
    return get_op("concat").infer([TensorType(t.shape, dtype) for t in types],
                                  {"axis": attrs.get("axis", 0)})


def requantize_element(v: PrimExpr, scale: float, zp: int, y_scale: float, y_zp: int,
                       dtype: str) -> PrimExpr:
    """`v` (an integer element) requantized: quantize(dequantize(v)) in float32."""

    lo, hi = qrange(dtype)
    f = Cast("float32", Cast("int32", v) - zp) * as_expr(scale, "float32")
    return quantize_value(f, as_expr(y_scale, "float32"), as_expr(y_zp, "int32"), lo, hi,
                          dtype)


def _concat_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    scales, zps, y_scale, y_zp, dtype = concat_params(len(inputs), attrs)
    parts = []
    for x, s, z in zip(inputs, scales, zps):
        if copies_input(x, s, z, y_scale, y_zp, dtype):
            parts.append(x)
            continue

        def element(*i: PrimExpr, x: te.Tensor = x, s: float = s, z: int = z) -> PrimExpr:
            return requantize_element(x[i], s, z, y_scale, y_zp, dtype)

        parts.append(te.compute(tuple(x.shape), element, dtype, "requantize"))
    out = get_op("concat").compute(parts, {"axis": attrs.get("axis", 0)})
    assert isinstance(out, te.Tensor)
    return out


def qlinear_concat_ref(*xs: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy QLinearConcat: every input requantized, quantize(dequantize(x)) in float32
    (an input with the output's parameters is then itself)."""

    scales, zps, y_scale, y_zp, dtype = concat_params(len(xs), attrs)
    yz = np.asarray(y_zp, dtype)
    with np.errstate(all="ignore"):
        parts = [quantize_ref(((x.astype(np.int32) - z).astype(np.float32)
                               * np.float32(s)), np.asarray(y_scale, np.float32), yz)
                 for x, s, z in zip(xs, scales, zps)]
    return np.concatenate(parts, axis=int(attrs.get("axis", 0)))


# "opaque": a kernel of its own; a dequantization after it (DenseNet's concat -> DQ ->
# BatchNorm -> Q) starts the next kernel, rather than joining the te definition, whose
# per-element select over the inputs requantizes every one of them (32 in DenseNet)
register_op(CONCAT, pattern="opaque", infer=_concat_infer, compute=_concat_compute,
            reference=qlinear_concat_ref)
