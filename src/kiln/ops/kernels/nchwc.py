"""The NCHWc family: an ungrouped `conv2d_blocked` whose channel tile is a multiple of
the block `b` (the ISA's float32 lanes) -> `conv2d_nchwc` on NCHW{b}c activations
(kiln.transform.nchwc_layout decides where a region pays); the tile `(cb, tile_w)`
is the blocked call's, except for a 1x1 layer on AVX-512 (32 registers of 16 lanes:
`pointwise_tile`): up to four vectors of output channels per tile, each input value
broadcast to twice as many channels, so the input is read half as often."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv_direct import DirectConv
from kiln.ops.kernels.registry import TILE, fits_registers
from kiln.ops.kernels.tiles import tile_lanes, tile_registers
from kiln.target.isa import ISA

#: The most output-channel vectors a 1x1 tile holds, and its most positions.
POINTWISE_VECTORS = 4
POINTWISE_POSITIONS = 8


def pointwise_tile(channels: int, positions: int, isa: ISA) -> tuple[int, int] | None:
    """`(cb, tile_w)` of a 1x1 NCHWc layer with `channels` outputs and `positions`
    output positions, or None (keep the blocked rule's: fewer than 32 registers or 16
    lanes, where it was not measured). `cb`:
    the vectors (4 to 1) that compute the fewest padded channels, the most on ties
    (96 channels at 16 lanes: 3 vectors, 2 tiles; 576: 4); `tile_w`: the most positions
    (up to 8) whose accumulators fit the registers, fewer where that wastes less than 2%
    of the last tile (as the blocked rule does)."""
    if tile_registers(isa) < 32 or tile_lanes(isa) < 16:
        return None  # measured on AVX-512 only
    lanes = tile_lanes(isa)
    vecs = -(-channels // lanes)
    v = min(range(min(POINTWISE_VECTORS, vecs), 0, -1), key=lambda v: -(-vecs // v) * v)
    fit = [w for w in range(POINTWISE_POSITIONS, 3, -1) if fits_registers(v * w, v, isa)]

    def waste(w: int) -> int:
        return -(-positions // w) * w - positions

    tile_w = next((w for w in fit if waste(w) <= ck.MAX_POSITION_WASTE * positions),
                  min(fit, key=waste))
    return v * lanes, tile_w


@dataclass(frozen=True)
class NchwcConv(DirectConv):
    """See the module docstring. `pack` takes the call's input already blocked; `build`
    is the blocked kernel's, on NCHW{b}c input and output."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        x, wt = call.args[0].type, call.args[1].type
        return (call.op == "conv2d_blocked" and call.attrs.get("group", 1) == 1
                and isinstance(wt, TensorType) and wt.shape[5] % tile_lanes(isa) == 0
                and isinstance(x, TensorType) and x.ndim == 4 and x.dtype == "float32"
                and all(isinstance(d, int) for d in x.shape[1:]))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        from kiln.ops.registry import call as make_call

        wp, out, channels = call.args[1], call.ret_type, call.attrs.get("channels")
        if isinstance(wp, g.Constant) and wp.data.shape[3:5] == (1, 1) and isinstance(
                out, TensorType) and isinstance(channels, int):
            oh, ow = out.shape[2], out.shape[3]
            assert isinstance(oh, int) and isinstance(ow, int)  # `applies` checked the input
            tile = pointwise_tile(channels, oh * ow, isa)
            if tile is not None and tile != call.attrs.get(TILE):
                w = ck.unpack_blocked_weight(np.asarray(wp.data), channels)
                packed = g.Constant(ck.pack_blocked_weight(w, 1, tile[0]), wp.name)
                return make_call(self.op, call.args[0], packed, *call.args[2:],
                                 **{**call.attrs, TILE: tile})
        return make_call(self.op, *call.args, **call.attrs)


NCHWC = NchwcConv("nchwc", "conv2d_nchwc", ("conv2d_blocked",), 0)
