"""Padding per band: a padded convolution's tiles as one parallel loop over bands of
output rows, each band zero-padding the input rows it reads into a buffer of its own
(`band_copy`): the row-tiled kernel's `banded_rows` and the NCHW blocked kernel's
`banded_tiles`. A thread then reads the padded copy it wrote itself.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    seq,
)
from kiln.kernels.conv.padding import PhaseReader, padded_plane_dims
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import lanes_loop, parallel_tiles
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops.conv_geometry import ConvShape

#: Bands of output rows a padded row-tiled convolution is split into (fewer on an image
#: of fewer rows), their heights within one of each other: two, four or eight threads
#: then take equal shares of whole bands. (Bands of `out_h // 8` rows made 9 bands of
#: SqueezeNet's 109- and 54-row layers: shares of 5 and 4 bands on two threads.)
ROW_BANDS = 8


def banded_rows(shape: ConvShape, x: Buffer, blocks: int, per_row: int,
                run: Callable[..., Stmt]) -> Stmt:
    """The tiles of a padded row-tiled convolution as one parallel loop over bands of
    output rows, each band zero-padding the input rows it reads into a buffer of its
    own (`band_copy`) and then running its tiles (`run(n, block, row, tile, reader)`). A
    padded copy of the whole input made before the tile loop is written by one thread and
    read by all: every call then moves it between the cores' caches, which cost more than
    the second thread saved; with bands the copy a thread reads is its own. The rows
    around a band are copied twice."""
    sh, dh = shape.stride[0], shape.dilation[0]
    bands = min(ROW_BANDS, shape.out_h)
    band = -(-shape.out_h // bands)  # the tallest band's rows
    rows_in = (band - 1) * sh + (shape.kh - 1) * dh + 1  # padded rows a band reads

    def body(n: PrimExpr, b: PrimExpr) -> Stmt:
        # band b: output rows b * out_h // bands .. (b + 1) * out_h // bands
        even = shape.out_h % bands == 0
        first_row: PrimExpr = b * band if even else b * shape.out_h // bands
        copy, read = band_copy(shape, x, n, first_row * sh, rows_in, shape.stride[1])
        here: PrimExpr = (_c(band) if even
                          else (b + 1) * shape.out_h // bands - first_row)
        j = Var("j", INDEX_DTYPE)
        tiles = _loop("ob", blocks, lambda ob: For(j, _c(0), here, "serial", _loop(
            "t", per_row, lambda t: run(n, ob, first_row + j, t, read))))
        return seq(*copy, tiles)

    return parallel_tiles((shape.n, bands), body)


def band_copy(shape: ConvShape, x: Buffer, n: PrimExpr, row0: PrimExpr, rows_in: int,
              phases: int = 1) -> tuple[list[Stmt], PhaseReader]:
    """The statements copying padded rows `row0 .. row0 + rows_in` of image `n`, zero
    padded and split into `phases` column phases (as `padded_input`), into a buffer of
    the task's own, and the reader of that buffer (at padded rows, as `padded_input`'s)."""
    sw = phases
    top, left = shape.pads[0], shape.pads[1]
    _, _, wq = padded_plane_dims(shape, sw)
    zero = as_expr(0.0, x.dtype)
    xb = Buffer("xband", (shape.c_in, sw, rows_in, wq), x.dtype)

    def fill(c: PrimExpr) -> Stmt:
        parts: list[Stmt] = []
        for p in range(sw):
            lo = max(0, -(-(left - p) // sw))
            hi = min(wq - 1, (left + shape.w - 1 - p) // sw)

            def zeros(r: PrimExpr, q0: int, q1: int, p: int = p) -> list[Stmt]:
                return [_loop("q", q1 - q0, lambda q: Store(xb, zero, (c, _c(p), r, q)),
                              start=q0)] if q1 > q0 else []

            def row(r: Var, p: int = p, lo: int = lo, hi: int = hi) -> Stmt:
                if hi < lo:
                    return seq(*zeros(r, 0, wq))
                src = row0 + r - top

                def put(q: PrimExpr, p: int = p, lo: int = lo) -> Stmt:
                    return Store(xb, x[n, c, src, (q + lo) * sw + (p - left)],
                                 (c, _c(p), r, q + lo))

                # One phase (stride 1) reads the row's columns consecutively: a vector
                # loop (a serial one was left as scalar copies).
                cols = (lanes_loop("q", hi - lo + 1, put) if sw == 1
                        else _loop("q", hi - lo + 1, put))
                copy = seq(*zeros(r, 0, lo), cols, *zeros(r, hi + 1, wq))
                # each branch its own loops (a loop variable is bound once)
                return IfThenElse(src >= 0, IfThenElse(src < shape.h, copy, seq(
                    *zeros(r, 0, wq))), seq(*zeros(r, 0, wq)))

            parts.append(_loop("r", rows_in, row))
        return seq(*parts)

    def read(n_: PrimExpr, c: PrimExpr, i: PrimExpr, p: PrimExpr, q: PrimExpr) -> PrimExpr:
        return xb[c, p, i - row0, q]

    return [Allocate(xb), _loop("c", shape.c_in, fill)], read


def banded_tiles(shape: ConvShape, x: Buffer, tiles: int, tile_w: int, blocks: int,
                 run: Callable[[PrimExpr, PrimExpr, PrimExpr, PhaseReader], Stmt]) -> Stmt:
    """The tiles of a padded NCHW blocked convolution as one parallel loop over bands of
    consecutive tiles (`ROW_BANDS` of them, as `banded_rows`), each band zero-padding the
    input rows its tiles read into a buffer of its own (`band_copy`) and then running
    `run(n, channel block, tile, reader)` for every channel block and tile of the band.
    A padded copy of the whole input made before the tiles, split over the threads by
    channel, is read by every thread's tiles: it moves between the cores' caches."""
    per = -(-tiles // min(ROW_BANDS, tiles))  # tiles per band
    bands = -(-tiles // per)
    positions = shape.out_h * shape.out_w
    sh, dh = shape.stride[0], shape.dilation[0]

    def first_row(b: int) -> int:
        return b * per * tile_w // shape.out_w

    def last_row(b: int) -> int:
        return (min((b + 1) * per * tile_w, positions) - 1) // shape.out_w

    # padded rows the tallest band reads
    rows_in = max((last_row(b) - first_row(b)) * sh for b in range(bands)) \
        + (shape.kh - 1) * dh + 1

    def body(n: PrimExpr, b: PrimExpr) -> Stmt:
        copy, read = band_copy(shape, x, n, b * per * tile_w // shape.out_w * sh, rows_in)

        def one(ob: PrimExpr, tt: PrimExpr) -> Stmt:
            t = Var("t", INDEX_DTYPE)
            stmt = run(n, ob, t, read)
            if tiles % per:
                stmt = IfThenElse(t < tiles, stmt)
            return seq(LetStmt(t, b * per + tt), stmt)

        return seq(*copy, _nest(("ob", "tt"), (blocks, per), one))

    return parallel_tiles((shape.n, bands), body)
