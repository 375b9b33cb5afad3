"""The depthwise family: `conv2d` with one input and one output channel per group ->
`conv2d_depthwise` (weight unchanged), tile `(tile_w, lanes)`: `tile_w` output
columns of as many output rows as the ISA's registers hold accumulators for
(kiln.ops.conv_kernels.depthwise_conv_body, `depthwise_tile_rows`). A padded
stride-1 input larger than the ISA's L2 is padded channel by channel on the stack
(`window_body`). Over an image of symbolic height and width, the run-time split
kernel of kiln.ops.kernels.window_symbolic (the tile unused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, PrimExpr, Stmt, as_expr
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv import UnpackedConv, conv_call_shape, vector_widths
from kiln.ops.kernels.registry import fits_registers
from kiln.ops.kernels.tiles import (
    Epilogue,
    madd,
    parallel_over_images,
    tile_lanes,
    tile_registers,
)
from kiln.ops.kernels.window_symbolic import symbolic_window_body
from kiln.target.isa import ISA


def choose_tile(shape: ck.ConvShape, isa: ISA) -> tuple[int, int]:
    lanes = tile_lanes(isa)
    if shape.symbolic_image:
        return (lanes, lanes)
    return (ck.depthwise_tile_width(shape, lanes), lanes)


@dataclass(frozen=True)
class DepthwiseConv(UnpackedConv):
    """See the module docstring."""

    symbolic_image: ClassVar[bool] = True

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call, symbolic_image=True)
        w = call.args[1] if shape else None
        return shape is not None and shape.depthwise and isinstance(w, g.Constant) \
            and w.data.shape[1] == 1

    def choose_tile(self, shape: ck.ConvShape, isa: ISA) -> tuple[int, int]:
        return choose_tile(shape, isa)

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`tile_w` columns of whole vectors (1 to 4) that fit the registers."""
        shape = conv_call_shape(call, symbolic_image=True)
        assert shape is not None
        if shape.symbolic_image:
            return []
        lanes = tile_lanes(isa)
        rule = choose_tile(shape, isa)
        return [(tw, lanes) for tw in vector_widths(shape.out_w, lanes)
                if (tw, lanes) != rule and fits_registers(-(-tw // lanes), 2, isa)]

    def loop_nest(self, shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        tw, lanes = tile
        if shape.symbolic_image:
            def tap(acc: PrimExpr, v: PrimExpr, c: PrimExpr, kh: int, kw: int) -> PrimExpr:
                return madd(acc, v, w[c, 0, kh, kw], fused)

            zero = as_expr(0.0, x.dtype)
            with parallel_over_images():
                return symbolic_window_body(shape, x, out, lanes, tap, zero, zero, epilogue,
                                            isa=isa)
        return ck.depthwise_conv_body(shape, x, w, out, tw, epilogue, fused, lanes,
                                      tile_registers(isa), isa.l2_bytes)


CONV_DEPTHWISE = DepthwiseConv("conv_depthwise", "conv2d_depthwise", ("conv2d",), 0)
