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
from kiln.ops.kernels.conv import build_conv, conv_call_shape, packed_call
from kiln.ops.kernels.registry import Family, recorded_tile
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
        return packed_call(self.op, call, None, choose_tile(shape, isa), None)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 2, self.op)

        def body(shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt:
            tw, lanes = t or choose_tile(shape, isa)
            return ck.depthwise_conv_body(shape, x, w, out, tw, epilogue, fused, lanes)

        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body)


CONV_DEPTHWISE = DepthwiseConv("conv_depthwise", "conv2d_depthwise", ("conv2d",), 0)
