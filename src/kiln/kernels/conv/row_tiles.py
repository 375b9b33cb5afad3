"""The tiles along one output row of the row-tiled and window kernels: runs of full
tiles, then what is left as whole vectors, then the last columns (`row_tiles`,
`tiled_row`), and the rule's tile width (`rows_tile_width`).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.tensor import PrimExpr, Stmt, Var, seq
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop


def row_tiles(out_w: int, tile_w: int, lanes: int) -> list[tuple[int, int, int]]:
    """(first tile start, number of tiles, width) runs covering one output row: tiles of
    `tile_w`, then what is left as whole vectors, then the last few columns. Widths that
    are whole vectors fill the registers; any other width costs a partial register per
    accumulator row."""
    runs = []
    full = out_w // tile_w
    if full:
        runs.append((0, full, tile_w))
    start = full * tile_w
    rest = out_w - start
    if rest >= lanes and rest % lanes:
        runs.append((start, 1, rest // lanes * lanes))
        start += rest // lanes * lanes
        rest = out_w - start
    if rest:
        runs.append((start, 1, rest))
    return runs


def tiled_row(out_w: int, tile_w: int, lanes: int,
              tile: Callable[[PrimExpr, int], Stmt]) -> Stmt:
    """One output row as the runs of `row_tiles`: `tile(first column, width)` for each
    tile, a loop over a run of several."""
    parts: list[Stmt] = []
    for start, count, width in row_tiles(out_w, tile_w, lanes):
        if count == 1:
            parts.append(tile(_c(start), width))
        else:
            def run(t: Var, wd: int = width, s: int = start) -> Stmt:
                return tile(t * wd + s, wd)

            parts.append(_loop("owt", count, run))
    return seq(*parts)


def rows_tile_width(width: int, lanes: int) -> int:
    """Output columns per row tile: two vectors (12 accumulators for 6 rows fit AVX2's 16
    registers with an input vector pair and a broadcast weight), one for narrower rows,
    the whole row when it is narrower than a vector."""
    if width >= 2 * lanes:
        return 2 * lanes
    return lanes if width >= lanes else width
