"""The depthwise family: `conv2d` with one input and one output channel per group ->
`conv2d_depthwise` (weight unchanged), tile `(tile_w, lanes)`: `tile_w` output
columns of as many output rows as the ISA's registers hold accumulators for
(kiln.ops.conv_kernels.depthwise_conv_body, `depthwise_tile_rows`). A padded
stride-1 input larger than the ISA's L2 is padded channel by channel on the stack
(`window_body`)."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, Stmt
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv import UnpackedConv, conv_call_shape, vector_widths
from kiln.ops.kernels.registry import fits_registers
from kiln.ops.kernels.tiles import Epilogue, tile_lanes, tile_registers
from kiln.target.isa import ISA


def choose_tile(shape: ck.ConvShape, isa: ISA) -> tuple[int, int]:
    lanes = tile_lanes(isa)
    return (ck.depthwise_tile_width(shape, lanes), lanes)


@dataclass(frozen=True)
class DepthwiseConv(UnpackedConv):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call)
        w = call.args[1] if shape else None
        return shape is not None and shape.depthwise and isinstance(w, g.Constant) \
            and w.data.shape[1] == 1

    def choose_tile(self, shape: ck.ConvShape, isa: ISA) -> tuple[int, int]:
        return choose_tile(shape, isa)

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`tile_w` columns of whole vectors (1 to 4) that fit the registers."""
        shape = conv_call_shape(call)
        assert shape is not None
        lanes = tile_lanes(isa)
        rule = choose_tile(shape, isa)
        return [(tw, lanes) for tw in vector_widths(shape.out_w, lanes)
                if (tw, lanes) != rule and fits_registers(-(-tw // lanes), 2, isa)]

    def loop_nest(self, shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        tw, lanes = tile
        return ck.depthwise_conv_body(shape, x, w, out, tw, epilogue, fused, lanes,
                                      tile_registers(isa), isa.l2_bytes)


CONV_DEPTHWISE = DepthwiseConv("conv_depthwise", "conv2d_depthwise", ("conv2d",), 0)
