"""The NCHWc family: an ungrouped `conv2d_blocked` whose channel tile is a multiple of
the block `b` (the ISA's float32 lanes) -> `conv2d_nchwc` on NCHW{b}c activations
(kiln.transform.nchwc_layout decides where a region pays); the tile `(cb, tile_w)`
is the blocked call's, except on AVX-512 (32 registers of 16 lanes) for a 1x1 layer
(`pointwise_tile`: up to four vectors of output channels per tile, each input value
broadcast to twice as many channels, so the input is read half as often) and for other
layers over images of 112x112 and up (`wide_tile`: 64 channels x 4 positions). An unpadded
1x1 layer (strided too) runs on `pointwise_body` instead of the blocked kernel
(`takes_pointwise`) on ISAs with 16 registers of 8 lanes (AVX2, `pointwise_kernel`)
and on those `pointwise_tile` holds for (`pointwise_body_isa`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.tensor import Buffer, PrimFunc, Stmt
from kiln.ir.types import TensorType
from kiln.kernels.conv.blocked import (
    MAX_POSITION_WASTE,
    Tiling,
    choose_tiling,
    pack_blocked_origin,
    pack_blocked_weight,
)
from kiln.kernels.conv.direct import (
    KBLOCK_WEIGHT_L2_SHARE,
    TUNED_ATTRS,
    DirectConv,
    blocked_body,
    blocked_run_time_tiles,
    blocked_schedule,
    choose_k_blocking,
    last_tile,
    nchwc_run_time_width,
)
from kiln.kernels.conv.family import build_conv, static_call_shape
from kiln.kernels.conv.ksegments import ConvKBlocking
from kiln.kernels.conv.pointwise import PointwiseSchedule, pointwise_body
from kiln.kernels.conv.run_time_width import RunTimeTiles, RunTimeWidth, TilesKey
from kiln.kernels.registry import fits_registers
from kiln.kernels.tiles import Epilogue, tile_lanes, tile_registers
from kiln.ops import spatial
from kiln.ops.conv_direct import (
    call_conv_shape,
    nchwc_block,
    unpack_blocked_origin,
    unpack_blocked_weight,
)
from kiln.ops.conv_geometry import ConvShape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.ops.registry import call as make_call
from kiln.target.isa import ISA

#: The most output-channel vectors a 1x1 tile holds, and its most positions.
POINTWISE_VECTORS = 4
POINTWISE_POSITIONS = 8
#: The most positions of a one-vector 1x1 tile over an image of fewer than
#: WIDE_TILE_POSITIONS positions (docs/performance.md, round thirty-two).
ONE_VECTOR_POSITIONS = 12


def pointwise_tile(channels: int, positions: int, isa: ISA, half: bool = False,
                   even: bool = False) -> tuple[int, int] | None:
    """`(cb, tile_w)` of a 1x1 NCHWc layer with `channels` outputs and `positions`
    output positions, or None (keep the blocked rule's: fewer than 32 registers or 16
    lanes). `cb`:
    the vectors (4 to 1) that compute the fewest padded channels, the most on ties
    (96 channels at 16 lanes: 3 vectors, 2 tiles; 576: 4); with `half` (a layer on
    `pointwise_body`) a tile of all the channels whose last vector they fill at most
    half of ends in half a vector instead (24 channels: 16 + 8, `half_vector`); with
    `even` an even count of vectors (a tile storing words of pairs of blocks,
    kiln.transform.bf16_depthwise_words; None where there is none); `tile_w`: the most
    positions (`position_cap`: 8, 12 for one vector on an image below 112x112) whose
    accumulators fit the registers with the weight vectors and, but for
    4 vectors, one broadcast per position (`pointwise_fits`), fewer where that wastes
    less than 2% of the last tile (as the blocked rule does)."""
    if tile_registers(isa) < 32 or tile_lanes(isa) < 16:
        return None  # the tiles are AVX-512's
    lanes = tile_lanes(isa)
    vecs = -(-channels // lanes)
    counts = [v for v in range(min(POINTWISE_VECTORS, vecs), 0, -1) if not even or v % 2 == 0]
    if not counts:
        return None
    v = min(counts, key=lambda v: -(-vecs // v) * v)
    fit = [w for w in range(position_cap(v, positions), 3, -1) if pointwise_fits(v, w, isa)]

    def waste(w: int) -> int:
        return -(-positions // w) * w - positions

    tile_w = next((w for w in fit if waste(w) <= MAX_POSITION_WASTE * positions),
                  min(fit, key=waste))
    if half and v == vecs and half_vector(channels, lanes):
        return v * lanes - lanes // 2, tile_w
    return v * lanes, tile_w


def position_cap(vectors: int, positions: int) -> int:
    """The most positions of a float32 1x1 tile of `vectors` output-channel vectors on
    AVX-512 over `positions` output positions: ONE_VECTOR_POSITIONS for one vector below
    WIDE_TILE_POSITIONS, else POINTWISE_POSITIONS. One vector's 1 x 12 tile (25 of the
    32 registers with its broadcasts; 1 x 11 on 196 positions) ran the 1-vector layers
    of Inception and SqueezeNet (14x14 to 54x54, 96 to 512 input channels) 6-18%
    faster than 1 x 8 or 1 x 7, but MobileNetV2's 32 > 16 at 112x112 13% slower, and
    1 x 14 was slower on every layer (6-17%); two vectors ran 1-3% slower on 2 x 9 and
    2 x 10 than on 2 x 8."""
    if vectors == 1 and positions < WIDE_TILE_POSITIONS:
        return ONE_VECTOR_POSITIONS
    return POINTWISE_POSITIONS


#: An AVX2 1x1 tile of three vectors of output channels: its positions, and the most
#: vectors of zeros its last channel tile may compute, as a share of the layer's.
THREE_VECTOR_POSITIONS = 4
THREE_VECTOR_WASTE = 0.05


def three_vector_tile(channels: int, isa: ISA) -> tuple[int, int] | None:
    """`(cb, tile_w)` of an unpadded 1x1 layer on `pointwise_body` with 16 registers
    (`pointwise_kernel`: AVX2): 3 vectors of output channels x 4 positions where the
    channels fill at least three vectors and tiles of three compute at most
    THREE_VECTOR_WASTE more (24, 96, 144, 160, 320, 1280 channels at 8 lanes), else None
    (the blocked rule's 2 vectors x 6 positions). The 12 accumulators are as many as
    the two-vector tile's, but each broadcast input value feeds three vectors: the
    input is swept a third less often, and 24 channels compute no vector of zeros (a
    third of the two-vector tiles' multiply-adds). The sums run position by position
    (`PointwiseSchedule.by_position`), so the three weight vectors stay in registers."""
    lanes = tile_lanes(isa)
    vecs = channels // lanes
    if not pointwise_kernel(isa) or channels % lanes or vecs < 3 \
            or -(-vecs // 3) * 3 - vecs > THREE_VECTOR_WASTE * vecs:
        return None
    return 3 * lanes, THREE_VECTOR_POSITIONS


#: The fewest output positions of a layer `wide_tile` widens, and its tile's positions.
WIDE_TILE_POSITIONS = 112 * 112
WIDE_TILE_WIDTH = 4


def wide_tile(channels: int, positions: int, isa: ISA) -> tuple[int, int] | None:
    """`(cb, tile_w)` of a layer that is not 1x1 with `channels` outputs and `positions`
    output positions, or None (the blocked rule's tile, `choose_tiling`: 2 vectors x 6
    positions): on 32 registers of 16 lanes (AVX-512), 4 vectors x 4 positions where
    the channels fill whole tiles of 4 vectors and the image has at least
    WIDE_TILE_POSITIONS positions. Each tile of channels sweeps the whole input, which at
    that size comes from L3 (128 channels at 112x112 are 6.4 MB); twice the channels per
    tile halves the sweeps. A smaller image's input stays in the caches: no gain."""
    lanes = tile_lanes(isa)
    cb = POINTWISE_VECTORS * lanes
    if tile_registers(isa) < 32 or lanes < 16 or channels % cb \
            or positions < WIDE_TILE_POSITIONS:
        return None
    return cb, WIDE_TILE_WIDTH


def half_vector(channels: int, lanes: int) -> bool:
    """Whether a 1x1 tile of all `channels` ends in half a vector of `lanes` (they fill
    at most half of their last vector). Its last multiply-adds are then half as wide:
    on a core that runs a 512-bit one on two 256-bit FMA pipes, a 256-bit one takes
    either, and on cores with two 512-bit FMA units both count one."""
    return 0 < channels % lanes <= lanes // 2


def pointwise_fits(vectors: int, positions: int, isa: ISA) -> bool:
    """Whether a 1x1 tile of `vectors` x `positions` fits the registers of `isa`: its
    accumulators, the weight vectors and a broadcast per position (LLVM loads a step's
    broadcasts ahead of its multiply-adds): a tile past it, 48 channels x 8 positions
    (24 accumulators, 3 weight vectors, 8 broadcasts), spills. Four vectors keep the
    one-broadcast budget (`fits_registers`): their wider tiles do not spill."""
    if vectors >= POINTWISE_VECTORS:
        return fits_registers(vectors * positions, vectors, isa)
    return vectors * positions + vectors + positions <= tile_registers(isa)


def pointwise_body_isa(isa: ISA) -> bool:
    """Whether the unpadded 1x1 layers (`takes_pointwise`) run on `pointwise_body` on
    `isa`: with `pointwise_kernel` (AVX2), and where `pointwise_tile` sets the tile
    (32 registers of 16 lanes: AVX-512). On the blocked kernel an AVX-512 tile's step
    divides each input channel index by the block for every position."""
    return pointwise_kernel(isa) or (tile_registers(isa) >= 32 and tile_lanes(isa) >= 16)


def pointwise_kernel(isa: ISA) -> bool:
    """Whether the 1x1 layers take `pointwise_body` on `isa`: with fewer than 32 registers
    of at least 8 lanes (AVX2), where it beats the blocked kernel on the 1x1 layers
    (docs/performance.md). AVX-512 keeps the blocked kernel with `pointwise_tile`; NEON
    (4 lanes) keeps the blocked kernel."""
    return tile_registers(isa) < 32 and tile_lanes(isa) >= 8


def takes_pointwise(shape: ConvShape, block: int) -> bool:
    """Whether a layer of `shape` runs on `pointwise_body` (where `pointwise_kernel`
    holds) with NCHW{block}c activations: an unpadded 1x1 layer, strided ones included (a
    tile reads every `stride`-th position's contiguous vector of `block` channels in
    place). The blocked kernel divides the channel index by the block at every step."""
    return (shape.kh, shape.kw) == (1, 1) and not any(shape.pads) and block > 0


def pointwise_k_blocking(shape: ConvShape, tiling: Tiling, isa: ISA, block: int
                         ) -> ConvKBlocking | None:
    """The K-blocking of a pointwise layer: the blocked kernel's rule
    (`choose_k_blocking`: ResNet's 7x7 layers of 512 and 2048 channels) where its
    segments are whole blocks, else None. Where the ISA's profile has `avx2_conv_rules`
    only: on AVX-512 the NCHW rule is the blocked kernel's, not this one's. A tile of
    three or more vectors (`three_vector_tile`) is K-blocked only where its weights
    reach KBLOCK_WEIGHT_L2_SHARE of the L2, not for a small image alone: unblocked,
    MobileNetV2's 960 > 320 and 960 > 160 layers at 7x7 (92 KB of weights per tile's
    channels) ran 0.86x their K-blocked time, their partial sums no longer stored and
    reloaded at every segment."""
    if not isa.profile.avx2_conv_rules:
        return None
    weights = shape.c_in * tiling.cb * 4
    if tiling.cb >= 3 * block and weights < KBLOCK_WEIGHT_L2_SHARE * isa.l2_bytes:
        return None
    kblock = choose_k_blocking(shape, tiling, isa)
    return kblock if kblock is not None and kblock.kc % block == 0 else None


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
        wp, out, channels = call.args[1], call.ret_type, call.attrs.get("channels")
        if isinstance(wp, g.Constant) and isinstance(out, TensorType) \
                and isinstance(channels, int):
            oh, ow = out.shape[2], out.shape[3]
            assert isinstance(oh, int) and isinstance(ow, int)  # `applies` checked the input
            if wp.data.shape[3:5] == (1, 1):
                begins, ends = spatial.pads(call.attrs, 2)
                # `pointwise_body`'s layers (`takes_pointwise`: a blocked input, unpadded)
                xt = call.args[0].type
                unpadded = isinstance(xt, TensorType) and xt.ndim == 5 \
                    and not any((*begins, *ends))
                tile = pointwise_tile(channels, oh * ow, isa, unpadded)
                if tile is None and unpadded:
                    tile = three_vector_tile(channels, isa)
            else:
                tile = wide_tile(channels, oh * ow, isa)
            if tile is not None and tile != call.attrs.get(TILE):
                w = unpack_blocked_weight(np.asarray(wp.data), channels)
                packed = g.Constant(pack_blocked_weight(w, 1, tile[0]), wp.name)
                plain = unpack_blocked_origin(wo.origin_of(wp.data), wp.data.shape, channels)
                wo.record(packed.data, pack_blocked_origin(plain, w.shape, 1, tile[0]))
                return make_call(self.op, call.args[0], packed, *call.args[2:],
                                 **{**call.attrs, TILE: tile})
        return make_call(self.op, *call.args, **call.attrs)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        """An unpadded 1x1 layer on `pointwise_body` where `pointwise_body_isa` and
        `takes_pointwise` say so (its lanes unrolled where `pointwise_kernel` holds), and
        wherever its channel tile ends in half a block (`half_vector`; None, the
        generic loop nest, for any other layer with such a tile); the others on the
        blocked kernel."""

        blocked = blocked_body(isa)
        pointwise = pointwise_body_isa(isa)
        shape = call_conv_shape(self.op, args, attrs)
        block = nchwc_block(args[0].shape, attrs)
        half = int(args[1].shape[5]) % block > 0
        if shape is None or (half and not (len(args[0].shape) == 5
                                           and takes_pointwise(shape, block))):
            return None

        def body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt | RunTimeWidth:
            if ((pointwise and t) or half) and x.ndim == 5 and takes_pointwise(shape, block):
                schedule = pointwise_schedule(shape, int(w.shape[5]), t, block, isa)

                def nest(shape: ConvShape, x: Buffer, w: Buffer) -> Stmt:
                    return pointwise_body(shape, x, w, out, schedule, epilogue)

                if pointwise_run_time_width(shape, schedule):
                    tiles = None
                    if pointwise_run_time_tiles(shape, schedule):
                        rest = shape.out_h * shape.out_w % schedule.tiling.tile_w

                        def tiled(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                                  epilogue: Epilogue) -> Stmt:
                            return pointwise_body(shape, x, w, out, schedule, epilogue, rest)

                        tiles = RunTimeTiles(schedule.tiling.cb, out, epilogue, tiled)
                    return RunTimeWidth(shape, nest, block, tiles)
                return nest(shape, x, w)
            return blocked(shape, x, w, out, t, epilogue, fused, block)

        tile = recorded_tile(attrs, 2, self.op)
        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body,
                          no_slp=True)

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` that takes its input's channel blocks at run time
        (`pointwise_run_time_width`, kiln.kernels.conv.direct.nchwc_run_time_width) is
        built from besides that count: which loop nest, the geometry with the count left
        out, and the schedule (the weight prefetch, chosen by the weight's size,
        included); None: a kernel of its own. Calls with the same key, fused ops and
        other operands share one kernel (kiln.transform.fuse_ops). A tuned call keeps
        its own, as does one whose tile ends in half a block. A `TilesKey` where the
        kernel takes its output channel tiles and image size at run time too
        (`pointwise_run_time_tiles`, or on the blocked kernel
        kiln.kernels.conv.direct.blocked_run_time_tiles): the geometry without them, the
        schedule and the positions of the last tile."""
        static = static_call_shape(self.op, call, 5)
        if static is None or any(k in call.attrs for k in TUNED_ATTRS):
            return None
        tensors, shape = static
        block = nchwc_block(tensors[0].shape, call.attrs)
        cb = tensors[1].shape[5]
        assert isinstance(cb, int)  # static (above)
        if cb % block:
            return None
        tile = recorded_tile(call.attrs, 2, self.op) or ()
        if pointwise_body_isa(isa) and tile and takes_pointwise(shape, block):
            pointwise = pointwise_schedule(shape, cb, tile, block, isa)
            out = call.ret_type
            if pointwise_run_time_tiles(shape, pointwise) and isinstance(out, TensorType):
                rest = shape.out_h * shape.out_w % pointwise.tiling.tile_w
                key = "pointwise tiles", replace(shape, c_in=0, c_out=0, h=0, w=0), \
                    pointwise, rest
                return TilesKey(key, tuple(out.shape), shape.c_out)
            if pointwise_run_time_width(shape, pointwise):
                return "pointwise", replace(shape, c_in=0), pointwise
            return None
        schedule = blocked_schedule(shape, (cb, *tile[1:]), isa.fma, block, isa)
        if not nchwc_run_time_width(shape, schedule):
            return None
        out = call.ret_type
        if blocked_run_time_tiles(shape, schedule) and isinstance(out, TensorType):
            tiles = "blocked tiles", replace(shape, c_in=0, c_out=0, h=0, w=0), schedule, \
                last_tile(shape, schedule)
            return TilesKey(tiles, tuple(out.shape), shape.c_out)
        return "blocked", replace(shape, c_in=0), schedule


def pointwise_schedule(shape: ConvShape, cb: int, tile: tuple[int, ...], block: int,
                       isa: ISA) -> PointwiseSchedule:
    """The `pointwise_body` schedule of a layer of `shape` whose packed weight's channel
    tile is `cb`, its positions per tile `tile[1]` (no tile: the blocked rule's)."""
    unrolled = pointwise_kernel(isa)
    tile_w = tile[1] if tile else choose_tiling(shape, tile_lanes(isa),
                                                tile_registers(isa)).tile_w
    kblock = pointwise_k_blocking(shape, Tiling(cb, tile_w), isa, block)
    return PointwiseSchedule(Tiling(cb, tile_w), isa.fma, block, kblock, unrolled,
                             by_position=unrolled and cb >= 3 * block)


def pointwise_run_time_tiles(shape: ConvShape, schedule: PointwiseSchedule) -> bool:
    """Whether `pointwise_body` with `schedule` takes its output channel tiles and image
    size at run time as well as its input's channel blocks
    (kiln.kernels.conv.run_time_width.RunTimeTiles): where it takes the blocks
    (`pointwise_run_time_width`), its output channels are whole tiles of whole blocks
    and the image fills at least one tile. The tile and the positions of the last one
    stay in the kernel's key, so the sums and the stores are the static kernel's."""
    cb, block = schedule.tiling.cb, schedule.block
    return (pointwise_run_time_width(shape, schedule) and cb % block == 0
            and shape.c_out % cb == 0 and shape.out_h * shape.out_w >= schedule.tiling.tile_w)


def pointwise_run_time_width(shape: ConvShape, schedule: PointwiseSchedule) -> bool:
    """Whether `pointwise_body` with `schedule` takes its input's channel blocks at run
    time (kiln.kernels.conv.run_time_width): at stride 1 over whole blocks, its sums not
    K-blocked. The count is then only the bound of the loop over the input's blocks.
    Not strided: ResNet-50's 256 > 512 projection at stride 2 (56x56 -> 28x28) ran 8-9%
    slower over a run-time count (docs/performance.md, "Compile time, round
    twenty-one")."""
    return (schedule.kblock is None and shape.groups == 1 and shape.stride == (1, 1)
            and shape.c_in % schedule.block == 0)


NCHWC = NchwcConv("nchwc", "conv2d_nchwc", ("conv2d_blocked",), 0)
