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
place, copied it twice). start[b] is taken clamped to [0, P] (the caller keeps it there),
so every read stays in bounds.

In place: when the result is the past's own buffer (the same address and the same length
L = P, onnxruntime's shared buffer: kiln.ir.same_address, asked once per call) only the
new rows are written. The kept rows are there already, and the rows after the new ones
keep what the buffer held (no zeros: the attention masks them out, as onnxruntime's does).
The compiled function declares that overlap (the present's `in_place_of`, docs/abi.md)
and the runtime allows it and no other.

The kernel is hand-built: per (batch row, head), three loops over the cache rows (the
past's, the new ones, the zeros), each a contiguous copy that vectorizes. A te
definition would pick each element's source with a `select` on a boundary read from
`start`, which kiln.transform.partition_loops cannot split a loop at (it ran 4x slower
than the concat it replaced: docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_EXTERN_READS, ATTR_IN_PLACE
from kiln.ir.same_address import same_address
from kiln.ir.shape_expr import dims_equal, shape_text
from kiln.ir.tensor import PrimExpr, as_expr, max_, min_
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import OPS, OpDef

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
    raise IRError("operator cache_rows is lowered by its own kernel, not a te definition")


def _cache_rows_ref(past: np.ndarray, new: np.ndarray, start: np.ndarray,
                    positions: np.ndarray, **attrs: Any) -> np.ndarray:
    batch, heads, _, head = past.shape
    out = np.zeros((batch, heads, positions.shape[0], head), past.dtype)
    for b, s in enumerate(np.clip(start, 0, past.shape[2]).tolist()):
        out[b, :, :s] = past[b, :, :s]
        end = min(out.shape[2], s + new.shape[2])
        out[b, :, s:end] = new[b, :, :end - s]
    return out


def _cache_rows_kernel(past: t.Buffer, new: t.Buffer, start: t.Buffer, out: t.Buffer
                       ) -> t.Stmt:
    """Per batch row b and head h: out rows [0, keep) from the past, [keep, end) from
    the new rows, [end, L) zero, with keep = min(start[b], L) and end = min(start[b] +
    S, L)."""
    batch, heads, length, head = (as_expr(d, "int64") for d in out.shape)
    rows, steps = as_expr(past.shape[2], "int64"), as_expr(new.shape[2], "int64")
    b, h = t.Var("b", "int64"), t.Var("h", "int64")
    s, keep, end = (t.Var(n, "int64") for n in ("s", "keep", "end"))

    def rows_loop(lo: PrimExpr, hi: PrimExpr,
                  value: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> t.Stmt:
        r, d = t.Var("t", "int64"), t.Var("d", "int64")
        store = t.Store(out, value(r, d), (b, h, r, d))
        return t.For(r, lo, max_(hi - lo, 0), "serial",
                     t.For(d, as_expr(0, "int64"), head, "serial", store))

    # 1 when `out` is the past's own buffer at the past's length: its rows are in place
    shared = t.Var("shared", "int32")
    copied = t.compare("eq", shared, as_expr(0, "int32"))
    per_head = t.seq(
        t.IfThenElse(copied, rows_loop(as_expr(0, "int64"), keep,
                                       lambda r, d: past[(b, h, r, d)])),
        rows_loop(keep, end, lambda r, d: new[(b, h, r - s, d)]),
        t.IfThenElse(copied, rows_loop(end, length, lambda r, d: as_expr(0, out.dtype))))
    return t.seq(
        t.LetStmt(shared, t.select(t.compare("eq", rows, length), same_address(past, out),
                                   as_expr(0, "int32"))),
        t.For(b, as_expr(0, "int64"), batch, "serial", t.seq(
            t.LetStmt(s, min_(max_(start[(b,)], 0), rows)),
            t.LetStmt(keep, min_(s, length)),
            t.LetStmt(end, min_(s + steps, length)),
            t.For(h, as_expr(0, "int64"), heads, "serial", per_head))))


@dataclass(frozen=True)
class CacheRowsOp(OpDef):
    """`cache_rows`, lowered by its hand-built kernel (`_cache_rows_kernel`)."""

    def legalize(self, call: g.Call) -> tuple[t.PrimFunc, str]:
        types = [a.type for a in call.args]
        assert all(isinstance(ty, TensorType) for ty in types)
        past, new, start, positions = (t.Buffer(f"x{k}", ty.shape, ty.dtype)
                                       for k, ty in enumerate(types)
                                       if isinstance(ty, TensorType))
        result = call.type
        assert isinstance(result, TensorType)
        out = t.Buffer("out", result.shape, result.dtype)
        body = _cache_rows_kernel(past, new, start, out)
        # the address comparison reads no data; the output may be the past's buffer
        attrs = {ATTR_EXTERN_READS: (past.name,), ATTR_IN_PLACE: (0, 4)}
        return te.with_dim_params(t.PrimFunc((past, new, start, positions, out), body,
                                             attrs)), self.name


OPS.register("cache_rows", CacheRowsOp("cache_rows", "opaque", _cache_rows_infer,
                                       _cache_rows_compute, _cache_rows_ref))
