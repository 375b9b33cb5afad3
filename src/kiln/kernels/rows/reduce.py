"""Reductions over trailing axes by hand (reduce_sum/mean/max/..., the global pools):
one pass over each row (a contiguous block per output element), `lanes` partial
results combined at the end (a single accumulator would be a serial chain the backend
cannot vectorize). What each op combines is its kiln.ops.reduce `Reduction`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Buffer,
    Cast,
    DeclBuffer,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import SubstituteLoad
from kiln.kernels.rows.loops import F32, Reader, RowLoops, Rows, add, let, row_kernel_attrs
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import tile_lanes
from kiln.ops import nan_order, te
from kiln.ops.reduce import Reduction, reduction_of
from kiln.ops.registry import Attrs, get_op
from kiln.target.isa import ISA

_COMBINE: dict[str, Callable[[PrimExpr, PrimExpr], PrimExpr]] = {
    "sum": add, "prod": lambda a, b: a * b, "max": max_, "min": min_,
    "scan_max": nan_order.max_keep_first, "scan_min": nan_order.min_keep_first}


def _identity(kind: str) -> PrimExpr:
    if kind in ("max", "scan_max"):
        return te.lowest_value(F32)
    if kind in ("min", "scan_min"):
        return te.highest_value(F32)
    return as_expr(1.0 if kind == "prod" else 0.0, F32)


def reduce_row(loops: RowLoops, read: Reader, kind: str,
               pre: Callable[[PrimExpr], PrimExpr] | None) -> tuple[list[Stmt], PrimExpr]:
    """Statements reducing one row with `kind` over `pre(read(j))`, and the total."""
    combine = _COMBINE[kind]
    acc, init = loops.accumulators("partial", _identity(kind))

    def step(j: PrimExpr, lane: PrimExpr) -> Stmt:
        v = read(j)
        return Store(acc, combine(acc[lane], pre(v) if pre else v), (lane,))

    total_value = loops.combined(acc, combine)
    if kind in ("scan_max", "scan_min"):
        # the lanes skip every NaN; onnxruntime's scan keeps a leading one
        total_value = nan_order.with_leading_nan(read(_c(0)), total_value)
    total, let_total = let("total", total_value)
    return [*init, loops.each(step), let_total], total


@dataclass(frozen=True)
class RowReduceLowering:
    """The kernel of the reduction op `op` when its axes are the trailing ones (a
    contiguous block per output element): its `Reduction`'s `kind` combines `pre(x)`
    over the block, then `post(total, count)`."""

    op: str

    fuses_producers = True
    #: Symbolic row counts and reduced extents are loop extents (static vector chunks).
    supports_symbolic = True

    @property
    def reduction(self) -> Reduction:
        """What `op` combines over its reduced axes (kiln.ops.reduce)."""
        return reduction_of(self.op)

    def _trailing_axes(self, shape: Sequence[Any], attrs: Attrs) -> bool:
        axes = self.reduction.axes_of(attrs, len(shape))
        return bool(axes) and axes == tuple(range(len(shape) - len(axes), len(shape)))

    def builds(self, call: g.Call) -> bool:
        t = call.args[0].type if call.args else None
        return (isinstance(t, TensorType) and t.dtype == F32 and 0 not in t.shape
                and self._trailing_axes(t.shape, call.attrs))

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        x = args[0]
        out_t = result if result is not None else anchor
        reduction = self.reduction
        axes = reduction.axes_of(attrs, x.ndim)
        if x.dtype != F32 or (out_t is not None and out_t.dtype != F32) or not axes or \
                axes != tuple(range(x.ndim - len(axes), x.ndim)) or 0 in x.shape:
            return None
        inner = x.shape[x.ndim - len(axes):]
        outer = x.shape[:x.ndim - len(axes)]
        reduced = get_op(self.op).infer([TensorType(x.shape, x.dtype)], attrs)
        assert isinstance(reduced, TensorType)
        out_shape = tuple(reduced.shape)
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        # A row over several static trailing dims of a parameter is read through a view
        # of it with those dims merged: consecutive elements, one vector load per chunk
        # (the unflattened index's divisions made every chunk a gather).
        flat = (Buffer(x.name + "_rows", (*outer, dim_product(inner)), x.dtype)
                if x in buffers and len(inner) > 1 and all(isinstance(d, int) for d in inner)
                else None)
        out = Buffer("out", out_shape, F32)
        value_buf = Buffer("row_value", out_shape, F32)
        mapping = dict(buffers)
        if anchor is not None:
            mapping[anchor] = value_buf
        zero = (_c(0),) * x.ndim
        try:
            te.inline_expr(x, zero, buffers)
            if result is not None:
                te.inline_expr(result, (_c(0),) * len(out_shape), mapping)
        except IRError:
            return None
        count = dim_product(inner)  # an expression of the dim scalars when symbolic

        def row(o: tuple[PrimExpr, ...]) -> Stmt:
            # the output keeps the row dims, then 1s for the reduced ones with keepdims
            out_idx = (*o, *(_c(0),) * (len(out_shape) - len(o)))

            def read(j: PrimExpr) -> PrimExpr:
                if flat is not None:
                    return flat[(*o, j)]
                idx = (j,) if len(inner) == 1 else te.unflatten_index(j, inner)
                return te.inline_expr(x, (*o, *idx), buffers)

            lanes = tile_lanes(isa)
            loops = RowLoops(count, min(lanes, count) if isinstance(count, int) else lanes)
            stmts, total = reduce_row(loops, read, reduction.kind, reduction.pre)
            v = reduction.post(total, count) if reduction.post else total
            v = v if v.dtype == F32 else Cast(F32, v)
            if result is not None:
                v = SubstituteLoad(value_buf, v).visit_expr(
                    te.inline_expr(result, tuple(out_idx), mapping))
            return seq(*stmts, Store(out, v, out_idx))

        body = Rows(tuple(outer), count).around(row, isa=isa)
        if flat is not None:
            body = seq(DeclBuffer(flat, buffers[x], 0), body)
        return PrimFunc((*(buffers[t] for t in params), out), body,
                        row_kernel_attrs(self.op, tuple(outer)))


REDUCE_SUM = RowReduceLowering("reduce_sum")
REDUCE_MEAN = RowReduceLowering("reduce_mean")
REDUCE_MAX = RowReduceLowering("reduce_max")
REDUCE_MIN = RowReduceLowering("reduce_min")
REDUCE_PROD = RowReduceLowering("reduce_prod")
REDUCE_L1 = RowReduceLowering("reduce_l1")
REDUCE_L2 = RowReduceLowering("reduce_l2")
REDUCE_SUM_SQUARE = RowReduceLowering("reduce_sum_square")
REDUCE_LOG_SUM = RowReduceLowering("reduce_log_sum")
GLOBAL_AVG_POOL = RowReduceLowering("global_avg_pool")
GLOBAL_MAX_POOL = RowReduceLowering("global_max_pool")
