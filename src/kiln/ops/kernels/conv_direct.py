"""The blocked direct family: any other `conv2d` the kernels take -> `conv2d_blocked`,
the weight packed at compile time into `[group][co_block][ci][kh][kw][cb]`; tile
`(cb, tile_w)`: `tile_w` output positions x `cb` output channels, `cb` one or two
vectors of the ISA's float32 lanes (kiln.ops.conv_kernels.blocked_conv_body)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, PrimFunc, Stmt
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv import TUNED_WIDTHS, build_conv, conv_call_shape, packed_call
from kiln.ops.kernels.registry import Family, fits_registers, recorded_tile
from kiln.ops.kernels.tiles import Epilogue, tile_lanes, tile_registers
from kiln.target.isa import ISA


def blocked_body(isa: ISA) -> Any:
    """The loop nest of `conv2d_blocked` / `conv2d_nchwc` (`cb` is the packed weight's)."""
    def body(shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
             epilogue: Epilogue, fused: bool, block: int) -> Stmt:
        tile_w = t[1] if t else ck.choose_tiling(shape, tile_lanes(isa), tile_registers(isa)).tile_w
        tiling = ck.Tiling(cb=int(w.shape[5]), tile_w=tile_w)
        return ck.blocked_conv_body(shape, x, w, out, tiling, epilogue, fused, block)

    return body


@dataclass(frozen=True)
class DirectConv(Family):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return conv_call_shape(call) is not None

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        shape = conv_call_shape(call)
        assert shape is not None
        t = ck.choose_tiling(shape, tile_lanes(isa), tile_registers(isa))
        return self.pack_tile(call, isa, (t.cb, t.tile_w))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`cb` 1 to 4 vectors (no more than the group's channels rounded up to a
        vector), `tile_w` positions whose `cb / lanes * tile_w` accumulators fit."""
        shape = conv_call_shape(call)
        assert shape is not None
        lanes = tile_lanes(isa)
        rule = ck.choose_tiling(shape, lanes, tile_registers(isa))
        out = [(v * lanes, tw) for v in range(1, 5) if v == 1 or (v - 1) * lanes < shape.co_group
               for tw in TUNED_WIDTHS if fits_registers(v * tw, v, isa)]
        return sorted((t for t in out if t != (rule.cb, rule.tile_w)),
                      key=lambda t: (abs(t[1] - rule.tile_w) + 4 * abs(t[0] - rule.cb) // lanes,
                                     t))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        shape = conv_call_shape(call)
        w = call.args[1]
        assert shape is not None and isinstance(w, g.Constant)
        cb, tile_w = tile
        return packed_call(self.op, call, ck.pack_blocked_weight(w.data, shape.groups, cb),
                           (cb, tile_w), shape.c_out)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 2, self.op)
        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (),
                          blocked_body(isa))


CONV_DIRECT = DirectConv("conv_direct", "conv2d_blocked", ("conv2d",), 3)
