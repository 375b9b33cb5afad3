"""The depthwise family: `conv2d` with one input and one output channel per group ->
`conv2d_depthwise` (weight unchanged), tile `(tile_w, lanes)`: `tile_w` output
columns of one row (kiln.ops.conv_kernels.depthwise_conv_body)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, PrimFunc, Stmt
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv import build_conv, conv_call_shape, packed_call, vector_widths
from kiln.ops.kernels.registry import Family, fits_registers, recorded_tile
from kiln.ops.kernels.tiles import Epilogue, tile_lanes
from kiln.target.isa import ISA


def choose_tile(shape: ck.ConvShape, isa: ISA) -> tuple[int, int]:
    lanes = tile_lanes(isa)
    return (ck.depthwise_tile_width(shape, lanes), lanes)


@dataclass(frozen=True)
class DepthwiseConv(Family):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call)
        w = call.args[1] if shape else None
        return shape is not None and shape.depthwise and isinstance(w, g.Constant) \
            and w.data.shape[1] == 1

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        shape = conv_call_shape(call)
        assert shape is not None
        return self.pack_tile(call, isa, choose_tile(shape, isa))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`tile_w` columns of whole vectors (1 to 4) that fit the registers."""
        shape = conv_call_shape(call)
        assert shape is not None
        lanes = tile_lanes(isa)
        rule = choose_tile(shape, isa)
        return [(tw, lanes) for tw in vector_widths(shape.out_w, lanes)
                if (tw, lanes) != rule and fits_registers(-(-tw // lanes), 2, isa)]

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        return packed_call(self.op, call, None, tuple(tile), None)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 2, self.op)

        def body(shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt:
            tw, lanes = t or choose_tile(shape, isa)
            return ck.depthwise_conv_body(shape, x, w, out, tw, epilogue, fused, lanes)

        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body)


CONV_DEPTHWISE = DepthwiseConv("conv_depthwise", "conv2d_depthwise", ("conv2d",), 0)
