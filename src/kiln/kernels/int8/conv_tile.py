"""The register tile of the dot-form convolution (`qlinear_conv_dot`,
kiln.kernels.int8.conv_dot): which tile a convolution takes (`choose_tile`) and how many
rows it has, from an estimate of the instructions of all its tiles.

The positions tile has rows of output channels (a broadcast weight word each) x `nr`
output positions (vectors of input words). Where the output positions fill the vectors
badly (7 x 7 = 49 positions in 64 lanes) the tile is transposed: output channels are the
lanes and output positions the rows (a broadcast input word each), as in a matrix
product whose B is the weight (its weight packed in panels of the tile's channels,
kiln.ops.quant_words.weight_panels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.ir.types import TensorType
from kiln.kernels.int8 import dot
from kiln.ops import quant_words as qw
from kiln.ops.quant_conv_words import writes_words
from kiln.target.isa import ISA


@dataclass(frozen=True)
class ConvTile:
    """A register tile of the dot-form convolution: `rows` x `cols` int32 accumulators,
    output positions as the lanes (`cols` positions, `rows` channels) or, with
    `channels_as_lanes`, output channels (`cols` channels, `rows` positions)."""

    channels_as_lanes: bool
    rows: int
    cols: int


#: Weight of a load or broadcast against a dot product (they issue on ports of their own).
LOAD_WEIGHT = 0.125
#: The same for the `vpmaddubsw` tiles of `int8-pairs=saturate` (`step_cost`).
MADDUBS_LOAD_WEIGHT = 1.0
#: The same for the int16-pair tiles (`dot.PAIRS16`: a step is 2 k, so twice the
#: loads of a step of 4 k per product).
PAIRS16_LOAD_WEIGHT = 0.5


def step_cost(isa: ISA, rows: int, vectors: int) -> float:
    """Vector instructions of one step (a word: 4 k, or 2 k of int16 pairs) of a tile,
    loads weighted by LOAD_WEIGHT: a dot product per accumulator, a broadcast per row and
    a load per vector."""
    if isa.int8_dot == dot.PAIRS16:
        # vpmaddwd and an add per accumulator and 2 k
        return 2 * rows * vectors + (rows + vectors) * PAIRS16_LOAD_WEIGHT
    if isa.int8_dot == dot.MADDUBS:
        # vpmaddubsw, vpmaddwd by ones and an add per accumulator (int8-pairs=saturate);
        # a load or broadcast weighs as one of those (a lighter weight keeps positions
        # tiles of one vector, whose broadcasts then bound every step)
        return 3 * rows * vectors + (rows + vectors) * MADDUBS_LOAD_WEIGHT
    return rows * vectors + (rows + vectors) * LOAD_WEIGHT


def tile_cost(isa: ISA, tile: ConvTile, positions: int, channels: int, k: int) -> float:
    """The estimated instructions of all tiles of a convolution (K = `k`), the padded
    rows and lanes of partial tiles included: every step, and an epilogue of a vector
    per accumulator register (positions as lanes: contiguous stores) or of a scalar
    copy per output (channels as lanes: the output bytes move out a channel at a time;
    with `int8-pairs=saturate` a word of 4 positions at a time where the tile stores
    words, `word_stores`: counted there only, as with it VNNI's choice would move some
    layers to channels tiles that run slower)."""
    vectors = max(1, -(-tile.cols // isa.lanes("int32")))
    rows, cols = (positions, channels) if tile.channels_as_lanes else (channels, positions)
    tiles = -(-rows // tile.rows) * -(-cols // tile.cols)
    if not tile.channels_as_lanes:
        epilogue = tile.rows * vectors
    elif isa.int8_dot == dot.MADDUBS and word_stores(tile.rows, positions):
        epilogue = tile.cols
    else:
        epilogue = tile.rows * tile.cols
    return tiles * (-(-k // dot.k_group(isa)) * step_cost(isa, tile.rows, vectors)
                    + epilogue)


def word_stores(rows: int, positions: int) -> bool:
    """Whether a channels tile of `rows` rows stores each channel's output bytes as one
    word (kiln.kernels.int8.conv_tiles.channel_tiles): 4 rows, every tile's positions a
    whole word of the output."""
    return rows == qw.GROUP and positions % qw.GROUP == 0


#: Instructions of a channels tile beyond its steps and its per-output epilogue (the
#: `vpmaddubsw` tiles of `int8-pairs=saturate`): the requantization's setup, the loop
#: and the rows' word places. With it 14 x 14 = 196 positions take 49 tiles of 4 rows
#: (no padded row, each channel's bytes one word: `word_stores`) over 40 of 5; 7 x 7
#: keeps 10 tiles of 5.
MADDUBS_TILE_OVERHEAD = 200.0


def channel_rows(isa: ISA, positions: int, nr: int, k: int) -> int:
    """Rows (output positions) of a channels-as-lanes tile `nr` channels wide: of the
    row counts the registers hold, the one with the fewest estimated instructions for
    all positions (49 positions: 7 rows of 3 vectors, not 6 of 4 padded to 54); of
    counts within 2% of that, the most rows (the estimate undercounts the loads of few).
    The `vpmaddubsw` tiles, bound by their products, count a fixed cost per tile
    instead (MADDUBS_TILE_OVERHEAD) and take the least."""
    top = min(dot.tile_rows(isa, nr), positions)
    costs = {mr: tile_cost(isa, ConvTile(True, mr, nr), positions, nr, k)
             for mr in range(1, top + 1)}
    if isa.int8_dot == dot.MADDUBS:
        costs = {mr: cost + MADDUBS_TILE_OVERHEAD * -(-positions // mr)
                 for mr, cost in costs.items()}
        return min(costs, key=lambda mr: (costs[mr], -mr))
    least = min(costs.values())
    return max(mr for mr, cost in costs.items() if cost <= 1.02 * least)


def position_rows(isa: ISA, nr: int, channels: int, words: bool = False) -> int:
    """Rows (output channels, a broadcast weight word each) of a positions tile `nr`
    positions wide: as many as the registers hold (`dot.tile_rows`), one fewer for
    the `vpmaddubsw` pairs of `int8-pairs=saturate` on 16 registers (AVX2). There 5 rows
    of 2 vectors fill 15 registers in the steps (10 accumulators, the row of words, the
    broadcast, the product and the ones), the requantizing epilogue spills, and 5 rows
    never divide the 2^n channels of a network, so every tile clamps its weight rows
    and guards its stores; 4 rows do neither (VNNI and the int16 pairs gain nothing from
    fewer rows and keep theirs). With `words` (an output in WORDS_LAYOUT: each 4 rows
    store a word per position) a multiple of 4."""
    rows = dot.tile_rows(isa, nr)
    if isa.int8_dot == dot.MADDUBS and isa.vector_registers <= 16 and rows > 1:
        rows -= 1
    if words:  # (channels are a multiple of 4 there)
        rows = max(qw.GROUP, rows - rows % qw.GROUP)
    return min(rows, channels)


def transpose_gain(isa: ISA) -> float:
    """How much cheaper the transposed tile must be estimated to be taken: the kernel
    profile's margin, its VNNI one where one instruction accumulates."""
    profile = isa.profile
    if isa.int8_dot in dot.EXACT_FAMILIES and profile.int8_vnni_transpose_gain:
        return profile.int8_vnni_transpose_gain
    return profile.int8_transpose_gain


def choose_tile(isa: ISA, positions: int, channels: int, k: int) -> ConvTile:
    """The tile of a convolution with `positions` output positions (per image),
    `channels` output channels and K = `k` (input channels x kernel taps). Output
    positions are the lanes (`dot.tile_cols_for`) unless they fill the vectors
    badly (7 x 7 = 49 positions in 64 lanes): then output channels are
    (`channels_as_lanes`), when the estimated instructions of all its tiles
    (`tile_cost`) are below `transpose_gain` times the positions tile's."""
    nr = dot.tile_cols_for(isa, positions)
    best = ConvTile(False, position_rows(isa, nr, channels), nr)
    lanes = isa.lanes("int32")
    if not isa.vector_bits or channels < lanes:
        return best
    cost = tile_cost(isa, best, positions, channels, k) * transpose_gain(isa)
    for width in range(min(dot.tile_cols(isa), -(-channels // lanes) * lanes), 0,
                       -lanes):
        tile = ConvTile(True, channel_rows(isa, positions, width, k), width)
        candidate = tile_cost(isa, tile, positions, channels, k)
        if candidate < cost:
            best, cost = tile, candidate
    return best


def stores_words(call: Any, isa: ISA) -> bool:
    """Whether dot-form convolution `call` (a graph call with NCHW output) can write its
    output in WORDS_LAYOUT at no cost to its tile: a channels tile (its rows' channels
    are words already), or a positions tile whose rows, at each width it may take, are a
    multiple of 4 (`position_rows`: 4 on AVX2 with `int8-pairs=saturate`, where each 4
    rows store a word per position; 6 on AVX-512 at 64 positions would narrow to 4)."""
    out, ww = call.ret_type, call.args[1].type
    if not isinstance(out, TensorType) or not writes_words(call.attrs, out):
        return False
    dot_isa = dot.target_isa(isa, qw.saturates(call.attrs))
    if dot_isa is None or dot.k_group(dot_isa) != qw.word_group(call.attrs):
        return False  # the te definition (words packed for another target)
    if ww.ndim == 3:
        return True
    # static but for the batch (kiln.transform.quant_layout)
    dims = (0, *(cast(int, d) for d in out.shape[1:]))
    positions = int(np.prod(dims[2:]))
    widths = {dot.tile_cols_for(dot_isa, positions), dot.position_tile_cols(dot_isa)}
    return all(position_rows(dot_isa, nr, dims[1]) % qw.GROUP == 0 for nr in widths)


def narrows_by_packs(isa: ISA) -> bool:
    """Whether the positions tile's requantized rows are clamped as integers too, so that
    LLVM narrows them with saturating packs (`requantize_value(packs=True)`): x86 up to
    AVX2, where that saves a mask per vector; AVX-512 narrows a vector with one
    `vpmovdb`, where the clamps only add instructions."""
    return isa.arch in ("x86_64", "x86", "i686") and isa.vector_bits <= 256
