"""The dot-form convolution read in place (kiln.kernels.int8.conv_dot): a stride-1 2-D
convolution whose input words are 4 channels of one tap reads them where they lie in a
padded grid, with no im2col (`in_place`), where that computes few positions more than
the im2col's tiles (`in_place_pays`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kiln.ir.tensor import Allocate, Buffer, DeclBuffer, PrimExpr, Stmt, Store, seq
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_input import ConvInput, padded_words
from kiln.kernels.int8.conv_tile import ConvTile, position_rows
from kiln.kernels.int8.conv_tiles import InPlace, RowEpilogue, flat_output, position_tiles
from kiln.kernels.tiles import nest
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.target.isa import ISA

#: The grid positions an in-place convolution computes (`in_place`: the padding columns
#: too), at most this many times the output positions the im2col's tiles compute: the
#: im2col's copy of words costs less than a few more positions, not than many.
IN_PLACE_WASTE = 1.05


def in_place_width(x_shape: Sequence[int], begins: Sequence[int], ends: Sequence[int]
                   ) -> int:
    """The columns of a row of `in_place`'s grid: the input's (NCHW `x_shape`) and the
    larger of its left and right padding, which the rows share (a row's right padding is
    the next row's left padding)."""
    return int(x_shape[3]) + max(begins[1], ends[1])


def in_place_cols(isa: ISA, extent: int) -> int:
    """Columns of the in-place tile over `extent` grid positions: the widest positions
    tile, or the width that leaves no partial tile where that one would (`dot.tile_cols_for`:
    3136 positions of a 56 x 56 1x1 layer in tiles of 32, not 48), so that an unpadded
    grid is the output's and its tiles store into it."""
    nr = min(dot.position_tile_cols(isa), extent)
    whole = dot.tile_cols_for(isa, extent)
    return whole if extent % nr and not extent % whole else nr


def in_place_pays(isa: ISA, spatial: Sequence[int], width: int) -> bool:
    """Whether a stride-1 convolution with output `spatial` on a grid `width` columns wide
    runs in place (`in_place`) rather than on an im2col of words. Not on a grid as wide
    as the output (an unpadded 1x1 layer) whose tiles leave a partial one (28 x 28 = 784
    positions in tiles of 32): in place it would compute into a grid of whole tiles and
    copy that into the output row by row, which costs more than its im2col, a copy of
    the input's words in one contiguous loop per word."""
    lanes = isa.lanes("int32")
    grid = dot.computed_cols(spatial[0] * width, in_place_cols(isa, spatial[0] * width), lanes)
    if width == spatial[1] and grid != spatial[0] * width:
        return False
    positions = int(np.prod(spatial))
    im2col = dot.computed_cols(positions, dot.tile_cols_for(isa, positions), lanes)
    return grid <= IN_PLACE_WASTE * im2col


def in_place(source: ConvInput, ww: Buffer, x_zp: Buffer, out: Buffer, out_words: bool,
             epilogue: RowEpilogue, ws: Sequence[int], begins: Sequence[int],
             ends: Sequence[int], dilations: Sequence[int], big: bool, isa: ISA,
             intrinsic: str) -> Stmt:
    """A stride-1 2-D convolution with k = (tap, c) and C a multiple of 4
    (`int8-pairs=saturate`) on the positions tile without an im2col: the input is copied
    once as words of 4 channels on a padded grid (`padded_words`) of W' = W + P columns,
    P the larger of the left and right padding, all of it on the left: a row's taps past
    its right end read the next row's padding, and those before its left end its own.
    The tile's lanes are grid positions q = o0 W' + o1, whose word of tap (t0, t1) and
    channels 4 c4 .. 4 c4 + 3 is the grid's word c4 at q + t0 W' + t1 (dilated; shifted by
    P less the left padding): read in place, as onnxruntime's symmetric convolution
    kernel reads its NHWC input. The P columns past each output row are computed too and
    left out when the tiles' output grid is copied into the output (a contiguous copy
    per row). The grid has rows enough below the image (the zero point's) that the last
    tile reads inside it. Where the grid is the output's (an unpadded 1x1 convolution on
    whole tiles) the tiles store into the output itself; and an input in words
    (WORDS_LAYOUT) of unsigned bytes that needs no padding is read where it is."""
    x_shape = source.shape
    batch, oc_n = int(out.shape[0]), int(ws[0])
    rows_out, cols_out = int(out.shape[2]), int(out.shape[3])
    width = in_place_width(x_shape, begins, ends)
    shift = width - x_shape[3] - begins[1]
    # the widest tile: one vector broadcasts a weight word per accumulator and step
    nr = in_place_cols(isa, rows_out * width)
    tile = ConvTile(False, position_rows(isa, nr, oc_n, out_words), nr)
    # the last column tile narrowed to the vectors its positions fill (`dot.tail_cols`):
    # 784 positions of a 28 x 28 1x1 layer are 16 tiles of 48 and one of 16, the grid the
    # output's
    lanes = isa.lanes("int32")
    cols = dot.computed_cols(rows_out * width, nr, lanes)
    reach = cols - 1 + (ws[2] - 1) * dilations[0] * width + (ws[3] - 1) * dilations[1] + shift
    below = max(int(ends[0]), reach // width + 1 - x_shape[2] - begins[0])
    xw, pad = padded_words(source, x_zp, (begins[0], width - x_shape[3]), (below, 0))
    grid = Buffer("x_grid", (batch, int(xw.shape[1]), int(xw.shape[2]) * width), "int32")
    quarter = int(ws[1]) // qw.GROUP

    def read(n: PrimExpr, t: PrimExpr, c4: PrimExpr, q: PrimExpr) -> PrimExpr:
        kk = te.unflatten_index(t, ws[2:])
        return grid[n, c4, q + kk[0] * (dilations[0] * width) + kk[1] * dilations[1] + shift]

    bytes_of = str(epilogue.y_zp.dtype) if out_words else None
    if width == cols_out and cols == rows_out * cols_out:
        flat = flat_output(out, out_words, cols)
        tiles = position_tiles(InPlace(quarter, read), ww, flat, tile, epilogue, cols,
                                oc_n, big, intrinsic, out_bytes=bytes_of, lanes=lanes)
        return seq(pad, DeclBuffer(grid, xw, 0), DeclBuffer(flat, out, 0), tiles)
    # the output grid, then its rows without the padding columns
    rows_of = oc_n // qw.GROUP if out_words else oc_n
    dtype = "int32" if out_words else out.dtype
    out_grid = Buffer("out_grid", (batch, rows_of, cols), dtype, "global")
    # a fused residual add (kiln.kernels.int8.conv_residual) is applied as the rows are
    # copied out, where the residual's elements are at the output's places
    tiles = position_tiles(InPlace(quarter, read), ww, out_grid, tile,
                           replace(epilogue, residual=None), cols, oc_n, big, intrinsic,
                           out_bytes=bytes_of, lanes=lanes)
    target = Buffer("out_rows", (batch, rows_of, rows_out, cols_out), dtype)
    res = epilogue.residual.at(target) if epilogue.residual is not None else None
    regs = res.registers() if res is not None else None

    def row_value(n: PrimExpr, oc: PrimExpr, o0: PrimExpr, o1: PrimExpr) -> PrimExpr:
        value = out_grid[n, oc, o0 * width + o1]
        if res is None or regs is None:
            return value
        at = res.view[n, oc, o0, o1]
        return res.word(regs, value, at) if out_words else \
            res.value(regs, res.shifted(value), res.element(at))

    compact = nest(("n", "oc", "o0", "o1"), (batch, rows_of, rows_out, cols_out),
                   lambda n, oc, o0, o1: Store(target, row_value(n, oc, o0, o1),
                                               (n, oc, o0, o1)))
    adds = (res.decl(), Allocate(regs), res.load(regs)) \
        if res is not None and regs is not None else ()
    return seq(pad, DeclBuffer(grid, xw, 0), Allocate(out_grid), tiles,
               DeclBuffer(target, out, 0), *adds, compact)
