"""Integer softmax of quantized models, as onnxruntime computes it (docs/quantization.md,
"The pass").

onnxruntime runs `DequantizeLinear -> Softmax -> QuantizeLinear` as its QLinearSoftmax:
an exp table of 32-bit integers and an integer division, not the float softmax.
`qlinear_softmax(x, table, y_zp)` (uint8 `x`, softmax over the last axis, attribute
`y_multiplier`) computes that:

- `table[i] = lrint(q * exp((i - 255) * x_scale))` in float64 for i in 0..255, with
  `q = min((2**32 - 1) / D, 0x7fffff)` and D the row length (`softmax_table`, compile
  time);
- per row, `t = table[x + 255 - max(x)]`, `s = sum(t)` (uint32);
- `y = min((t * y_multiplier + s // 2) // s + y_zp, 255)` in uint32 arithmetic, where
  `y_multiplier = uint32(1.0f / y_scale)` (float32 division, truncated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import Cast, PrimExpr, as_expr, min_
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
SOFTMAX = "qlinear_softmax"


def softmax_table(x_scale: float, row: int) -> np.ndarray:
    """The 256 uint32 exp values of onnxruntime's QLinearSoftmax for rows of `row`."""
    q = min(float(2 ** 32 - 1) / row, float(0x7FFFFF))
    i = np.arange(256, dtype=np.float64)
    return np.rint(q * np.exp((i - 255) * float(np.float32(x_scale)))).astype(np.uint32)


def softmax_multiplier(y_scale: float) -> int:
    """`uint32(1.0f / y_scale)`: onnxruntime's integer output scale."""
    return int(np.float32(1.0) / np.float32(y_scale))


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, table, y_zp = types
    if x.dtype != "uint8" or y_zp.dtype != "uint8" or y_zp.ndim or x.ndim < 1:
        raise IRError(f"{SOFTMAX}: x and the output zero point must be uint8 (a scalar zero "
                      f"point), got {x.dtype} {shape_text(x.shape)} and {y_zp.dtype}")
    if table.dtype != "uint32" or tuple(table.shape) != (256,):
        raise IRError(f"{SOFTMAX}: the table must be uint32 of shape (256,), got "
                      f"{table.dtype} {shape_text(table.shape)}")
    if not isinstance(x.shape[-1], int):
        raise IRError(f"{SOFTMAX}: the row length must be static, got {shape_text(x.shape)}")
    if not 0 < int(attrs.get("y_multiplier", 0)) < 2 ** 32:
        raise IRError(f"{SOFTMAX}: y_multiplier must be in [1, 2**32), got "
                      f"{attrs.get('y_multiplier')}")
    return TensorType(x.shape, "uint8")


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, table, y_zp = inputs
    row = int(x.shape[-1])
    rows = tuple(x.shape[:-1])

    def at(r: Sequence[PrimExpr], k: PrimExpr, top: PrimExpr) -> PrimExpr:
        index = Cast("int32", x[(*r, k)]) + (255 - top)
        return table[(index,)]

    top = te.compute(rows, lambda *r: te.reduce("max", lambda k: Cast("int32", x[(*r, k)]),
                                                 (row,), "int32"), "int32", "row_max",
                     materialize=True)
    total = te.compute(rows, lambda *r: te.reduce("sum", lambda k: at(r, k, top[r]), (row,),
                                                  "uint32"), "uint32", "row_sum",
                       materialize=True)
    multiplier = as_expr(int(attrs["y_multiplier"]), "uint32")

    def element(*i: PrimExpr) -> PrimExpr:
        r, k = i[:-1], i[-1]
        s = total[r]
        q = (at(r, k, top[r]) * multiplier + s // as_expr(2, "uint32")) // s \
            + Cast("uint32", y_zp[()])
        return Cast("uint8", min_(q, as_expr(255, "uint32")))

    return te.compute(x.shape, element, "uint8", SOFTMAX)


def _reference(x: np.ndarray, table: np.ndarray, y_zp: np.ndarray, **attrs: Any
               ) -> np.ndarray:
    mask = np.uint64(0xFFFFFFFF)
    t = table.astype(np.uint64)[x.astype(np.int64) + 255 - x.max(axis=-1, keepdims=True)]
    s = t.sum(axis=-1, keepdims=True) & mask
    q = ((t * np.uint64(attrs["y_multiplier"])) & mask) + s // np.uint64(2)
    q = ((q & mask) // s + np.uint64(np.asarray(y_zp))) & mask
    return np.minimum(q, 255).astype(np.uint8)


register_op(SOFTMAX, pattern="opaque", infer=_infer, compute=_compute, reference=_reference)
