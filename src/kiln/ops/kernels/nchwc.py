"""The NCHWc family: an ungrouped `conv2d_blocked` whose channel tile is a multiple of
the block `b` (the ISA's float32 lanes) -> `conv2d_nchwc` on NCHW{b}c activations
(kiln.transform.nchwc_layout decides where a region pays); the tile `(cb, tile_w)`
is the blocked call's, except for a 1x1 layer on AVX-512 (32 registers of 16 lanes:
`pointwise_tile`): up to four vectors of output channels per tile, each input value
broadcast to twice as many channels, so the input is read half as often. On ISAs with
16 registers of 8 lanes (AVX2) a 1x1, stride-1, unpadded layer runs on
`pointwise_body` instead of the blocked kernel (`pointwise_kernel`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.conv import build_conv
from kiln.ops.kernels.conv_direct import DirectConv, blocked_body
from kiln.ops.kernels.registry import TILE, fits_registers, recorded_tile
from kiln.ops.kernels.tiles import (
    Epilogue,
    lanes_loop,
    madd,
    parallel_tiles,
    tile_lanes,
    tile_registers,
)
from kiln.ops.kernels.tiles import const as _c
from kiln.ops.kernels.tiles import loop as _loop
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


def pointwise_kernel(isa: ISA) -> bool:
    """Whether the 1x1 layers take `pointwise_body` on `isa`: with fewer than 32 registers
    of at least 8 lanes (AVX2), where it measured 1.1-3x faster than the blocked kernel
    on every 1x1 layer of MobileNetV2 (Zen 3, docs/performance.md, "AVX2 depthwise (Zen
    3)"). AVX-512 keeps the blocked kernel with `pointwise_tile`, measured there; NEON
    (4 lanes) is not measured."""
    return tile_registers(isa) < 32 and tile_lanes(isa) >= 8


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

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        """A 1x1, stride-1, unpadded layer on `pointwise_body` where `pointwise_kernel`
        says so; the others on the blocked kernel."""
        blocked = blocked_body(isa)
        pointwise = pointwise_kernel(isa)

        def body(shape: ck.ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt:
            if pointwise and (shape.kh, shape.kw, *shape.stride) == (1, 1, 1, 1) \
                    and not any(shape.pads) and t:
                return pointwise_body(shape, x, w, out, t, epilogue, fused, block)
            return blocked(shape, x, w, out, t, epilogue, fused, block)

        tile = recorded_tile(attrs, 2, self.op)
        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body)


def pointwise_body(shape: ck.ConvShape, x: Buffer, wp: Buffer, out: Buffer,
                   tile: tuple[int, ...], epilogue: Epilogue, fused: bool,
                   block: int) -> Stmt:
    """The loop nest of a 1x1, stride-1, unpadded `conv2d_nchwc`: `x` and `out` are
    NCHW{block}c, `wp` the blocked kernel's packed weight `[1][co/cb][ci][1][1][cb]`.

    A tile is `tile_w` consecutive positions of the flattened image x `cb` output
    channels (as in `blocked_conv_body`), but the sum runs over input channel blocks
    with the `block` lanes of each unrolled: every input value is read at a constant
    lane of a block-aligned vector (no division or remainder of the channel index in
    the loop), a tile's positions of one block are one contiguous run, and a channel
    count no multiple of `block` ends with its real lanes only."""
    cb, tile_w = int(wp.shape[5]), int(tile[1])
    cin, cout = shape.c_in, shape.c_out
    ow_n = shape.out_w
    positions = shape.out_h * ow_n
    tile_w = min(tile_w, positions)
    tiles = -(-positions // tile_w)
    overflow = [(tiles - 1) * tile_w + r >= positions for r in range(tile_w)]
    blocks, out_blocks = -(-cout // cb), -(-cout // block)
    full, rest = divmod(cin, block)
    dtype = x.dtype

    def body(n: PrimExpr, ob: PrimExpr, t: PrimExpr) -> Stmt:
        acc = Buffer("acc", (tile_w, cb), dtype, "local")
        head: list[Stmt] = [Allocate(acc), lanes_loop("v", cb, lambda v: seq(*(
            Store(acc, as_expr(0.0, dtype), (_c(r), v)) for r in range(tile_w))))]
        rows: list[PrimExpr] = []
        cols: list[PrimExpr] = []
        for r in range(tile_w):
            pos: PrimExpr = t * tile_w + r
            if overflow[r]:  # past the end: read the last position, store nothing
                pos = min_(pos, positions - 1)
            rv, cv = Var(f"oh{r}", INDEX_DTYPE), Var(f"ow{r}", INDEX_DTYPE)
            head += [LetStmt(rv, pos // ow_n), LetStmt(cv, pos % ow_n)]
            rows.append(rv)
            cols.append(cv)

        def channels(cib: PrimExpr, lanes: int) -> Stmt:
            steps: list[Stmt] = []
            for lane in range(lanes):
                xs = [Var(f"x{r}", dtype) for r in range(tile_w)]
                lets = [LetStmt(xv, x[n, cib, rows[r], cols[r], _c(lane)])
                        for r, xv in enumerate(xs)]

                def step(v: PrimExpr, lane: int = lane, xs: list[Var] = xs) -> Stmt:
                    wv = Var("w", dtype)
                    return seq(LetStmt(wv, wp[_c(0), ob, cib * block + lane, _c(0), _c(0), v]),
                               *(Store(acc, madd(acc[_c(r), v], xs[r], wv, fused), (_c(r), v))
                                 for r in range(tile_w)))

                steps += [*lets, lanes_loop("v", cb, step)]
            return seq(*steps)

        red: list[Stmt] = []
        if full:
            red.append(_loop("cib", full, lambda cib: channels(cib, block))
                       if full > 1 else channels(_c(0), block))
        if rest:
            red.append(channels(_c(full), rest))
        stage = Buffer("stage", (tile_w, cb), dtype, "local")
        copy = lanes_loop("v", cb, lambda v: seq(*(
            Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(tile_w))))
        real = [t * tile_w + r < positions if overflow[r] else None for r in range(tile_w)]
        stores = ck.blocked_tile_stores(out, stage, epilogue, n, ob, rows, cols, real, block,
                                        cout, blocks, out_blocks)
        return seq(*head, *red, Allocate(stage), copy, *stores)

    return parallel_tiles((shape.n, blocks, tiles), body)


NCHWC = NchwcConv("nchwc", "conv2d_nchwc", ("conv2d_blocked",), 0)
