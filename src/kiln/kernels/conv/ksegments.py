"""K-blocked sums of the blocked convolution kernels (`blocked_conv_body`, the NCHWc
`pointwise_body`): a parallel task sums a segment of the input channels over all of
its band of tiles before the next segment, the tiles' partial sums kept in a buffer of
the task's (`segmented_band`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import lanes_loop


@dataclass(frozen=True)
class ConvKBlocking:
    """How the blocked kernel splits its sums (`blocked_conv_body`): `kc` input channels
    per segment (a divisor of the group's), `band` tiles per parallel task."""

    kc: int
    band: int


@dataclass(frozen=True)
class Segment:
    """One segment of a K-blocked tile's sums: channels `ci0 .. ci0 + kc` of tile `tile`
    of the task's partial sums `part`; `first`/`last`: whether it is the first / last."""

    part: Buffer
    tile: PrimExpr
    ci0: PrimExpr
    kc: int
    first: PrimExpr
    last: PrimExpr


def tile_accumulators(acc: Buffer, seg: Segment | None) -> list[Stmt]:
    """`acc` (a tile's `[tile_w][cb]` accumulators) allocated and zeroed; in a segment
    after the first, loaded from the partial sums instead."""
    tile_w, cb = (int(d) for d in acc.shape)
    zero = lanes_loop("v", cb, lambda v: seq(*(
        Store(acc, as_expr(0.0, acc.dtype), (_c(r), v)) for r in range(tile_w))))
    if seg is None:
        return [Allocate(acc), zero]
    return [Allocate(acc), IfThenElse(seg.first, zero, lanes_loop("v", cb, lambda v: seq(*(
        Store(acc, seg.part[seg.tile, _c(r), v], (_c(r), v)) for r in range(tile_w)))))]


def segment_end(acc: Buffer, seg: Segment, finish: Stmt) -> Stmt:
    """`finish` (the tile's stores) after the last segment; the partial sums kept after
    the others."""
    tile_w, cb = (int(d) for d in acc.shape)
    keep = lanes_loop("v", cb, lambda v: seq(*(
        Store(seg.part, acc[_c(r), v], (seg.tile, _c(r), v)) for r in range(tile_w))))
    return IfThenElse(seg.last, finish, keep)


def segmented_band(kblock: ConvKBlocking, channels: int, tiles: int, b: PrimExpr,
                   tile: tuple[int, int], dtype: str,
                   body: Callable[[PrimExpr, Segment], Stmt]) -> Stmt:
    """Band `b` of `kblock.band` consecutive tiles (of `tiles`), each `tile` = `(tile_w,
    cb)` accumulators, summed `kblock.kc` of `channels` input channels at a time: every
    tile's segment (`body(tile index, segment)`) before the next segment, the partial
    sums in a buffer of the band's."""
    kc, band = kblock.kc, min(kblock.band, tiles)
    segments = channels // kc
    part = Buffer("part", (band, *tile), dtype)
    here: PrimExpr = _c(band) if tiles % band == 0 else min_(band, tiles - b * band)
    k, tt = Var("kseg", INDEX_DTYPE), Var("tt", INDEX_DTYPE)
    seg = Segment(part, tt, k * kc, kc, compare("eq", k, 0), compare("eq", k, segments - 1))
    return seq(Allocate(part), For(k, _c(0), _c(segments), "serial", For(
        tt, _c(0), here, "serial", body(b * band + tt, seg))))
