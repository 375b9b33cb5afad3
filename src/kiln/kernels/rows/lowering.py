"""The lowerings of softmax, log_softmax and layer_norm over the last axis
(kiln.kernels.rows): each row's statistics held in stack accumulators, the row's
passes those of kiln.kernels.rows.softmax, .layer_norm and .layer_norm_onnxruntime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Buffer,
    For,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    intrin,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import SubstituteLoad
from kiln.kernels.rows.layer_norm import layer_norm_row, stat_loops
from kiln.kernels.rows.layer_norm_onnxruntime import (
    WELFORD_VECTORS,
    layer_norm_mlas_row,
    layer_norm_welford_rows,
    mlas_layer_norm,
)
from kiln.kernels.rows.loops import F32, RowLoops, Rows, row_index, row_kernel_attrs
from kiln.kernels.rows.softmax import softmax_row
from kiln.kernels.rows.welford_symbolic import symbolic_welford_groups
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import parallel_when, tile_lanes
from kiln.ops import te
from kiln.ops.reduce import MLAS_LAYER_NORM_MIN
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
_LOG_SOFTMAX, _LAYER_NORM = "log_softmax", "layer_norm"
#: layer_norm's attribute asking for onnxruntime's LayerNormalization arithmetic where the
#: target runs MLAS's kernel (recognize-composites sets it where activations are quantized).
LIKE_ONNXRUNTIME = "like_onnxruntime"


@dataclass(frozen=True)
class RowLowering:
    """The hand-built row kernel of `op` (softmax, log_softmax or layer_norm).

    `fuses_producers`: FuseOps may fuse an elementwise chain producing the row
    input into the kernel, not only one consuming its result.
    """

    op: str

    fuses_producers = True
    #: Symbolic row counts and row lengths are loop extents (static vector chunks).
    supports_symbolic = True

    def builds(self, call: g.Call) -> bool:
        t = call.args[0].type if call.args else None
        if not (isinstance(t, TensorType) and t.dtype == F32 and t.shape):
            return False
        axis = call.attrs.get("axis", -1)
        return isinstance(axis, int) and axis % len(t.shape) == len(t.shape) - 1

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The kernel computing `result` (an elementwise chain over `anchor`, this op
        applied to `args`, which may be elementwise chains over `params`; None: the op
        alone) with buffer parameters `params` + the output; None when the hand-built
        kernel does not apply (another dtype or axis, a chain needing statements)."""
        x = args[0]
        final = result if result is not None else anchor
        # MLAS's layer norm writes its output once, in the last pass: a consumer chain
        # may end in another type there (a QuantizeLinear's bytes)
        mlas = self._mlas(attrs, x.shape[-1] if x.ndim else 0, isa=isa)
        if x.dtype != F32 or (final is not None and final.dtype != F32 and not mlas) or \
                any(t.dtype != F32 for t in args[1:]):
            return None
        axis = int(attrs.get("axis", -1)) % max(x.ndim, 1)
        if x.ndim == 0 or axis != x.ndim - 1 or \
                not all(isinstance(d, int) for t in args[1:] for d in t.shape):
            return None
        n = x.shape[-1]
        outer = x.shape[:-1]
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        out = Buffer("out", x.shape, final.dtype if final is not None else F32)
        value_buf = Buffer("row_value", x.shape, F32)
        mapping = dict(buffers)
        if anchor is not None:
            mapping[anchor] = value_buf
        zero = (_c(0),) * x.ndim
        try:  # a chain needing statements (a reduction, a table) is not fused here
            te.inline_expr(x, zero, buffers)
            if result is not None:
                te.inline_expr(result, zero, mapping)
        except IRError:
            return None
        if self.op == _LAYER_NORM and not isinstance(n, int):
            return None  # its shift reads element 0, which an empty row lacks
        if self.op == _LAYER_NORM and isinstance(n, int) and attrs.get("residual"):
            kernel = self._welford_groups(x, args, attrs, n, buffers, mapping, value_buf,
                                          out, result, isa=isa)
        else:
            kernel = Rows(tuple(outer), n).around(
                lambda o: self._row(o, x, args, attrs, n, buffers, mapping, value_buf, out,
                                    result, isa=isa), isa=isa)
        return PrimFunc((*(buffers[t] for t in params), out), kernel,
                        row_kernel_attrs(self.op, outer))

    def _welford_groups(self, x: te.Tensor, args: Sequence[te.Tensor], attrs: Attrs, n: int,
                        buffers: dict[te.Tensor, Buffer], mapping: dict[te.Tensor, Buffer],
                        value_buf: Buffer, out: Buffer, result: te.Tensor | None, *,
                        isa: ISA) -> Stmt:
        """layer_norm in groups of `lanes` rows (layer_norm_welford_rows), the groups
        split over threads like rows; a symbolic row count's in
        kiln.kernels.rows.welford_symbolic."""
        vector = tile_lanes(isa)
        eps = float(attrs.get("epsilon", 1e-5))
        if not all(isinstance(d, int) for d in x.shape[:-1]):
            def value(idx: tuple[PrimExpr, ...], y: PrimExpr) -> PrimExpr:
                y = self._affine(args, idx, x.ndim, buffers, y)
                return y if result is None else SubstituteLoad(value_buf, y).visit_expr(
                    te.inline_expr(result, idx, mapping))

            return symbolic_welford_groups(
                tuple(x.shape[:-1]), n, vector, eps,
                lambda idx: te.inline_expr(x, idx, buffers), value, out, isa=isa)
        outer = [int(d) for d in x.shape[:-1]]
        total = math.prod(outer)
        lanes = vector * WELFORD_VECTORS
        loops = RowLoops(n, min(vector, max(n, 1)))

        def group(base: PrimExpr, count: int) -> Stmt:
            def index(row: PrimExpr, j: PrimExpr) -> tuple[PrimExpr, ...]:
                return (*row_index(base + row, outer), j)

            def normalize(row: PrimExpr, mean: PrimExpr, std: PrimExpr) -> Stmt:
                def at(j: PrimExpr, lane: PrimExpr) -> Stmt:
                    idx = index(row, j)
                    y = self._affine(args, idx, x.ndim, buffers, (out[idx] - mean) / std)
                    if result is not None:
                        y = SubstituteLoad(value_buf, y).visit_expr(
                            te.inline_expr(result, idx, mapping))
                    return Store(out, y, idx)
                return loops.each(at)

            # the input (the residual sum) stored into the output row by row first: the
            # statistics then read one array, `n` apart, and the normalization reads it back
            r = Var("r", INDEX_DTYPE)
            inputs = For(r, _c(0), _c(count), "serial", loops.each(
                lambda j, lane: Store(out, te.inline_expr(x, index(r, j), buffers),
                                      index(r, j))))
            return seq(inputs, layer_norm_welford_rows(
                count, lambda row, j: out[index(row, j)], n, eps, normalize))

        groups, rest = divmod(total, lanes)
        parts: list[Stmt] = []
        if groups:
            gv = Var("g", INDEX_DTYPE)
            parts.append(parallel_when(
                lambda: For(gv, _c(0), _c(groups), "parallel", group(gv * lanes, lanes)),
                groups * lanes * n, "element", isa=isa))
        if rest:
            parts.append(group(_c(groups * lanes), rest))
        return seq(*parts)

    def _mlas(self, attrs: Attrs, n: int | PrimExpr, *, isa: ISA) -> bool:
        """Whether this op's rows are onnxruntime's LayerNormalization on MLAS's kernel
        (layer_norm_mlas_row): marked `like_onnxruntime`, rows of static length it takes,
        a target CPU it runs on."""
        return self.op == _LAYER_NORM and bool(attrs.get(LIKE_ONNXRUNTIME)) and \
            not attrs.get("residual") and isinstance(n, int) and \
            n >= MLAS_LAYER_NORM_MIN and mlas_layer_norm(isa)

    @staticmethod
    def _affine(args: Sequence[te.Tensor], idx: tuple[PrimExpr, ...], ndim: int,
                buffers: dict[te.Tensor, Buffer], y: PrimExpr, fused: bool = False
                ) -> PrimExpr:
        """`y * scale + bias` at output index `idx` (layer_norm's optional operands); with
        both and `fused`, `fma(y, scale, bias)` (one rounding, as MLAS's kernel)."""
        def operand(k: int) -> PrimExpr | None:
            t = args[k] if len(args) > k else None
            return None if t is None else te.inline_expr(t, tuple(idx[ndim - t.ndim:]), buffers)

        scale, bias = operand(1), operand(2)
        if fused and scale is not None and bias is not None:
            return intrin("fma", y, scale, bias)
        if scale is not None:
            y = y * scale
        return y + bias if bias is not None else y

    def _row(self, o: tuple[PrimExpr, ...], x: te.Tensor, args: Sequence[te.Tensor],
             attrs: Attrs, n: int | PrimExpr, buffers: dict[te.Tensor, Buffer],
             mapping: dict[te.Tensor, Buffer], value_buf: Buffer, out: Buffer,
             result: te.Tensor | None, *, isa: ISA) -> Stmt:
        """The statements of the row at outer index `o`."""

        def index(j: PrimExpr) -> tuple[PrimExpr, ...]:
            return (*o, j)

        def read(j: PrimExpr) -> PrimExpr:
            return te.inline_expr(x, index(j), buffers)

        def store(j: PrimExpr, v: PrimExpr) -> Stmt:
            if result is not None:
                v = SubstituteLoad(value_buf, v).visit_expr(
                    te.inline_expr(result, index(j), mapping))
            return Store(out, v, index(j))

        lanes = tile_lanes(isa)
        loops = RowLoops(n, min(lanes, max(n, 1)) if isinstance(n, int) else lanes)
        if self.op == _LAYER_NORM:
            eps = float(attrs.get("epsilon", 1e-5))
            if self._mlas(attrs, n, isa=isa):
                assert isinstance(n, int)
                return layer_norm_mlas_row(n, read, store, lambda j, y: self._affine(
                    args, index(j), x.ndim, buffers, y, fused=True), eps)

            def affine(j: PrimExpr, y: PrimExpr) -> PrimExpr:
                return self._affine(args, index(j), x.ndim, buffers, y)

            return layer_norm_row(loops, read, store, affine, eps, fused=isa.fma,
                                  stats=stat_loops(n, loops.lanes))
        return softmax_row(loops, read, lambda j: (out, index(j)), store,
                           self.op == _LOG_SOFTMAX, isa=isa)


SOFTMAX = RowLowering("softmax")
LOG_SOFTMAX = RowLowering(_LOG_SOFTMAX)
LAYER_NORM = RowLowering(_LAYER_NORM)
