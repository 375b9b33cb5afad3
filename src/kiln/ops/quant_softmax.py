"""Integer softmax of quantized models, as onnxruntime computes it (docs/quantization.md,
"The pass" and "QLinearSoftmax as onnxruntime 1.32 computes it").

onnxruntime runs `DequantizeLinear -> Softmax -> QuantizeLinear` as its QLinearSoftmax:
an exp table looked up by the byte and a division by the row's sum, not the float
softmax. `qlinear_softmax(x, table, y_zp)` (uint8 or int8 `x` and `y_zp`, softmax over
the last axis, attribute `y_multiplier`) computes that:

- `table[i] = float32(exp((i - 255 + b) * x_scale))` in float64 for i in 0..255, where
  `b = max(0, logf(FLT_MAX / D) - 5) / x_scale` (D the row length, `FLT_MAX / D` and
  its log in float32) lifts the largest entry near `FLT_MAX / (D e^5)`, so a row's sum
  stays finite (`softmax_table`, compile time);
- per row, `t = table[x + 255 - max(x)]` (the same index for int8: only the difference
  to the row's maximum counts), `s` their float32 sum in row order;
- `y = clamp(rint(t * y_multiplier / s) + y_zp)` to the byte's range, the quotient in
  float64 (rounded half to even), where `y_multiplier = floor(1.0f / y_scale)` (float32).

This is onnxruntime's result byte for byte (every byte, constant and saturating rows,
int8 and uint8, every output zero point: tests/quantization); a sum of the table's
float32 values in any other order, or the quotient in float32 (`t * (1/s) *
y_multiplier`, as MLAS's vector kernels write it), differs on constant rows, and an
integer table (uint32 values, an integer division) would overflow its sum on long rows
near their maximum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import Cast, PrimExpr, as_expr, intrin, max_, min_
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.quant import qrange
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
SOFTMAX = "qlinear_softmax"
BYTES = ("uint8", "int8")
#: 1 / y_scale above this is refused: its products lose the float64 quotient's exactness.
MAX_MULTIPLIER = 2 ** 24


def softmax_table(x_scale: float, row: int) -> np.ndarray:
    """The 256 float32 exp values of onnxruntime's QLinearSoftmax for rows of `row`,
    indexed by `x - max(x) + 255`."""
    ratio = np.float32(np.finfo(np.float32).max) / np.float32(row)
    log_ratio = float(np.float32(math.log(float(ratio))))  # logf, correctly rounded
    xs = float(np.float32(x_scale))
    shift = max(0.0, log_ratio - 5.0) / xs
    return np.array([math.exp((i - 255 + shift) * xs) for i in range(256)], np.float32)


def softmax_multiplier(y_scale: float) -> int:
    """`floor(1.0f / y_scale)`: onnxruntime's output multiplier (an integer)."""
    return math.floor(float(np.float32(1.0) / np.float32(y_scale)))


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, table, y_zp = types
    if x.dtype not in BYTES or y_zp.dtype != x.dtype or y_zp.ndim or x.ndim < 1:
        raise IRError(f"{SOFTMAX}: x and the output zero point must be uint8 or int8, the "
                      f"same type (a scalar zero point), got {x.dtype} "
                      f"{shape_text(x.shape)} and {y_zp.dtype}")
    if table.dtype != "float32" or tuple(table.shape) != (256,):
        raise IRError(f"{SOFTMAX}: the table must be float32 of shape (256,), got "
                      f"{table.dtype} {shape_text(table.shape)}")
    if not isinstance(x.shape[-1], int):
        raise IRError(f"{SOFTMAX}: the row length must be static, got {shape_text(x.shape)}")
    if not 0 <= int(attrs.get("y_multiplier", -1)) <= MAX_MULTIPLIER:
        raise IRError(f"{SOFTMAX}: y_multiplier must be in [0, {MAX_MULTIPLIER}], got "
                      f"{attrs.get('y_multiplier')}")
    return TensorType(x.shape, x.dtype)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, table, y_zp = inputs
    row = int(x.shape[-1])
    rows = tuple(x.shape[:-1])
    lo, hi = qrange(x.dtype)

    def at(r: Sequence[PrimExpr], k: PrimExpr, top: PrimExpr) -> PrimExpr:
        return table[(Cast("int32", x[(*r, k)]) + (255 - top),)]

    top = te.compute(rows, lambda *r: te.reduce("max", lambda k: Cast("int32", x[(*r, k)]),
                                                 (row,), "int32"), "int32", "row_max",
                     materialize=True)
    # a serial loop in row order: onnxruntime's sum, rounded step by step the same way
    total = te.compute(rows, lambda *r: te.reduce("sum", lambda k: at(r, k, top[r]), (row,),
                                                  "float32"), "float32", "row_sum",
                       materialize=True)
    multiplier = as_expr(float(int(attrs["y_multiplier"])), "float64")

    def element(*i: PrimExpr) -> PrimExpr:
        r, k = i[:-1], i[-1]
        # t * multiplier is exact in float64 (24 by 25 bits): one rounding, the quotient's
        q = Cast("float64", at(r, k, top[r])) * multiplier / Cast("float64", total[r])
        v = Cast("int32", intrin("round", min_(q, as_expr(float(hi - lo), "float64"))))
        return Cast(x.dtype, max_(min_(v + Cast("int32", y_zp[()]), as_expr(hi, "int32")),
                                  as_expr(lo, "int32")))

    return te.compute(x.shape, element, x.dtype, SOFTMAX)


def _reference(x: np.ndarray, table: np.ndarray, y_zp: np.ndarray, **attrs: Any
               ) -> np.ndarray:
    xi = x.astype(np.int64)
    t = table[xi + 255 - xi.max(axis=-1, keepdims=True)]
    total = np.zeros((*t.shape[:-1], 1), np.float32)
    for k in range(t.shape[-1]):  # in row order, as onnxruntime adds
        total = (total + t[..., k:k + 1]).astype(np.float32)
    q = t.astype(np.float64) * float(attrs["y_multiplier"]) / total.astype(np.float64)
    lo, hi = qrange(str(x.dtype))
    v = np.rint(np.minimum(q, hi - lo)).astype(np.int64) + int(np.asarray(y_zp))
    return np.clip(v, lo, hi).astype(x.dtype)


register_op(SOFTMAX, pattern="opaque", infer=_infer, compute=_compute, reference=_reference)
