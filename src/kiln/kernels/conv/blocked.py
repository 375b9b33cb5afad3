"""The blocked direct convolution kernel (float32, `blocked_conv_body`).

The weight is packed at compile time into `[group][co_block][ci][kh][kw][cb]`
(`pack_blocked_weight`), `cb` output channels side by side (a multiple of the vector
width). An output tile is `tile_w` output positions x `cb` output channels held in a
stack array of accumulators; for every `(ci, kh, kw)` each of the `tile_w` input
values is broadcast and multiplied with one contiguous `cb`-wide weight row
(onnxruntime's NCHWc convolution and TVM's `conv2d_NCHWc` work this way). The channel
lanes are a `vectorized` loop (`lanes_loop`), emitted as vector instructions; the
accumulators are only touched as whole vectors at constant rows, so they become
registers. The loop nest is built directly (no `te.compute`), the input padded once
outside it (kiln.kernels.conv.padding); each output value passes through
`epilogue(value, (n, c, oh, ow))` as it is stored (bias, activations, a residual add:
whatever elementwise ops were fused). The tiles form one `parallel` loop (threads
split them evenly).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import tensor as tir
from kiln.ir import weight_origin as wo
from kiln.ir.dtype import INDEX_DTYPE, itemsize
from kiln.ir.shape_expr import simplify_dim
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    min_,
    seq,
)
from kiln.kernels.conv.bands import banded_tiles
from kiln.kernels.conv.ksegments import (
    ConvKBlocking,
    Segment,
    segment_end,
    segmented_band,
    tile_accumulators,
)
from kiln.kernels.conv.padding import (
    PhaseReader,
    image_rows,
    kernel_taps,
    needs_padding,
    padded_blocked_input,
    padded_image_bytes,
    padded_input,
    unpadded_reader,
)
from kiln.kernels.flat_epilogue import FlatEpilogue
from kiln.kernels.gemm.micro_kernel import reduction_loop
from kiln.kernels.prefetch import WeightPrefetch
from kiln.kernels.tiles import Epilogue, lanes_loop, madd, parallel_tiles, parallel_when
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.ops import pack_memory
from kiln.ops.conv_geometry import ConvShape
from kiln.target.isa import ISA


@dataclass(frozen=True)
class Tiling:
    """Register tile of the blocked kernel: `tile_w` columns x `cb` output channels."""

    cb: int
    tile_w: int


#: The positions per tile the blocked kernel's rule prefers, and the widths it may take
#: instead where that one leaves the last tile partly empty (`choose_tiling`).
TILE_POSITIONS = 6
TILE_POSITION_CHOICES = (5, 6, 7, 8)
#: The share of computed positions a rule's tile may waste (the last tile's surplus
#: slots) before a width that wastes fewer is taken instead.
MAX_POSITION_WASTE = 0.02


def choose_tiling(shape: ConvShape, lanes: int, registers: int = 16,
                  max_waste: float = MAX_POSITION_WASTE) -> Tiling:
    """`cb` = two vectors of output channels (one when the group has no more), `tile_w`
    6 positions: 12 vector accumulators, which fit AVX2's 16 registers with a weight row
    and a broadcast, and leave AVX-512/NEON's 32 room to spare.

    Where 6 leaves more than `max_waste` of the computed positions in the last
    tile's surplus slots (a small image: 7x7 computes 54 for 49), the width of
    `TILE_POSITION_CHOICES` (whole image when it has fewer positions) that fits
    `registers` and computes the fewest positions is taken, 6 first on ties, then
    the widest: 7 on a 7x7 image at 16 lanes (docs/performance.md), 5 at 8 lanes, where
    7 does not fit."""
    cb = lanes if shape.co_group <= lanes else 2 * lanes
    vectors = cb // lanes
    positions = shape.out_h * shape.out_w

    def computed(w: int) -> int:
        return -(-positions // w) * w

    if computed(TILE_POSITIONS) - positions <= max_waste * positions:
        return Tiling(cb=cb, tile_w=TILE_POSITIONS)
    widths = [positions] if positions < TILE_POSITIONS else list(TILE_POSITION_CHOICES)
    fits = [w for w in widths if vectors * w + vectors + 1 <= registers] or [TILE_POSITIONS]
    best = min(fits, key=lambda w: (computed(w), w != TILE_POSITIONS, -w))
    return Tiling(cb=cb, tile_w=best)


def pack_blocked_weight(w: np.ndarray, groups: int, cb: int) -> np.ndarray:
    """OIHW weight -> `[group][co_block][ci][kh][kw][cb]`, output channels padded with zeros
    (a fresh read-only array, written in place: a graph constant takes it without a copy)."""
    co, ci, kh, kw = w.shape
    cog = co // groups
    blocks, full = -(-cog // cb), cog // cb
    wg = w.reshape(groups, cog, ci, kh, kw)
    out = pack_memory.empty((groups, blocks, ci, kh, kw, cb), w.dtype)
    out[:, :full] = wg[:, :full * cb].reshape(groups, full, cb, ci, kh, kw) \
        .transpose(0, 1, 3, 4, 5, 2)
    if full < blocks:
        out[:, full] = 0
        out[:, full, ..., :cog - full * cb] = wg[:, full * cb:].transpose(0, 2, 3, 4, 1)
    out.flags.writeable = False
    return out


def pack_blocked_origin(source: wo.Origin | None, shape: Sequence[int], groups: int,
                        cb: int) -> wo.Origin | None:
    """The replay of `pack_blocked_weight` on a weight of `shape`."""
    co, ci, kh, kw = (int(d) for d in shape)
    cog = co // groups
    blocks = -(-cog // cb)
    grouped = wo.step("reshape", source, shape=(groups, cog, ci, kh, kw))
    padded = wo.padded(grouped, (groups, cog, ci, kh, kw), 1, blocks * cb)
    split = wo.step("reshape", padded, shape=(groups, blocks, cb, ci, kh, kw))
    return wo.step("transpose", split, perm=(0, 1, 3, 4, 5, 2))


def blocked_tile_stores(out: Buffer, stage: Buffer, epilogue: Epilogue, n: PrimExpr,
                        ob: PrimExpr, rows: list[PrimExpr], cols: list[PrimExpr],
                        real: list[PrimExpr | None], block: int, channels: int | PrimExpr,
                        blocks: int | PrimExpr, out_blocks: int | PrimExpr) -> list[Stmt]:
    """The stores of a tile of `len(rows)` positions x `cb` output channels (channel tile
    `ob` of `blocks`; `cb` the staged accumulators' width), staged in `stage`, into the
    NCHW{block}c `out` (`out_blocks` blocks) through `epilogue`: one contiguous vector of
    `block` channels per position and sub-block. The last block's padding lanes (past
    `channels`) hold zeros, a sub-block past the output is not stored, nor a slot whose
    `real` condition (None: always real) is false.

    The last block of a channel count no multiple of `block` is stored as two runs, its
    real lanes through `epilogue` and its padding lanes as zeros (the sub-block that may
    be the last one chooses between that and the whole block when the tile is the last
    channel tile): the epilogue never sees a padding lane, and each run is a vector loop
    of constant lanes. (One loop selecting zero for a lane past `channels`, its bias read
    at a clamped channel, had no vector form: LLVM vectorized it with SLP, which the
    convolution kernels leave off, kiln.ir.attrs.ATTR_NO_SLP, so it ran a lane at a time:
    EfficientNet-B0's and MobileNetV2's 24-channel layers.)

    `channels`, `blocks` and `out_blocks` may be run-time counts where the channels are
    whole tiles of whole blocks (kiln.kernels.conv.run_time_width.RunTimeTiles): no
    padding lane, no sub-block past the output."""
    cb = int(stage.shape[1])
    subs = cb // block
    last = out_blocks - 1            # the last block, partial when `rest`
    rest = 0
    if isinstance(channels, int) and isinstance(last, int) and channels % block:
        rest = channels - last * block
    last_sub = last - (blocks - 1) * subs  # its sub-block in the last channel tile
    zero = as_expr(0.0, stage.dtype)
    stores: list[Stmt] = []
    for r, (oh, ow) in enumerate(zip(rows, cols)):
        for sub in range(subs):
            obk = ob * subs + sub

            def lane(v: PrimExpr, r: int = r, sub: int = sub, obk: PrimExpr = obk,
                     oh: PrimExpr = oh, ow: PrimExpr = ow) -> Stmt:
                idx = (n, obk, oh, ow, v)
                return Store(out, epilogue(stage[_c(r), _c(sub * block) + v], idx), idx)

            def padding(v: PrimExpr, obk: PrimExpr = obk, oh: PrimExpr = oh,
                        ow: PrimExpr = ow) -> Stmt:
                return Store(out, zero, (n, obk, oh, ow, v + rest))

            st: Stmt = lanes_loop("v", block, lane)
            if rest and sub == last_sub:
                partial = seq(lanes_loop("v", rest, lane), lanes_loop("v", block - rest,
                                                                      padding))
                st = partial if blocks == 1 else IfThenElse(ob.eq(blocks - 1), partial, st)
            if isinstance(blocks, int) and isinstance(out_blocks, int) \
                    and blocks * cb > out_blocks * block:
                st = IfThenElse(obk < out_blocks, st)
            cond = real[r]
            if cond is not None:
                st = IfThenElse(cond, st)
            stores.append(st)
    return stores


@dataclass(frozen=True)
class BlockedSchedule:
    """The choices of one blocked kernel (`blocked_conv_body`; the rule makes them in
    kiln.kernels.conv.direct.blocked_body): the register tile `tiling`; `fused`
    multiply-adds (the ISA's FMA); `block`, the NCHW{block}c activations' block (0:
    NCHW); `kblock`, the K-blocking of the sums (None: unblocked); `subsample`, whether an
    unpadded strided 1x1 layer runs on a copy of the input values it reads; `unroll`, the
    input-channel loop's unroll factor (None: LLVM's choice); `band`, tiles per band
    (0: the rule's order); `prefetch`, whether the sums prefetch the next channel block's
    weights."""

    tiling: Tiling
    fused: bool = True
    block: int = 0
    kblock: ConvKBlocking | None = None
    subsample: bool = False
    unroll: int | None = None
    band: int = 0
    prefetch: bool = False


def blocked_conv_body(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer,
                      schedule: BlockedSchedule, epilogue: Epilogue, *, isa: ISA,
                      rest: int | None = None) -> Stmt:
    """The loop nest of a blocked direct convolution reading packed weights `wp`
    (`pack_blocked_weight` layout) and writing `epilogue(acc, index)` into `out` (NCHW),
    as `schedule` says.

    With `block` > 0 (a divisor of `cb`, ungrouped) input and output are NCHW{block}c
    (kiln.ops.layout): the input is read as `x[n][ci/block][h][w][ci%block]` and each
    output position stores `cb / block` contiguous vectors at index
    `(n, oc/block, oh, ow, oc%block)`; output channels past the real ones in the last
    block are stored as zeros (their epilogue is not applied). A 4-D `x` is read as NCHW
    (NCHW in, NCHW{b}c out).

    A tile holds `tile_w` consecutive output positions of the flattened (oh, ow) plane:
    tile `t` takes `t * tile_w, ..., t * tile_w + tile_w - 1` (a run may wrap onto the
    next row). Consecutive positions read neighbouring input columns, so one tile's
    `ci * kh * kw` steps touch about a cache line per input row and channel, and the
    next tile reuses them from L1; positions spread over the plane touched a line per
    position, which left the large middle layers waiting on L2. Positions past the end
    (the last tile's last slots) read the last position and store nothing, so one tile
    shape covers every image. With top or bottom padding a tile's sums leave out the
    kernel rows that read only the zero border for all its positions (`image_rows`).

    With `kblock` (kiln.kernels.conv.direct.choose_k_blocking) the sums run `kblock.kc`
    input channels at a time: a parallel task takes `kblock.band` consecutive tiles of one
    channel block and sums each channel segment over all of them before the next, the
    tiles' partial sums kept in a buffer of the task's between segments. With
    `subsample`, an unpadded strided 1x1 layer (`subsamples`) first copies the input
    values it reads into a workspace (`subsampled_input`, a quarter of the input at
    stride 2) and runs as a stride-1 layer on it: its tiles then read consecutive
    columns. With `unroll` (a tuning knob) the loop over input channels is unrolled by it
    (kiln.kernels.gemm.micro_kernel.reduction_loop: the sums in the same order). With `band`
    (unblocked sums only) the tiles run in bands of `band` consecutive tiles, each band's
    tiles for every channel block in turn (kiln.kernels.conv.direct.band_tiles). With
    `prefetch` each step of the sums also prefetches the weights the next channel block
    (or segment) reads at that step (kiln.kernels.prefetch).

    With `rest` (NCHW{b}c, unblocked sums, output channels whole tiles, an output as
    large as the input: kiln.kernels.conv.direct.blocked_run_time_tiles), the input
    and output channel counts and the image's height and width may be run-time values
    (kiln.kernels.conv.run_time_width.RunTimeTiles): `rest` is the last tile's
    positions (`h * w % tile_w`, 0 for a whole one), which says which of its slots may
    be past the image's end, and a tile finds its slots' rows and columns from its
    first one's (`tile_places`)."""
    if schedule.subsample and not schedule.block and subsamples(shape):
        xs, copy = subsampled_input(x, shape, isa=isa)
        one = replace(shape, h=shape.out_h, w=shape.out_w, stride=(1, 1))
        return seq(*copy, blocked_conv_body(one, xs, wp, out,
                                            replace(schedule, subsample=False, band=0),
                                            epilogue, isa=isa))
    nest = _plan(shape, x, wp, out, schedule, epilogue, rest)
    loops = _loops(nest)
    # the views the tiles' flat stores and prefetches made
    return seq(*nest.flat.decls, *(nest.pf.decls if nest.pf else ()), loops)


@dataclass(frozen=True)
class _Nest:
    """One blocked loop nest: its buffers, epilogue and schedule, and what `_plan` derives
    from them for its tiles."""

    shape: ConvShape
    x: Buffer
    wp: Buffer
    out: Buffer
    epilogue: Epilogue
    schedule: BlockedSchedule
    tile_w: int  # positions per tile (no more than the image has)
    tiles: int  # tiles per image and channel tile
    overflow: list[bool]  # slot r of the last tile is past the image's end
    pads_per_band: bool  # the input padded per band of tiles (`banded_tiles`)
    xp: PhaseReader  # the (padded) input
    prologue: list[Stmt]  # the statements padding it
    flat: FlatEpilogue
    flat_out: Buffer | None  # the output's flat view (`_flat_stores`), or None
    pf: WeightPrefetch | None
    rest: int | None = None  # a run-time image: the last tile's positions

    @property
    def cb(self) -> int:
        return self.schedule.tiling.cb

    @property
    def blocks(self) -> int:
        """Channel tiles per group (a run-time count: whole tiles)."""
        return whole(self.shape.co_group, self.cb)

    @property
    def positions(self) -> int:
        return self.shape.out_h * self.shape.out_w

    @property
    def per_channel(self) -> int:
        """The weights of one (block, input channel): kh * kw vectors of cb channels."""
        return self.shape.kh * self.shape.kw * self.cb

    @property
    def acc_t(self) -> str:
        """Accumulate in the input dtype (float32); the epilogue may cast."""
        return self.x.dtype


def _plan(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer, schedule: BlockedSchedule,
          epilogue: Epilogue, rest: int | None = None) -> _Nest:
    """The `_Nest` of a blocked convolution (its input padded as the schedule says)."""
    block, kblock, cb = schedule.block, schedule.kblock, schedule.tiling.cb
    positions = shape.out_h * shape.out_w
    if rest is None:
        tile_w = min(schedule.tiling.tile_w, positions)
        tiles = -(-positions // tile_w)
        # slot r of tile t is position t * tile_w + r; it may pass the end in the last tile
        overflow = [(tiles - 1) * tile_w + r >= positions for r in range(tile_w)]
    else:  # the image fills at least one tile (kiln.kernels.conv.direct)
        tile_w = schedule.tiling.tile_w
        tiles = cast(int, simplify_dim(-(-positions // tile_w)))
        overflow = [0 < rest <= r for r in range(tile_w)]
    if block and (shape.groups != 1 or cb % block):
        raise IRError(f"NCHW{block}c conv kernel needs an ungrouped convolution and a "
                      f"channel tile that is a multiple of {block}: {shape}, cb={cb}")
    # a padded NCHW layer past BANDED_TILES_BYTES pads per band of tiles, not the whole input
    pads_per_band = (not block and kblock is None and not schedule.band and shape.groups == 1
                     and needs_padding(shape)
                     and padded_image_bytes(shape, itemsize(x.dtype)) >= BANDED_TILES_BYTES)
    # a region's first convolution (a 4-D `x`) reads its NCHW input in place
    xp, prologue = (padded_blocked_input(x, shape, block) if block and x.ndim == 5
                    else (unpadded_reader(x), []) if pads_per_band else padded_input(x, shape))
    # NCHW, an epilogue reading a tensor shaped like the output (a residual Add) reads it
    # per channel along the tile's consecutive positions (`_flat_stores`): read along the
    # channels, as the rest of the epilogue is computed, each value is a plane apart and
    # the loads became gathers (ResNet-50's 1x1 layers with their Add at 14x14 and 7x7:
    # 24 gathers of 8 per tile).
    flat = FlatEpilogue(epilogue, shape.out_h, shape.out_w)
    flat_out = flat.view(out) if not block and flat.reads_output_shaped() else None
    per_channel = shape.kh * shape.kw * cb
    pf = (WeightPrefetch(wp, (kblock.kc if kblock else shape.ci_group) * per_channel)
          if schedule.prefetch else None)
    return _Nest(shape, x, wp, out, epilogue, schedule, tile_w, tiles, overflow,
                 pads_per_band, xp, prologue, flat, flat_out, pf, rest)


def _loops(nest: _Nest) -> Stmt:
    """The parallel loops over the nest's tiles (`_tile`): per band of tiles padding its
    own input rows, in bands of tiles, one tile each, or K-blocked bands of tiles."""
    shape, schedule, tiles = nest.shape, nest.schedule, nest.tiles
    band, kblock = schedule.band, schedule.kblock
    if nest.pads_per_band:
        return banded_tiles(shape, nest.x, tiles, nest.tile_w, nest.blocks,
                            lambda n, ob, t, read: _tile(nest, n, _c(0), ob, t, read=read))
    if kblock is None and band and band < tiles:
        bands = -(-tiles // band)

        def banded(n: PrimExpr, g: PrimExpr, b: PrimExpr, ob: PrimExpr, tt: PrimExpr) -> Stmt:
            t = Var("t", INDEX_DTYPE)
            body: Stmt = _tile(nest, n, g, ob, t)
            if tiles % band:
                body = IfThenElse(t < tiles, body)
            return seq(LetStmt(t, b * band + tt), body)

        return seq(*nest.prologue, parallel_tiles(
            (shape.n, shape.groups, bands, nest.blocks, band), banded))
    if kblock is None and nest.rest is not None and isinstance(shape.n, int) and shape.n == 1:
        # one image: the channel tile is the flat index's quotient (no remainder by the
        # run-time count of channel tiles, a division)
        return seq(*nest.prologue, parallel_tiles(
            (nest.blocks, tiles), lambda ob, t: _tile(nest, _c(0), _c(0), ob, t)))
    if kblock is None:
        return seq(*nest.prologue, parallel_tiles(
            (shape.n, shape.groups, nest.blocks, tiles),
            lambda n, g, ob, t: _tile(nest, n, g, ob, t)))
    cig = shape.ci_group
    if cig % kblock.kc:
        raise IRError(f"blocked conv kernel: {kblock.kc} channels per segment do not divide "
                      f"the group's {cig}")

    def task(n: PrimExpr, g: PrimExpr, ob: PrimExpr, b: PrimExpr) -> Stmt:
        return segmented_band(kblock, cig, tiles, b, (nest.tile_w, nest.cb), nest.acc_t,
                              lambda t, seg: _tile(nest, n, g, ob, t, seg))

    bands = -(-tiles // min(kblock.band, tiles))
    return seq(*nest.prologue, parallel_tiles((shape.n, shape.groups, nest.blocks, bands),
                                              task))


#: A tile's output positions: its (row, column) variables, slot by slot.
_Positions = tuple[list[PrimExpr], list[PrimExpr]]


def _tile(nest: _Nest, n: PrimExpr, g: PrimExpr, ob: PrimExpr, t: PrimExpr,
          seg: Segment | None = None, read: PhaseReader | None = None) -> Stmt:
    """Tile `t` of channel tile `ob` of group `g` of image `n`: its sums (over the
    channels of `seg`, all without) of the input read through `read` (the nest's
    without), then its stores (after the last segment; the partial sums kept after the
    others)."""
    acc = Buffer("acc", (nest.tile_w, nest.cb), nest.acc_t, "local")
    head = tile_accumulators(acc, seg)
    ci0: PrimExpr = _c(0) if seg is None else seg.ci0
    rows: list[PrimExpr] = []
    cols: list[PrimExpr] = []
    head += tile_places(t, nest.tile_w, nest.shape.out_w, nest.positions, nest.overflow,
                        nest.rest is not None, rows, cols)
    channels = nest.shape.ci_group if seg is None else seg.kc
    if nest.pf is not None:
        head.append(nest.pf.start((g, ob, ci0, _c(0), _c(0), _c(0)),
                                  channels * nest.per_channel))
    red = _sums(nest, acc, nest.xp if read is None else read, (n, g, ob), ci0, channels,
                (rows, cols))
    finish = _stores(nest, acc, (n, g, ob, t), (rows, cols))
    return seq(*head, red, finish if seg is None else segment_end(acc, seg, finish))


def _sums(nest: _Nest, acc: Buffer, read: PhaseReader, at: tuple[PrimExpr, ...],
          ci0: PrimExpr, channels: int, positions: _Positions) -> Stmt:
    """The loops summing `channels` input channels from `ci0` of the tile's positions into
    `acc`, for output channel tile `at` = (image, group, channel tile)."""
    shape, cb, tile_w, pf = nest.shape, nest.cb, nest.tile_w, nest.pf
    n, g, ob = at
    rows, cols = positions
    cig = shape.ci_group
    sh, sw = shape.stride
    dh, dw = shape.dilation

    def step(ci: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
        # one load per input value, bound once; the weight row is one vector load
        stmts: list[Stmt] = []
        xs = []
        for r in range(tile_w):
            xv = Var(f"x{r}", nest.acc_t)
            stmts.append(LetStmt(xv, read(n, g * cig + ci0 + ci, rows[r] * sh + kh * dh,
                                          _c(0), cols[r] * sw + kw * dw)))
            xs.append(xv)
        if pf is not None:
            stmts += pf.at(((ci * shape.kh + kh) * shape.kw + kw) * cb, cb)

        def lanes(v: PrimExpr) -> Stmt:
            wv = Var("w", nest.acc_t)
            return seq(LetStmt(wv, nest.wp[g, ob, ci0 + ci, kh, kw, v]), *(
                Store(acc, madd(acc[_c(r), v], xs[r], wv, nest.schedule.fused), (_c(r), v))
                for r in range(tile_w)))

        return seq(*stmts, lanes_loop("v", cb, lanes))

    taps = image_rows(shape, rows[0], rows[-1])
    return reduction_loop("ci", 0, channels, nest.schedule.unroll, lambda ci: kernel_taps(
        shape, taps, lambda kh, kw: step(ci, kh, kw)))


def _stores(nest: _Nest, acc: Buffer, at: tuple[PrimExpr, ...], positions: _Positions
            ) -> Stmt:
    """The stores of a tile's accumulators, `at` = (image, group, channel tile, tile): the
    NCHW{b}c vectors (`blocked_tile_stores`), the flat stores of an epilogue reading a
    tensor shaped like the output (`_flat_stores`), or the NCHW ones (`_nchw_stores`).
    The accumulators are read at constant rows and whole vectors only, so LLVM keeps them
    in registers; they are copied to `stage`, which the stores read."""
    cb, tile_w = nest.cb, nest.tile_w
    n, _, ob, t = at
    rows, cols = positions
    stage = Buffer("stage", (tile_w, cb), nest.acc_t, "local")
    copy = lanes_loop("v", cb, lambda v: seq(*(
        Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(tile_w))))
    if nest.schedule.block:
        real = [t * tile_w + r < nest.positions if nest.overflow[r] else None
                for r in range(tile_w)]
        out_blocks = whole(nest.shape.co_group, nest.schedule.block)
        return seq(Allocate(stage), copy, *blocked_tile_stores(
            nest.out, stage, nest.epilogue, n, ob, rows, cols, real, nest.schedule.block,
            nest.shape.co_group, nest.blocks, out_blocks))
    if nest.flat_out is not None:
        return seq(Allocate(stage), copy, _loop(
            "v", cb, lambda v: _flat_stores(nest, stage, at, positions, v), kind="scalar"))
    return seq(Allocate(stage), copy, *_nchw_stores(nest, stage, at, positions))


def _output_index(nest: _Nest, at: tuple[PrimExpr, ...], positions: _Positions, r: int,
                  v: PrimExpr) -> tuple[PrimExpr, ...]:
    """The NCHW index of slot `r`, lane `v` of the tile `at` (`_stores`)."""
    n, g, ob = at[0], at[1], at[2]
    oc_local = ob * nest.cb + v
    oc = g * nest.shape.co_group + oc_local if nest.shape.groups > 1 else oc_local
    return n, oc, positions[0][r], positions[1][r]


def _in_block(nest: _Nest, ob: PrimExpr, v: PrimExpr, body: Stmt) -> Stmt:
    """`body` for lane `v` of channel tile `ob`, guarded where the last tile of a channel
    count no multiple of `cb` may leave it past the real channels."""
    cog, cb = nest.shape.co_group, nest.cb
    return IfThenElse(ob * cb + v < cog, body) if cog % cb else body


def _nchw_stores(nest: _Nest, stage: Buffer, at: tuple[PrimExpr, ...],
                 positions: _Positions) -> list[Stmt]:
    """NCHW stores: a tile's `cb` channels of one position lie a plane apart, so the
    stores are scalar. The epilogue's arithmetic (a sigmoid is dozens of operations) is
    done first in vectors along the channels into `result`: `cb` of them, or in the last
    block of a channel count no multiple of `cb` the channels there are."""
    cb, tile_w, cog, blocks = nest.cb, nest.tile_w, nest.shape.co_group, nest.blocks
    ob, t = at[2], at[3]
    result = Buffer("result", (tile_w, cb), nest.out.dtype, "local")

    def apply(v: PrimExpr) -> Stmt:
        return seq(*(Store(result, nest.epilogue(stage[_c(r), v],
                                                 _output_index(nest, at, positions, r, v)),
                           (_c(r), v)) for r in range(tile_w)))

    def emit(v: Var) -> Stmt:
        stores: list[Stmt] = []
        for r in range(tile_w):
            st: Stmt = Store(nest.out, result[_c(r), v], _output_index(nest, at, positions,
                                                                      r, v))
            if nest.overflow[r]:
                st = IfThenElse(t * tile_w + r < nest.positions, st)
            stores.append(st)
        return _in_block(nest, ob, v, seq(*stores))

    applied = lanes_loop("v", cb, apply)
    if cog % cb:
        last = lanes_loop("v", cog % cb, apply)
        applied = IfThenElse(ob < blocks - 1, applied, last) if blocks > 1 else last
    return [Allocate(result), applied, _loop("v", cb, emit)]


def _flat_stores(nest: _Nest, stage: Buffer, at: tuple[PrimExpr, ...],
                 positions: _Positions, v: Var) -> Stmt:
    """Lane `v` of the tile's stores through the flat epilogue (`_plan`), along its
    consecutive positions."""
    assert nest.flat_out is not None
    t = at[3]
    stores: list[Stmt] = []
    for r in range(nest.tile_w):
        n_, oc, _, _ = _output_index(nest, at, positions, r, v)
        p = t * nest.tile_w + r
        st: Stmt = Store(nest.flat_out, nest.flat(stage[_c(r), v], (n_, oc, p)), (n_, oc, p))
        stores.append(IfThenElse(p < nest.positions, st) if nest.overflow[r] else st)
    return _in_block(nest, at[2], v, seq(*stores))


def whole(count: int | PrimExpr, size: int) -> int:
    """`count` in units of `size`, the last one partial (a run-time count: whole units,
    kiln.kernels.conv.run_time_width)."""
    if isinstance(count, int):
        return -(-count // size)
    return cast(int, simplify_dim(count // size))


def tile_places(t: PrimExpr, tile_w: int, width: int | PrimExpr, positions: int | PrimExpr,
                overflow: list[bool], run_time: bool, rows: list[PrimExpr],
                cols: list[PrimExpr]) -> list[Stmt]:
    """The rows and columns of tile `t`'s `tile_w` slots (positions of the flattened
    image of `width` columns from `t * tile_w`), appended to `rows` and `cols`, and the
    statements binding them: each slot's by a division, or over a run-time image
    (`run_time`) by `_run_time_places`. A slot that may be past the image's end
    (`overflow`) reads the last of its `positions` (and stores nothing)."""
    if run_time:
        return _run_time_places(t, tile_w, width, positions, overflow, rows, cols)
    lets: list[Stmt] = []
    for r in range(tile_w):
        pos: PrimExpr = t * tile_w + r
        if overflow[r]:
            pos = min_(pos, positions - 1)
        rv, cv = Var(f"oh{r}", INDEX_DTYPE), Var(f"ow{r}", INDEX_DTYPE)
        lets += [LetStmt(rv, pos // width), LetStmt(cv, pos % width)]
        rows.append(rv)
        cols.append(cv)
    return lets


def _run_time_places(t: PrimExpr, tile_w: int, width: int | PrimExpr,
                     positions: int | PrimExpr, overflow: list[bool], rows: list[PrimExpr],
                     cols: list[PrimExpr]) -> list[Stmt]:
    """`tile_places` over a run-time image width: the first slot's row and column by one
    division, each next one's column one further, wrapping to the next row at the width
    (a division per slot would cost as much as a small tile's multiply-adds)."""
    last = positions - 1
    first = Var("p0", INDEX_DTYPE)
    lets: list[Stmt] = [LetStmt(first, t * tile_w)]
    row: PrimExpr = first // width
    col: PrimExpr = first % width
    for r in range(tile_w):
        if r:
            step = Var(f"wrap{r}", "bool")
            lets.append(LetStmt(step, (col + 1).eq(width)))
            row, col = tir.select(step, row + 1, row), tir.select(step, 0, col + 1)
        rv, cv = Var(f"oh{r}", INDEX_DTYPE), Var(f"ow{r}", INDEX_DTYPE)
        lets += [LetStmt(rv, row), LetStmt(cv, col)]
        row, col = rv, cv
        if overflow[r]:  # past the end: the last position's row and column
            inside = first + r <= last
            rv, cv = Var(f"oh{r}_in", INDEX_DTYPE), Var(f"ow{r}_in", INDEX_DTYPE)
            lets += [LetStmt(rv, tir.select(inside, row, last // width)),
                     LetStmt(cv, tir.select(inside, col, last % width))]
        rows.append(rv)
        cols.append(cv)
    return lets


#: The padded image size from which the NCHW blocked kernel pads per band of tiles
#: (`banded_tiles`): below it the whole padded input is shared cheaply, and on a small
#: image (one tile per band) each band would stream every channel block's weights again.
BANDED_TILES_BYTES = 512 * 1024


def subsamples(shape: ConvShape) -> bool:
    """Whether the blocked kernel first copies the input's strided columns and rows: an
    unpadded strided 1x1 layer (a projection shortcut)."""
    return ((shape.kh, shape.kw) == (1, 1) and shape.stride != (1, 1)
            and not any(shape.pads))


def subsampled_input(x: Buffer, shape: ConvShape, *, isa: ISA) -> tuple[Buffer, list[Stmt]]:
    """The workspace `[n][c][oh][ow]` of the input values an unpadded strided 1x1 layer
    reads (`x[n, c, oh * sh, ow * sw]`), and the statements filling it (one parallel
    loop over images and channels)."""
    sh, sw = shape.stride
    xs = Buffer("xsub", (shape.n, shape.c_in, shape.out_h, shape.out_w), x.dtype)

    def fill(n: PrimExpr, c: PrimExpr) -> Stmt:
        return _loop("i", shape.out_h, lambda i: _loop("j", shape.out_w, lambda j: Store(
            xs, x[n, c, i * sh, j * sw], (n, c, i, j))))

    work = shape.n * shape.c_in * shape.out_h * shape.out_w
    return xs, [Allocate(xs), parallel_when(lambda: parallel_tiles((shape.n, shape.c_in), fill),
                                            work, "element", isa=isa)]
