"""The NCHWc pointwise kernel (`pointwise_body`): an unpadded 1x1 `conv2d_nchwc` (any
stride) summed over input channel blocks with each block's lanes unrolled (or a loop),
so that no channel index is divided by the block in the sums; the NCHWc family
(kiln.kernels.conv.nchwc) decides where it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from kiln.errors import IRError
from kiln.ir.shape_expr import simplify_dim
from kiln.ir.tensor import Allocate, Buffer, LetStmt, PrimExpr, Stmt, Store, Var, as_expr, seq
from kiln.kernels.conv.blocked import Tiling, blocked_tile_stores, tile_places
from kiln.kernels.conv.ksegments import (
    ConvKBlocking,
    Segment,
    segment_end,
    segmented_band,
    tile_accumulators,
)
from kiln.kernels.tiles import Epilogue, lanes_loop, madd, parallel_tiles
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.ops.conv_geometry import ConvShape


@dataclass(frozen=True)
class PointwiseSchedule:
    """The choices of one pointwise kernel (`pointwise_body`; made by the NCHWc family's
    `build`): the register tile `tiling` (`cb` the packed weight's channel tile);
    `fused` multiply-adds (the ISA's FMA); `block`, the activations' NCHW{block}c block;
    `kblock`, the K-blocking of the sums (whole blocks per segment; None: unblocked);
    `unrolled`, whether a block's lanes are unrolled (else a loop); `by_position`,
    whether a lane's multiply-adds run position by position (each input value then
    feeds every weight vector) rather than weight vector by vector."""

    tiling: Tiling
    fused: bool
    block: int
    kblock: ConvKBlocking | None = None
    unrolled: bool = True
    by_position: bool = False


def pointwise_body(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer,
                   schedule: PointwiseSchedule, epilogue: Epilogue,
                   rest: int | None = None) -> Stmt:
    """The loop nest of an unpadded 1x1 `conv2d_nchwc` (any stride): `x` and `out` are
    NCHW{block}c, `wp` the blocked kernel's packed weight `[1][co/cb][ci][1][1][cb]`.

    A tile is `tile_w` consecutive positions of the flattened image x `cb` output
    channels (as in `blocked_conv_body`), but the sum runs over input channel blocks
    with the `block` lanes of each unrolled: every input value is read at a constant
    lane of a block-aligned vector (no division or remainder of the channel index in
    the loop), a tile's positions of one block are one contiguous run, and a channel
    count no multiple of `block` ends with its real lanes only. Not `unrolled`, the
    lanes of a block are a loop instead (the same reads at a lane offset that grows by
    one): on 32 registers (AVX-512) LLVM hoists the unrolled lanes' broadcasts ahead
    of their multiply-adds and spills them.

    With `kblock` (whole blocks of input channels per segment) a parallel task takes
    `kblock.band` consecutive tiles of one channel block and sums each segment over all
    of them before the next, the partial sums in a buffer of the task's, as
    `blocked_conv_body` does (whose NCHW{b}c reads divide the channel index).

    With `rest` (a layer at stride 1 over whole tiles of output channels), the output
    channel count and the image's height and width may be run-time values
    (kiln.kernels.conv.run_time_width.RunTimeTiles); `rest` is then the positions of
    the last tile (`h * w % tile_w`, 0 for a whole one), which says which of its slots
    may be past the image's end as the static kernel's overflow does, and a tile finds
    its slots' rows and columns from its first position's
    (kiln.kernels.conv.blocked.tile_places)."""
    positions = shape.out_h * shape.out_w
    if rest is None:
        tile_w = min(schedule.tiling.tile_w, positions)
        tiles = -(-positions // tile_w)
    else:  # the image fills at least one tile (kiln.kernels.conv.nchwc)
        tile_w = schedule.tiling.tile_w
        tiles = cast(int, simplify_dim(-(-positions // tile_w)))
    nest = _Pointwise(shape, x, wp, out, schedule, epilogue, tile_w, tiles, rest)
    blocks, cin, block = nest.blocks, shape.c_in, schedule.block
    kblock = schedule.kblock
    if kblock is None and rest is not None and isinstance(shape.n, int) and shape.n == 1:
        # one image: the channel tile is the flat index's quotient (no remainder by the
        # run-time count of channel tiles, a division)
        return parallel_tiles((blocks, tiles), lambda ob, t: _tile(nest, _c(0), ob, t))
    if kblock is None:
        return parallel_tiles((shape.n, blocks, tiles),
                              lambda n, ob, t: _tile(nest, n, ob, t))
    if rest is not None or cin % kblock.kc or kblock.kc % block:
        raise IRError(f"NCHW{block}c pointwise kernel: {kblock.kc} channels per segment "
                      f"must be whole blocks dividing the {cin} input channels")

    def task(n: PrimExpr, ob: PrimExpr, b: PrimExpr) -> Stmt:
        return segmented_band(kblock, cin, tiles, b, (tile_w, nest.cb), x.dtype,
                              lambda t, seg: _tile(nest, n, ob, t, seg))

    bands = -(-tiles // min(kblock.band, tiles))
    return parallel_tiles((shape.n, blocks, bands), task)


@dataclass(frozen=True)
class _Pointwise:
    """One pointwise loop nest: its buffers, schedule and epilogue, `tile_w` positions
    per tile (no more than the image has) and `tiles` tiles per image."""

    shape: ConvShape
    x: Buffer
    wp: Buffer
    out: Buffer
    schedule: PointwiseSchedule
    epilogue: Epilogue
    tile_w: int
    tiles: int
    rest: int | None = None  # a run-time image: the last tile's positions (`pointwise_body`)

    @property
    def cb(self) -> int:
        return int(self.wp.shape[5])

    @property
    def blocks(self) -> int:
        """Channel tiles."""
        cout = self.shape.c_out
        if isinstance(cout, int):
            return -(-cout // self.cb)
        return cast(int, simplify_dim(cout // self.cb))  # whole tiles at run time

    @property
    def positions(self) -> int:
        return self.shape.out_h * self.shape.out_w

    @property
    def overflow(self) -> list[bool]:
        """Whether slot r of the last tile is past the image's end."""
        if self.rest is not None:
            return [0 < self.rest <= r for r in range(self.tile_w)]
        return [(self.tiles - 1) * self.tile_w + r >= self.positions
                for r in range(self.tile_w)]


def _tile(nest: _Pointwise, n: PrimExpr, ob: PrimExpr, t: PrimExpr,
          seg: Segment | None = None) -> Stmt:
    """Tile `t` of channel tile `ob` of image `n`: its sums (over the channels of `seg`,
    all without), then its stores (after the last segment; the partial sums kept after
    the others)."""
    acc = Buffer("acc", (nest.tile_w, nest.cb), nest.x.dtype, "local")
    head = tile_accumulators(acc, seg)
    rows: list[PrimExpr] = []
    cols: list[PrimExpr] = []
    head += tile_places(t, nest.tile_w, nest.shape.out_w, nest.positions, nest.overflow,
                        nest.rest is not None, rows, cols)
    red = _sums(nest, acc, n, ob, rows, cols, seg)
    finish = _stores(nest, acc, n, ob, t, rows, cols)
    return seq(*head, *red, finish if seg is None else segment_end(acc, seg, finish))


def _sums(nest: _Pointwise, acc: Buffer, n: PrimExpr, ob: PrimExpr, rows: list[PrimExpr],
          cols: list[PrimExpr], seg: Segment | None) -> list[Stmt]:
    """The loops summing the tile's input channels (those of `seg`, all without) into
    `acc`, block by block, each block's lanes unrolled (or a loop)."""
    x, wp, dtype, tile_w, cb = nest.x, nest.wp, nest.x.dtype, nest.tile_w, nest.cb
    block, fused = nest.schedule.block, nest.schedule.fused
    sh, sw = nest.shape.stride
    cin = nest.shape.c_in
    # a run-time count (kiln.kernels.conv.run_time_width) is whole blocks: the input's
    full, rest = divmod(cin, block) if isinstance(cin, int) else (x.shape[1], 0)

    def lane_step(cib: PrimExpr, lane: PrimExpr) -> Stmt:
        # the tile's input values of channel `cib * block + lane`, each bound once,
        # against one weight row
        xs = [Var(f"x{r}", dtype) for r in range(tile_w)]
        lets = [LetStmt(xv, x[n, cib, rows[r] * sh, cols[r] * sw, lane])
                for r, xv in enumerate(xs)]

        def step(v: PrimExpr) -> Stmt:
            wv = Var("w", dtype)
            return seq(LetStmt(wv, wp[_c(0), ob, cib * block + lane, _c(0), _c(0), v]),
                       *(Store(acc, madd(acc[_c(r), v], xs[r], wv, fused), (_c(r), v))
                         for r in range(tile_w)))

        def position(r: int) -> Stmt:
            def vector(v: PrimExpr) -> Stmt:
                w = wp[_c(0), ob, cib * block + lane, _c(0), _c(0), v]
                return Store(acc, madd(acc[_c(r), v], xs[r], w, fused), (_c(r), v))

            return seq(lets[r], lanes_loop("v", cb, vector))

        if nest.schedule.by_position:
            # all weight vectors live, one broadcast at a time: 3 x 4 accumulators, 3
            # weight vectors and a broadcast are AVX2's 16 registers (weight vector by
            # vector, LLVM loads the four broadcasts first and spills one)
            return seq(*(position(r) for r in range(tile_w)))
        return seq(*lets, lanes_loop("v", cb, step))

    def channels(cib: PrimExpr, lanes: int) -> Stmt:
        if not nest.schedule.unrolled and lanes > 1:
            return _loop("lane", lanes, lambda lane: lane_step(cib, lane))
        return seq(*(lane_step(cib, _c(lane)) for lane in range(lanes)))

    red: list[Stmt] = []
    if seg is not None:  # whole blocks of the segment's channels
        red.append(_loop("cib", seg.kc // block, lambda cib: channels(
            seg.ci0 // block + cib, block)))
    elif not isinstance(full, int) or full > 1:
        red.append(_loop("cib", full, lambda cib: channels(cib, block)))
    elif full:
        red.append(channels(_c(0), block))
    if rest and seg is None:
        red.append(channels(_c(full), rest))
    return red


def _stores(nest: _Pointwise, acc: Buffer, n: PrimExpr, ob: PrimExpr, t: PrimExpr,
            rows: list[PrimExpr], cols: list[PrimExpr]) -> Stmt:
    """The tile's NCHW{b}c stores (`blocked_tile_stores`) of its accumulators, staged in
    whole blocks: a tile ending in half a block (`half_vector`) stores zeros past it."""
    dtype, tile_w, cb, block = nest.x.dtype, nest.tile_w, nest.cb, nest.schedule.block
    wide = -(-cb // block) * block
    stage = Buffer("stage", (tile_w, wide), dtype, "local")
    copy = lanes_loop("v", cb, lambda v: seq(*(
        Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(tile_w))))
    if wide > cb:
        copy = seq(copy, lanes_loop("v", wide - cb, lambda v: seq(*(
            Store(stage, as_expr(0.0, dtype), (_c(r), v + cb)) for r in range(tile_w)))))
    overflow = nest.overflow
    real = [t * tile_w + r < nest.positions if overflow[r] else None for r in range(tile_w)]
    cout = nest.shape.c_out
    out_blocks = -(-cout // block) if isinstance(cout, int) else simplify_dim(cout // block)
    stores = blocked_tile_stores(nest.out, stage, nest.epilogue, n, ob, rows, cols, real,
                                 block, cout, nest.blocks, out_blocks)
    return seq(Allocate(stage), copy, *stores)
