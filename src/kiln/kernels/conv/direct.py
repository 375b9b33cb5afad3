"""The blocked direct family: any other `conv2d` the kernels take -> `conv2d_blocked`,
the weight packed at compile time into `[group][co_block][ci][kh][kw][cb]`; tile
`(cb, tile_w)`: `tile_w` output positions x `cb` output channels, `cb` one or two
vectors of the ISA's float32 lanes (kiln.kernels.conv.blocked.blocked_conv_body)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, PrimFunc, Stmt
from kiln.kernels.conv.blocked import (
    BlockedSchedule,
    Tiling,
    blocked_conv_body,
    choose_tiling,
    pack_blocked_origin,
    pack_blocked_weight,
    subsamples,
)
from kiln.kernels.conv.family import TUNED_WIDTHS, build_conv, packed_call, static_call_shape
from kiln.kernels.conv.ksegments import ConvKBlocking
from kiln.kernels.conv.padding import padded_image_bytes
from kiln.kernels.conv.run_time_width import RunTimeTiles, RunTimeWidth
from kiln.kernels.gemm.knobs import k_unroll
from kiln.kernels.registry import KBLOCK, SPLIT, UNROLL, Family, fits_registers
from kiln.kernels.tiles import Epilogue, tile_lanes, tile_registers
from kiln.ops.conv_direct import KSEGMENT, TUNED_SEGMENTS
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.ops.packed_attrs import recorded_tile
from kiln.target.isa import ISA


def blocked_body(isa: ISA, segment: int | None = None, unroll: int | None = None) -> Any:
    """The loop nest of `conv2d_blocked` / `conv2d_nchwc` (`cb` is the packed weight's);
    `segment`: the K-blocking's input channels per segment a tuned call records
    (`KSEGMENT`; 0 unblocked), None the rule's (`choose_k_blocking`); `unroll`: the
    input-channel loop unrolled by it (the call's `unroll`), None the rule's."""
    def body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
             epilogue: Epilogue, fused: bool, block: int) -> Stmt | RunTimeWidth:
        schedule = blocked_schedule(shape, (int(w.shape[5]), *t[1:]), fused, block, isa,
                                    segment, unroll)

        def nest(shape: ConvShape, x: Buffer, w: Buffer) -> Stmt:
            return blocked_conv_body(shape, x, w, out, schedule, epilogue, isa=isa)

        if x.ndim == 4 and run_time_width(shape, schedule):
            return RunTimeWidth(shape, nest)
        if x.ndim == 5 and nchwc_run_time_width(shape, schedule):
            tiles = None
            if blocked_run_time_tiles(shape, schedule):
                rest = last_tile(shape, schedule)

                def tiled(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                          epilogue: Epilogue) -> Stmt:
                    return blocked_conv_body(shape, x, w, out, schedule, epilogue, isa=isa,
                                             rest=rest)

                tiles = RunTimeTiles(schedule.tiling.cb, out, epilogue, tiled)
            return RunTimeWidth(shape, nest, block, tiles)
        return nest(shape, x, w)

    return body


def blocked_schedule(shape: ConvShape, tile: tuple[int, ...], fused: bool, block: int,
                     isa: ISA, segment: int | None = None, unroll: int | None = None
                     ) -> BlockedSchedule:
    """The blocked kernel's schedule of a layer of `shape` whose packed weight's channel
    tile is `tile[0]`, its positions per tile `tile[1]` (absent: the family's,
    `blocked_tiling`); `segment` and `unroll` as `blocked_body` takes them."""
    tile_w = tile[1] if len(tile) > 1 else blocked_tiling(shape, isa).tile_w
    tiling = Tiling(cb=tile[0], tile_w=tile_w)
    kblock = choose_k_blocking(shape, tiling, isa) if segment is None else \
        segment_blocking(tiling, isa, segment)
    return BlockedSchedule(tiling, fused, block, kblock,
                           subsample=subsamples_input(shape, isa), unroll=unroll,
                           band=0 if block else band_tiles(shape, tiling, isa),
                           prefetch=prefetches_weights(shape, tiling, isa))


def run_time_width(shape: ConvShape, schedule: BlockedSchedule) -> bool:
    """Whether the blocked kernel of an NCHW layer of `shape` takes its input channel
    count at run time (kiln.kernels.conv.run_time_width): an unpadded, ungrouped 1x1
    layer at stride 1 whose sums are neither K-blocked nor unrolled, the count then only
    the bound of their loop (and of the weights a prefetch reads)."""
    return ((shape.kh, shape.kw) == (1, 1) and shape.stride == (1, 1)
            and not any(shape.pads) and shape.groups == 1 and not schedule.block
            and schedule.kblock is None and not schedule.band
            and schedule.unroll in (None, 1))


def nchwc_run_time_width(shape: ConvShape, schedule: BlockedSchedule) -> bool:
    """Whether the blocked kernel of a layer of `shape` on NCHW{b}c input takes its
    input's channel blocks at run time (kiln.kernels.conv.run_time_width): an ungrouped
    layer over whole blocks whose sums are neither K-blocked nor unrolled. The count
    bounds the loop over input channels, the padded input's workspace and the span a
    weight prefetch checks, nothing else: the tile, the taps and the stores do not
    depend on it."""
    block = schedule.block
    return (block > 0 and shape.groups == 1 and shape.c_in % block == 0
            and schedule.kblock is None and schedule.unroll in (None, 1))


def blocked_run_time_tiles(shape: ConvShape, schedule: BlockedSchedule) -> bool:
    """Whether the blocked kernel of a layer of `shape` on NCHW{b}c input takes its output
    channel tiles and image size at run time as well as its input's channel blocks
    (kiln.kernels.conv.run_time_width.RunTimeTiles): where it takes the blocks
    (`nchwc_run_time_width`), at stride 1 with an output as large as the input (Inception's
    5x5 layers with pads 2, a 3x3 layer's pads 1), its output channels whole tiles of
    whole blocks, the image at least a tile. The kernel size, the padding, the tile, the
    weight prefetch and the positions of the last tile (`last_tile`) stay in the
    kernel's key, so the sums and the stores are the static kernel's."""
    cb, block = schedule.tiling.cb, schedule.block
    return (shape.stride == (1, 1) and (shape.out_h, shape.out_w) == (shape.h, shape.w)
            and cb % block == 0 and shape.c_out % cb == 0 and not schedule.band
            and shape.out_h * shape.out_w >= schedule.tiling.tile_w)


def last_tile(shape: ConvShape, schedule: BlockedSchedule) -> int:
    """The positions of the blocked kernel's last tile of an image (0: a whole one)."""
    return shape.out_h * shape.out_w % schedule.tiling.tile_w


def blocked_tiling(shape: ConvShape, isa: ISA) -> Tiling:
    """The family's tile for `shape` on `isa`: `choose_tiling`, except that a 1x1 layer on
    32 registers or more takes the width that fills every tile (no `MAX_POSITION_WASTE`
    allowance) where that one is wider than the rule's: 14x14 in 28 tiles of 7, not 33
    of 6 (17x17 keeps 6: 5 would fill its tiles with more of them). Each tile reads its
    channel block's whole weight panel (`ci x cb` values, from L2) for only `tile_w`
    multiply-adds per weight vector, so fewer, wider tiles pay on a 1x1 layer
    (docs/performance.md, "DenseNet-121's 14x14 bottlenecks on AVX-512"). AVX2's 16
    registers hold no 7-wide tile of two vectors: unchanged there."""
    lanes, registers = tile_lanes(isa), tile_registers(isa)
    rule = choose_tiling(shape, lanes, registers)
    if (shape.kh, shape.kw) != (1, 1) or registers < 32:
        return rule
    filled = choose_tiling(shape, lanes, registers, max_waste=0.0)
    return filled if filled.tile_w > rule.tile_w else rule


#: Where the blocked kernel prefetches the next channel block's weights
#: (kiln.kernels.prefetch): on an image of at most this many output positions (a
#: block's weights are read by few tiles, so fetching them is a large share of its
#: time), for packed weights of at least `PREFETCH_WEIGHT_L2_SHARE` of the L2 (in a
#: model, such a layer's weights come from memory on every call), on a CPU with an L2.
#: Larger images read each block's weights from many tiles: not prefetched.
PREFETCH_MAX_POSITIONS = 256
PREFETCH_WEIGHT_L2_SHARE = 0.25


def subsamples_input(shape: ConvShape, isa: ISA) -> bool:
    """Whether the blocked kernel runs an unpadded strided 1x1 layer on a copy of the
    input values it reads (subsampled_input; subsamples names the layers): on
    256-bit vectors always, on others where one image's input is at least the L2 (read
    in place, a stride-2 layer brings in every cache line of it for a quarter of the
    values); an input within the L2 is read in place as fast."""
    # one image's input: the batch may be symbolic, and the tiles run image by image
    return (isa.profile.avx2_conv_rules
            or shape.c_in * shape.h * shape.w * 4 >= isa.l2_bytes > 0)


def prefetches_weights(shape: ConvShape, tiling: Tiling, isa: ISA) -> bool:
    """Whether the blocked kernel's sums prefetch the weights of the channel block (or
    segment) after their own (`PREFETCH_MAX_POSITIONS`)."""
    weights = shape.groups * shape.ci_group * shape.kh * shape.kw \
        * -(-shape.co_group // tiling.cb) * tiling.cb * 4
    return (shape.out_h * shape.out_w <= PREFETCH_MAX_POSITIONS and isa.l2_bytes > 0
            and weights >= PREFETCH_WEIGHT_L2_SHARE * isa.l2_bytes)


def rule_segment(shape: ConvShape, tile: tuple[int, ...], isa: ISA) -> int:
    """The rule's channels per segment for `tile` (0: unblocked)."""
    kb = choose_k_blocking(shape, Tiling(cb=tile[0], tile_w=tile[1]), isa)
    return 0 if kb is None else kb.kc


def segment_blocking(tiling: Tiling, isa: ISA, channels: int) -> ConvKBlocking | None:
    """K-blocking of `channels` input channels per segment (0: None, unblocked), the
    band of tiles per task as the rule's (`PARTIAL_SUMS_L2_SHARE` of the L2)."""
    if channels == 0:
        return None
    tile_bytes = tiling.tile_w * tiling.cb * 4
    return ConvKBlocking(channels,
                         max(1, int(PARTIAL_SUMS_L2_SHARE * isa.l2_bytes) // tile_bytes))


#: Input channels per segment of K-blocked sums: 32 (fewer per segment re-read the
#: partial sums more often, more outgrow the L1); a group whose channels 32 does not
#: divide takes the largest divisor from `MIN_SEGMENT_CHANNELS` on, or stays unblocked.
SEGMENT_CHANNELS = 32
MIN_SEGMENT_CHANNELS = 8
#: Where the blocked kernel's sums are K-blocked: a channel block's weights at least
#: this share of the L2 (a sweep of the image then streams them and the input rows from
#: beyond the L2), or an image of at most `SMALL_IMAGE_POSITIONS` output positions (its
#: tiles wrap rows, and each reads every channel's plane) with weights past the L1.
KBLOCK_WEIGHT_L2_SHARE = 0.25
SMALL_IMAGE_POSITIONS = 64
# The K-blocking rule holds where the ISA's profile has `conv_k_blocking`; without its
# `avx2_conv_rules` (AVX-512, docs/performance.md, "K-blocked sums on AVX-512") it blocks
# a layer whose weights pass `KBLOCK_WEIGHT_L2_SHARE` of the L2 and whose padded input
# passes `KBLOCK_INPUT_L2_SHARE`, not by the small-image criterion (a small image's
# layers gain nothing blocked).
KBLOCK_INPUT_L2_SHARE = 0.5
#: The most partial sums (bytes) a K-blocked task keeps: a quarter of the L2.
PARTIAL_SUMS_L2_SHARE = 0.25


def choose_k_blocking(shape: ConvShape, tiling: Tiling, isa: ISA
                      ) -> ConvKBlocking | None:
    """How the blocked kernel splits its sums along the input channels on `isa`
    (blocked_conv_body), or None: unblocked.

    Unblocked, a tile sums over every input channel and tap before it stores, and a
    parallel task sweeps the image tile by tile with one block of `cb` output channels:
    its weights (`ci * kh * kw * cb` values) and the input rows the tiles read are
    re-read for every tile. Where they outgrow the caches (512-channel 3x3 layers:
    295 KB of weights per block, with the input rows beyond the L2) the tiles wait on
    memory. K-blocked, a task sums `SEGMENT_CHANNELS` channels over all its tiles at a
    time (a segment's weights, 18 KB for a 3x3 layer, stay in L1), keeping the tiles'
    partial sums in a buffer of its own."""
    if not isa.profile.conv_k_blocking:
        return None
    cig = shape.ci_group
    kc = next((k for k in range(min(SEGMENT_CHANNELS, cig // 2), MIN_SEGMENT_CHANNELS - 1, -1)
               if cig % k == 0), 0)
    if not kc:
        return None
    positions = shape.out_h * shape.out_w
    weights = cig * shape.kh * shape.kw * tiling.cb * 4
    if not isa.profile.avx2_conv_rules:  # AVX-512: big weights and a big input
        big = (weights >= KBLOCK_WEIGHT_L2_SHARE * isa.l2_bytes
               and padded_image_bytes(shape) >= KBLOCK_INPUT_L2_SHARE * isa.l2_bytes)
        return segment_blocking(tiling, isa, kc) if big else None
    small_image = positions <= SMALL_IMAGE_POSITIONS and weights >= isa.l1d_bytes
    if weights < KBLOCK_WEIGHT_L2_SHARE * isa.l2_bytes and not small_image:
        return None
    return segment_blocking(tiling, isa, kc)


#: A band of output rows (`band_tiles`) reads input rows filling at most this share of
#: the L2.
BAND_INPUT_L2_SHARE = 0.5


def band_tiles(shape: ConvShape, tiling: Tiling, isa: ISA) -> int:
    """Tiles per band of a strided layer whose tiles run band by band, each band's tiles
    for every output channel block in turn (blocked_conv_body's `band`), or 0: the
    rule's order (a channel block's tiles over the whole image, then the next block).

    A strided KxK layer's padded input passes the L2 where its image is large (ResNet's
    3x3/2 128>128 and ResNet-18's 64>128 at 56x56: 1.7 and 0.9 MB): swept once per
    block of output channels, it came from L3 each time, a tile's reads spread over
    `ci * kh` rows of as many planes (more streams than the prefetchers follow). In
    bands of output rows whose input rows fill half the L2, the input is read from L3
    once and each block's weights (a contiguous run) once per band. Stride-1 layers and
    inputs within the L2 gain nothing: left in the rule's order. On 256-bit vectors
    (the profile's `avx2_conv_rules`); ungrouped layers with more than one block of output channels
    (not the subsampled strided 1x1 ones, which run at stride 1)."""
    if not isa.profile.avx2_conv_rules or shape.stride == (1, 1) \
            or shape.groups != 1 or shape.co_group <= tiling.cb or subsamples(shape):
        return 0  # (a subsampled strided 1x1 layer runs at stride 1)
    top, left, bottom, right = shape.pads
    row_bytes = shape.c_in * (shape.w + left + right) * 4
    if row_bytes * (shape.h + top + bottom) <= isa.l2_bytes:
        return 0
    span = shape.dilation[0] * (shape.kh - 1) + 1  # input rows one output row reads
    rows_in = int(BAND_INPUT_L2_SHARE * isa.l2_bytes) // row_bytes
    rows_out = max(1, (rows_in - span) // shape.stride[0] + 1)
    positions = shape.out_h * shape.out_w
    return max(1, rows_out * shape.out_w // min(tiling.tile_w, positions))


#: The attributes of a tuned call (kiln.tuning) that change the blocked kernel's loops.
TUNED_ATTRS = (KSEGMENT, SPLIT, KBLOCK, UNROLL)


@dataclass(frozen=True)
class DirectConv(Family):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return conv_call_shape(call) is not None

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        shape = conv_call_shape(call)
        assert shape is not None
        t = blocked_tiling(shape, isa)
        return self.pack_tile(call, isa, (t.cb, t.tile_w))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`cb` 1 to 4 vectors (no more than the group's channels rounded up to a
        vector), `tile_w` positions whose `cb / lanes * tile_w` accumulators fit."""
        shape = conv_call_shape(call)
        assert shape is not None
        lanes = tile_lanes(isa)
        rule = blocked_tiling(shape, isa)
        out = [(v * lanes, tw) for v in range(1, 5) if v == 1 or (v - 1) * lanes < shape.co_group
               for tw in TUNED_WIDTHS if fits_registers(v * tw, v, isa)]
        return sorted((t for t in out if t != (rule.cb, rule.tile_w)),
                      key=lambda t: (abs(t[1] - rule.tile_w) + 4 * abs(t[0] - rule.cb) // lanes,
                                     t))

    def rule_segment(self, shape: ConvShape, tile: tuple[int, ...], isa: ISA) -> int:
        """The rule's input channels per K segment for `tile` (`rule_segment`; tuning's
        search asks it by the family's name, kiln.kernels.search.segments)."""
        return rule_segment(shape, tile, isa)

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        shape = conv_call_shape(call)
        w = call.args[1]
        assert shape is not None and isinstance(w, g.Constant)
        cb, tile_w = tile
        return packed_call(self.op, call, pack_blocked_weight(w.data, shape.groups, cb),
                           (cb, tile_w), shape.c_out,
                           lambda o: pack_blocked_origin(o, w.data.shape, shape.groups, cb))

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` that takes its input channel count at run time
        (`run_time_width`) is built from besides that count (its geometry with the
        count left out, and its schedule), or None: a kernel of its own. Calls with the
        same key, fused ops and other operands share one kernel. A tuned call (its
        tile aside) keeps its own."""
        static = static_call_shape(self.op, call, 4)
        if static is None or any(k in call.attrs for k in TUNED_ATTRS):
            return None
        tensors, shape = static
        tile = recorded_tile(call.attrs, 2, self.op) or ()
        cb = tensors[1].shape[5]
        assert isinstance(cb, int)  # static (above)
        schedule = blocked_schedule(shape, (cb, *tile[1:]), isa.fma, 0, isa)
        if not run_time_width(shape, schedule):
            return None
        # stride 1: the subsampling the rule picks by the input's size does not apply
        return replace(shape, c_in=0), replace(schedule, subsample=False)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:

        tile = recorded_tile(attrs, 2, self.op)
        segment = attrs.get(KSEGMENT)
        if segment is not None and (isinstance(segment, bool) or segment not in TUNED_SEGMENTS):
            raise IRError(f"{self.op}: attribute {KSEGMENT!r} must be one of "
                          f"{', '.join(map(str, TUNED_SEGMENTS))}, got {segment!r}")
        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (),
                          blocked_body(isa, segment, k_unroll()), no_slp=True)


CONV_DIRECT = DirectConv("conv_direct", "conv2d_blocked", ("conv2d",), 3)
