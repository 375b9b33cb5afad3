"""The NCHWc family: an ungrouped `conv2d_blocked` whose channel tile is a multiple of
the block `b` (the ISA's float32 lanes) -> `conv2d_nchwc` on NCHW{b}c activations
(kiln.transform.nchwc_layout decides where a region pays); the tile `(cb, tile_w)`
is the blocked call's."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops.kernels.conv_direct import DirectConv
from kiln.ops.kernels.tiles import tile_lanes
from kiln.target.isa import ISA


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

        return make_call(self.op, *call.args, **call.attrs)


NCHWC = NchwcConv("nchwc", "conv2d_nchwc", ("conv2d_blocked",), 0)
