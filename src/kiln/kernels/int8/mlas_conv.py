"""The kernel of `conv2d_mlas` (kiln.ops.quant_mlas_conv): a float32 2-D convolution
summed in the order onnxruntime's MLAS sums it, for static shapes.

The order is per output, so the kernel is free to tile and split the work as kiln's own
GEMM convolution does (`conv2d_mlas_kernel`, on kiln.kernels.gemm.mlas_order): per
image and group, the weight `[OC / group][K]` (read in place) times the columns
`[K][positions]`: the input itself for a 1x1 stride-1 unpadded layer (MLAS's GemmDirect),
else a workspace filled once per call (kiln.kernels.conv.gemm.im2col); register
tiles of output channels x whole vectors of positions, summed block by block in
registers, stored along the flat positions through the fused epilogue; every tile of
every position range in one parallel loop. The K blocks and position ranges are the
op's (`k_blocks` of the call's `threads` attribute: the kernel reads no host).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from kiln.ir.graph import Call
from kiln.ir.tensor import Buffer, DeclBuffer, PrimExpr, PrimFunc, Stmt, Store, seq
from kiln.kernels.conv.gemm import im2col
from kiln.kernels.epilogue import fused_store
from kiln.kernels.flat_epilogue import FlatEpilogue
from kiln.kernels.gemm.mlas_order import BRead, Segment, mlas_gemm_body, plan
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import const, parallel_split
from kiln.ops import te
from kiln.ops.conv_geometry import ConvShape
from kiln.ops.quant_mlas_conv import Geometry, geometry, k_blocks, threads_attr
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]

def _batch_group(geo: Geometry, bg: PrimExpr) -> tuple[PrimExpr, PrimExpr]:
    """(image, group) of the flat index `bg` over images and groups."""
    if geo.group == 1:
        return bg, const(0)
    return bg // geo.group, bg % geo.group


def _columns(geo: Geometry, x: Buffer, isa: ISA) -> tuple[BRead, list[Stmt]]:
    """B's reader `(image and group, k, position)` and the statements preparing it: the
    input itself, viewed as `[N][C][positions]`, for a 1x1 stride-1 unpadded layer
    (MLAS's GemmDirect), else a workspace of its columns filled once per call
    (kiln.kernels.conv.gemm.im2col: `[N][C * KH * KW][positions]`, a group's k rows
    in a row)."""
    per_group = geo.channels // geo.group
    if geo.shape().direct:
        flat = Buffer(f"{x.name}_cols", (geo.batch, geo.channels, geo.positions), x.dtype)

        def in_place(bg: PrimExpr, kk: PrimExpr, n: PrimExpr) -> PrimExpr:
            b, g = _batch_group(geo, bg)
            return flat[b, kk if geo.group == 1 else g * per_group + kk, n]

        return in_place, [DeclBuffer(flat, x, 0)]
    pads = (geo.begins[0], geo.begins[1], geo.ends[0], geo.ends[1])
    madds = geo.batch * geo.filters * geo.positions * geo.k
    shape = ConvShape(geo.batch, geo.channels, geo.height, geo.width, geo.filters,
                      geo.kernel[0], geo.kernel[1], geo.strides, geo.dilations, pads,
                      geo.group)
    # its reads gather (strides, taps), far slower than the copy rate im2col's own rule
    # assumes: it goes parallel wherever the product does
    with parallel_split("outer") if worth_parallel(madds, "madd", isa) else nullcontext():
        col, fill = im2col(x, shape, geo.positions, isa=isa)

    def expanded(bg: PrimExpr, kk: PrimExpr, n: PrimExpr) -> PrimExpr:
        b, g = _batch_group(geo, bg)
        return col[b, kk if geo.group == 1 else g * geo.k + kk, n]

    return expanded, fill


def conv2d_mlas_kernel(params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                       anchor: te.Tensor | None, result: te.Tensor | None,
                       isa: ISA) -> PrimFunc | None:
    """The kernel computing `result` (an elementwise chain over the convolution `anchor`;
    None: the convolution alone) from buffer parameters `params`, tiled for `isa`: per
    image and group the product of the weight `[OC / group][K]` (read in place) by the
    columns `[K][positions]` (kiln.kernels.gemm.mlas_order), each output stored
    through the fused epilogue along the flat positions."""
    x, w = args[0], args[1]
    bias = args[2] if len(args) == 3 else None
    geo = geometry(x.shape, w.shape, attrs)
    s = geo.shape()
    spans = k_blocks(s, threads_attr(attrs))
    store = fused_store(params, anchor, result, (geo.batch, geo.filters, *geo.out), bias)
    if store is None or any(a not in params for a in args):
        return None
    b_at, prologue = _columns(geo, store.buffers[x], isa)
    w_flat = Buffer("w_flat", (geo.filters, geo.k), "float32")
    out = Buffer("out_flat", (geo.batch, geo.filters, geo.positions), store.out.dtype)
    flat = FlatEpilogue(store.epilogue, *geo.out)
    per = s.filters

    def a_at(bg: PrimExpr, row: PrimExpr, kk: PrimExpr) -> PrimExpr:
        return w_flat[row if geo.group == 1 else _batch_group(geo, bg)[1] * per + row, kk]

    def put(bg: PrimExpr, row: PrimExpr, n: PrimExpr, value: PrimExpr) -> Stmt:
        b, g = _batch_group(geo, bg)
        idx = (b, row if geo.group == 1 else g * per + row, n)
        return Store(out, flat(value, idx), idx)

    gemm = plan(s.batch_groups, per, s.k, [Segment(*span) for span in spans], isa,
                one_row=per == 1)
    body = mlas_gemm_body(gemm, a_at, b_at, put, isa.l2_bytes, isa=isa)
    decls = [DeclBuffer(w_flat, store.buffers[w], 0), DeclBuffer(out, store.out, 0)]
    return PrimFunc((*(store.buffers[t] for t in params), store.out),
                    seq(*decls, *flat.decls, *prologue, body), {"kiln.conv2d_mlas": True})


@dataclass(frozen=True)
class ConvMlas:
    """conv2d_mlas: the hand-built kernel for static shapes (the only ones the op takes)."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """Whether the kernel applies to `call`: every call of the op, a fused tail too."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """`conv2d_mlas_kernel`."""
        return conv2d_mlas_kernel(params, args, attrs, anchor, result, isa)


#: The lowering of `conv2d_mlas` (kiln.kernels.lowering).
MLAS_CONV = ConvMlas()
