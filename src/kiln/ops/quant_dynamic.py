"""Dynamically quantized matrix products with a float epilogue (docs/quantization.md).

`onnxruntime.quantization.quantize_dynamic` turns each float MatMul with a constant
weight into

    a_q, a_scale, a_zp = DynamicQuantizeLinear(a)
    y = float32(MatMulInteger(a_q, b_q, a_zp, b_zp)) * (a_scale * b_scale)  [+ bias]

(onnxruntime's optimizer then runs the chain as one MatMulIntegerToFloat kernel).
kiln.transform.quantize_ops fuses it into one op:

- `dynamic_quant_matmul(a, b, b_zp, b_scale, bias)`: a float32 `[..., K]`; b int8 or
  uint8 `[K][N]` with its zero point (a scalar or one per column); b_scale float32
  (a scalar or one per column); bias float32 `(N,)` (zeros when the model has none).
  A is quantized as DynamicQuantizeLinear does (one scale and uint8 zero point for the
  whole tensor), the int32 product is corrected for both zero points, and the output
  is `float32(acc) * (a_scale * b_scale) + bias`: the model's own float32 operations
  in its order (two roundings, no fused multiply-add).
- `dynamic_quant_matmul_packed(a, bp, colsum, b_scale, bias)` (attributes `n`,
  `k_group`): the same with B shifted by its zero point and stored in the panels of
  `matmul_integer_packed` (kiln.ops.quant_packed), `colsum` its column sums (its packer
  and kernel: kiln.kernels.int8.packing, kiln.kernels.int8.dynamic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.quant import as_float32, channel
from kiln.ops.quant_packed import INTEGER, build_integer
from kiln.ops.registry import get_op, register_op

Attrs = Mapping[str, Any]
DYNAMIC = "dynamic_quant_matmul"
PACKED = "dynamic_quant_matmul_packed"


def quantized_type(a: TensorType) -> TensorType:
    """The type of A quantized as DynamicQuantizeLinear quantizes it."""
    return TensorType(a.shape, "uint8")


def _check_epilogue(op: str, a: TensorType, n: int, b_scale: TensorType,
                    bias: TensorType) -> None:
    if a.dtype != "float32":
        raise IRError(f"{op}: A must be float32, got {a.dtype}")
    if b_scale.dtype != "float32" or tuple(b_scale.shape) not in ((), (n,)):
        raise IRError(f"{op}: B's scale must be float32 of shape () or ({n},), got "
                      f"{b_scale.dtype}{tuple(b_scale.shape)}")
    if bias.dtype != "float32" or tuple(bias.shape) != (n,):
        raise IRError(f"{op}: the bias must be float32 of shape ({n},), got "
                      f"{bias.dtype}{tuple(bias.shape)}")


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, b, b_zp, b_scale, bias = types
    if b.ndim != 2 or attrs.get("transpose_b"):
        raise IRError(f"{DYNAMIC}: B must be a 2-D [K][N] matrix, got {tuple(b.shape)}")
    out = get_op("matmul_integer").infer(
        [quantized_type(a), b, TensorType((), "uint8"), b_zp], {})
    assert isinstance(out, TensorType)
    _check_epilogue(DYNAMIC, a, int(b.static_shape[1]), b_scale, bias)
    return TensorType(out.shape, "float32")


def _packed_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, bp, colsum, b_scale, bias = types
    out = get_op(INTEGER).infer(
        [quantized_type(a), bp, colsum, TensorType((), "uint8")], attrs)
    assert isinstance(out, TensorType)
    _check_epilogue(PACKED, a, int(attrs["n"]), b_scale, bias)
    return TensorType(out.shape, "float32")


def _quantized(a: te.Tensor) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    """DynamicQuantizeLinear of `a` (its te definition): y (materialized), scale, zp."""
    y, scale, zp = get_op("dynamic_quantize_linear").compute([a], {})  # type: ignore[misc]
    return te.compute(y.shape, lambda *i: y[i], "uint8", "a_q", materialize=True), scale, zp


def _to_float(acc: te.Tensor, scale: te.Tensor, b_scale: te.Tensor, bias: te.Tensor,
              name: str) -> te.Tensor:
    def value(*i: PrimExpr) -> PrimExpr:
        return as_float32(acc[i]) * (scale[()] * channel(b_scale, i[-1])) + bias[i[-1]]

    return te.compute(acc.shape, value, "float32", name)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, b, b_zp, b_scale, bias = inputs
    y, scale, zp = _quantized(a)
    acc = get_op("matmul_integer").compute([y, b, zp, b_zp], {})
    assert isinstance(acc, te.Tensor)
    return _to_float(acc, scale, b_scale, bias, DYNAMIC)


def _packed_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, bp, colsum, b_scale, bias = inputs
    y, scale, zp = _quantized(a)
    acc = build_integer([y, bp, colsum, zp], attrs)
    return _to_float(acc, scale, b_scale, bias, PACKED)


def _float_ref(acc: np.ndarray, scale: np.ndarray, b_scale: np.ndarray,
               bias: np.ndarray) -> np.ndarray:
    multiplier = (np.float32(scale) * np.asarray(b_scale, np.float32)).astype(np.float32)
    return (acc.astype(np.float32) * multiplier).astype(np.float32) + bias.astype(np.float32)


def _ref(a: np.ndarray, b: np.ndarray, b_zp: np.ndarray, b_scale: np.ndarray,
         bias: np.ndarray, **attrs: Any) -> np.ndarray:
    y, scale, zp = get_op("dynamic_quantize_linear").reference(a)
    return _float_ref(get_op("matmul_integer").reference(y, b, zp, b_zp), scale, b_scale, bias)


def _packed_ref(a: np.ndarray, bp: np.ndarray, colsum: np.ndarray, b_scale: np.ndarray,
                bias: np.ndarray, **attrs: Any) -> np.ndarray:
    y, scale, zp = get_op("dynamic_quantize_linear").reference(a)
    acc = get_op(INTEGER).reference(y, bp, colsum, zp, **attrs)
    return _float_ref(acc, scale, b_scale, bias)


register_op(DYNAMIC, pattern="anchor", infer=_infer, compute=_compute, reference=_ref)
register_op(PACKED, pattern="anchor", infer=_packed_infer, compute=_packed_compute,
            reference=_packed_ref)
