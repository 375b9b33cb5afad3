"""`cache_rows(past, new, start, positions)`: a key/value cache after one step, written
in one pass from the past and the step's new rows (GroupQueryAttention's present,
kiln/frontend/onnx/converters/contrib_attention.py).

Operands: `past` `[batch, heads, P, head]`, `new` `[batch, heads, S, head]` (the same
dtype, batch, heads and head size), `start` `[batch]` int64 (the past rows each batch
row keeps), `positions` `[L]` (only its length is read: the result's cache length).
Row t of batch row b of the result `[batch, heads, L, head]` is the past's row t for
t < start[b], the new row t - start[b] up to start[b] + S, and zero after: a padded
batch row (start[b] < P) keeps fewer past rows and the zeros fill its tail. When every
row keeps its whole past (start[b] = P, L = P + S) this is the concatenation of past
and new, so the step copies the past once (a concat, then a gather of its rows into
place, copied it twice). The caller keeps start[b] <= P (a row past it reads the past's
last row); every read stays in bounds whatever `start` holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.shape_expr import dims_equal, shape_text
from kiln.ir.tensor import PrimExpr, as_expr, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


def _cache_rows_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    past, new, start, positions = types
    shapes = f"{past.dtype}{shape_text(past.shape)} and {new.dtype}{shape_text(new.shape)}"
    if past.ndim != 4 or new.ndim != 4 or past.dtype != new.dtype:
        raise IRError(f"cache_rows: past and new rows {shapes}: both [batch, heads, rows, "
                      "head] of one dtype")
    for k in (0, 1, 3):
        if dims_equal(past.shape[k], new.shape[k]) is not True:
            raise IRError(f"cache_rows: past and new rows {shapes} differ on axis {k}")
    if start.shape != (past.shape[0],) or start.dtype != "int64":
        raise IRError(f"cache_rows: start {start.dtype}{shape_text(start.shape)}: int64 "
                      "[batch], one past length per batch row")
    if positions.ndim != 1:
        raise IRError(f"cache_rows: positions {shape_text(positions.shape)}: 1-D, the "
                      "cache's length")
    return TensorType((past.shape[0], past.shape[1], positions.shape[0], past.shape[3]),
                      past.dtype)


def _cache_rows_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    past, new, start, positions = inputs
    rows, steps = past.shape[2], new.shape[2]
    shape = (past.shape[0], past.shape[1], positions.shape[0], past.shape[3])

    def element(b: PrimExpr, h: PrimExpr, t: PrimExpr, d: PrimExpr) -> PrimExpr:
        s = start[(b,)]
        k = t - s  # the new row at position t
        from_past = past[(b, h, te.clamp_index(t, rows), d)]
        from_new = new[(b, h, te.clamp_index(k, steps), d)]
        return select(t < s, from_past, select(k < steps, from_new, as_expr(0, past.dtype)))

    return te.compute(shape, element, past.dtype, "cache_rows")


def _cache_rows_ref(past: np.ndarray, new: np.ndarray, start: np.ndarray,
                    positions: np.ndarray, **attrs: Any) -> np.ndarray:
    batch, heads, _, head = past.shape
    out = np.zeros((batch, heads, positions.shape[0], head), past.dtype)
    for b, s in enumerate(start.tolist()):
        out[b, :, :s] = past[b, :, :s]
        end = min(out.shape[2], s + new.shape[2])
        out[b, :, s:end] = new[b, :, :end - s]
    return out


register_op("cache_rows", pattern="injective", infer=_cache_rows_infer,
            compute=_cache_rows_compute, reference=_cache_rows_ref)
