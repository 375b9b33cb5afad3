"""The bfloat16 NCHWc convolution (`conv2d_nchwc_bf16`, kiln.ops.conv_bf16): float32
NCHW{b}c activations by bfloat16 weights packed at compile time, float32 sums, for
targets with `precision=bf16` (kiln.target.precision).

The input is converted once, before the tiles, into a workspace of bfloat16 words
`[n][P][rows][cols][b]` (`[n][P][rows * cols][b]` for a 1x1 layer at stride 1, whose
tiles then read their positions at constant distances; `converted_input`): word
`(p, j)` of a position pairs lane `j` of channel blocks `2p` and `2p + 1` (the pairing
`pack_conv_bf16` gave the weight), two contiguous runs of `b` floats, so the conversion
is vector code; the zero border of a padded layer is written in the same pass (words of
two zeros), and an unpadded strided 1x1 layer converts only the positions it reads and
then runs at stride 1. Each input value is thus rounded once per layer rather than once
per tile of output channels that reads it, and the workspace is half the float32
input's bytes. A region's first
layer reads an NCHW input of fewer channels than a block (an RGB image) as blocks of one
channel: its words pair channels (0, 1), (2, 3), ... (an odd last one with zero), each
row converted as one vector; or, where that pairs an odd channel with zero at every tap
(`row_taps_pay`: an RGB image under a 7x7 kernel), its words pair neighbouring columns
of each channel (`row_tap_input`), the sums then a kernel of half the columns, dilated
twice. A non-finite input value then also reaches the outputs whose zero-weight half
of a last column's word pairs it.
A 1x1 stride-1 unpadded layer of one channel tile (`stages_input`: MobileNetV2's
projections) has no workspace: each tile converts its own positions' words into a stage
on the stack and sums from it, which saves the workspace's write and read back and a
parallel loop; no word is converted twice, as the tile is the only one to read them.

A layer whose producer stored its words (attribute `words_input`, kiln.transform.
bf16_words) reads them as that workspace, converting nothing; a producer storing them
rounds its tiles' outputs into them after the epilogue (kiln.kernels.conv.bf16_words).

A tile is `tile_w` consecutive output positions x `cb` output channels of accumulators
held at constant rows (registers), as the float32 blocked kernel's
(kiln.kernels.conv.blocked); per input word and kernel tap, one broadcast word per
position and `tile_w * cb` float32 lanes of `dot2_bf16` (one `vdpbf16ps` per 16 lanes:
two multiply-adds each). Each output goes through the fused epilogue (bias, folded
BatchNorm, activations, a residual add) in float32 as it is stored, NCHW{b}c, the
padding channels zero (`blocked_tile_stores`). On a small image with large weights
(`prefetches_bf16_weights`) a channel tile's last tiles prefetch the next channel
tile's weights (kiln.kernels.prefetch), which would otherwise come from memory in a
burst at its first tile.

An unpadded 1x1 layer at stride 1 over whole pairs of input blocks whose tiles neither
prefetch nor stage their input (`run_time_width`) takes its input's channel blocks and
its weight's word rows at run time, as the float32 blocked kernel does
(kiln.kernels.conv.run_time_width): DenseNet-121's bottlenecks, 58 widths, share one
kernel per image size and tile (reading the words their BatchNorm + ReLU stored: the
pairs of blocks at run time). The sums run in the same order, so the outputs are the
static kernel's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir.analysis.tensor_queries import read_buffers
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_CONV_KERNEL, ATTR_NO_SLP
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import (
    DOT2_BF16,
    Allocate,
    Buffer,
    IfThenElse,
    Intrin,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    select,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.conv.bf16_words import (
    stored_words,
    word_tile_stores,
    words_output,
    zero_border,
)
from kiln.kernels.conv.blocked import blocked_tile_stores, choose_tiling
from kiln.kernels.conv.direct import PREFETCH_MAX_POSITIONS, PREFETCH_WEIGHT_L2_SHARE
from kiln.kernels.conv.family import blocked_bias
from kiln.kernels.conv.nchwc import POINTWISE_VECTORS, pointwise_tile, wide_tile
from kiln.kernels.conv.run_time_width import WIDTH_NAME
from kiln.kernels.epilogue import float32_operands
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.prefetch import LINE_BYTES, WeightPrefetch
from kiln.kernels.registry import Family
from kiln.kernels.tiles import (
    Epilogue,
    lanes_loop,
    parallel_tiles,
    parallel_when,
    tile_lanes,
    tile_registers,
)
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops import layout, te
from kiln.ops.conv_bf16 import (
    CONV_BF16,
    HALF_WORDS,
    ROW_TAPS,
    WORDS_INPUT,
    bf16_conv_shape,
    conv_blocks,
    pack_conv_bf16,
    pack_row_taps,
    pair_blocks,
    row_taps_pay,
    stem_stays_float32,
    word_block,
    words_source,
)
from kiln.ops.conv_direct import NCHW_INPUT_BLOCK, unpack_blocked_weight
from kiln.ops.conv_geometry import ConvShape, conv_shape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.ops.registry import call as make_call
from kiln.target.isa import ISA

#: The output positions from which a two-vector 1x1 tile keeps 8 positions (the float32
#: pointwise rule's) rather than `widened`'s 10: 2 x 8 ran 2.4-3.9% faster (one layer
#: level) on the 54x54 and 56x56 layers of MobileNetV2, SqueezeNet and EfficientNet-B0;
#: on 28x28 and smaller images faster on some layers and slower on others
#: (docs/performance.md, round thirty-three).
TWO_VECTOR_8_POSITIONS = 2500


def bf16_tile(shape: ConvShape, isa: ISA) -> tuple[int, int]:
    """`(cb, tile_w)` of a layer: the float32 NCHWc kernel's rule (kiln.kernels.conv.nchwc:
    `pointwise_tile` for a 1x1 layer, `wide_tile` for a large image, else the blocked
    rule's two vectors x 6 positions), `widened` to the profile's
    `bf16_min_accumulators` (a 1x1 layer's 1 x 8 tiles too, and its 2 x 8 ones on fewer than
    `TWO_VECTOR_8_POSITIONS` positions), in whole vectors.
    The register budget is the float32 kernel's: a `vdpbf16ps` accumulator is a float32
    vector."""
    lanes, positions = tile_lanes(isa), shape.out_h * shape.out_w
    tile = (pointwise_tile(shape.c_out, positions, isa) if (shape.kh, shape.kw) == (1, 1)
            else wide_tile(shape.c_out, positions, isa))
    if tile is None:
        t = choose_tiling(shape, lanes, tile_registers(isa))
        tile = (t.cb, t.tile_w)
    return widened(shape, tile, isa)


def widened(shape: ConvShape, tile: tuple[int, int], isa: ISA) -> tuple[int, int]:
    """`tile`, or where it holds fewer accumulators than `isa.profile.bf16_min_accumulators`
    a wider one: the vectors (4 to 1) that pad the fewest output channels, the most on ties
    (`pointwise_tile`'s choice), by the positions that reach the floor, at most those that
    fit the registers with a weight vector each and a broadcast per position (4 x 5,
    3 x 7, 2 x 10, 1 x 15 on 32 registers), then evened out over the tiles that takes
    (16 positions: 2 tiles of 8, not 15 and 1); a 1x1 tile of two vectors over
    `TWO_VECTOR_8_POSITIONS` and more keeps at most 8 positions. A layer that is not 1x1
    and has more than one vector of outputs takes two vectors or more, though they pad a
    vector: one vector's tile loads a broadcast word per multiply-add, two halve that
    (GoogLeNet's 96 > 208 3x3 at 14x14, 13 vectors: 1 x 14 ran about 15% slower than
    2 x 10; a 1x1 layer of 7 vectors ran level either way)."""
    lanes, registers = tile_lanes(isa), tile_registers(isa)
    least = isa.profile.bf16_min_accumulators
    if tile[0] // lanes * tile[1] >= least:
        return tile
    vecs = -(-shape.c_out // lanes)
    fewest = 2 if vecs > 1 and (shape.kh, shape.kw) != (1, 1) else 1
    v = min(range(min(POINTWISE_VECTORS, vecs), fewest - 1, -1),
            key=lambda v: -(-vecs // v) * v)
    positions = shape.out_h * shape.out_w
    width = min(-(-least // v), (registers - v) // (v + 1))
    if (shape.kh, shape.kw) == (1, 1) and v == 2 and positions >= TWO_VECTOR_8_POSITIONS:
        width = min(width, 8)  # docs/performance.md, round thirty-three
    return v * lanes, -(-positions // -(-positions // width))


@dataclass(frozen=True)
class _Layer:
    """One kernel's geometry as its sums see it: `shape` (stride 1 and no pads when the
    workspace holds exactly the positions read), the workspace `xb`, the packed weight
    and the output."""

    shape: ConvShape
    xb: Buffer
    wp: Buffer
    out: Buffer
    epilogue: Epilogue
    in_block: int
    block: int
    cb: int
    tile_w: int
    c_out: int
    pf: WeightPrefetch | None = None
    #: The input's word reader (`input_words`) where each tile converts its own
    #: positions into `xb`, its stage `[P][tile_w][b]` (`stages_input`); None: `xb` is
    #: the workspace `converted_input` fills.
    words: Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr] | None = None
    #: The border (top, left, bottom, right) of the consumers' words the tiles store
    #: (`word_tile_stores`); None: float32 NCHW{b}c stores.
    word_pads: tuple[int, int, int, int] | None = None

    @property
    def pairs(self) -> Any:
        """Pairs of input word blocks: an int, or a dimension variable where the width
        is a run-time one."""
        return self.xb.shape[0 if self.words is not None else 1]

    @property
    def positions(self) -> int:
        return self.shape.out_h * self.shape.out_w

    @property
    def tiles(self) -> int:
        return -(-self.positions // self.tile_w)

    @property
    def blocks(self) -> int:
        """Channel tiles."""
        return -(-self.c_out // self.cb)


def subsampled(shape: ConvShape) -> bool:
    """Whether the workspace holds only the positions an unpadded strided 1x1 layer reads
    (the sums then run at stride 1 on it)."""
    return (shape.kh, shape.kw) == (1, 1) and shape.stride != (1, 1) and not any(shape.pads)


def input_words(x: Buffer, c_in: int, x_block: int, block: int
                ) -> Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]:
    """The bfloat16 word `(n, p, row, col, v)` of the NCHW{x_block}c input `x` (or of the
    NCHW `x`, `x_block` 1) in word rows of `block` lanes (`word_block`): lane `v` of word
    block `2p` (low half) and `2p + 1` (high half; zero past the last block) at input
    position `(row, col)`. A run-time channel count (`run_time_width`) is `x`'s blocks,
    an even count of them."""
    parts = x_block // block  # word blocks per block of `x` (`word_block`)
    cblocks = (-(-c_in // x_block) * parts if isinstance(c_in, int)
               else cast(int, x.shape[1]))
    odd = isinstance(c_in, int) and cblocks % 2
    zero = as_expr(0.0, "float32")

    def read(n: PrimExpr, cblock: PrimExpr, r: PrimExpr, c: PrimExpr, v: PrimExpr
             ) -> PrimExpr:
        if x.ndim == 4:
            return x[n, cblock, r, c]
        if parts == 1:
            return x[n, cblock, r, c, v]
        return x[n, cblock // parts, r, c, (cblock % parts) * block + v]

    def word(n: PrimExpr, p: PrimExpr, r: PrimExpr, c: PrimExpr, v: PrimExpr) -> PrimExpr:
        lo = read(n, 2 * p, r, c, v)
        hi = select(2 * p + 1 < cblocks, read(n, min_(2 * p + 1, cblocks - 1), r, c, v),
                    zero) if odd else read(n, 2 * p + 1, r, c, v)
        return bf16_word(lo, hi)

    return word


def converted_input(x: Buffer, shape: ConvShape, block: int, words: int, isa: ISA
                    ) -> tuple[Buffer, ConvShape, list[Stmt]]:
    """The bfloat16 word workspace of the NCHW{block}c input `x` (or of the NCHW `x`,
    `block` 1; see the module docstring) in word rows of `words` lanes (`word_block`),
    the geometry the sums read it with, and the statements filling it (one parallel
    loop over images, pairs of channel blocks and rows; per row, the border's zero words
    and the image's converted words, `block` lanes at a time, or a row's columns at a
    time for an NCHW input). A run-time channel count (`run_time_width`) is `x`'s
    blocks, an even count of them."""
    top, left, bottom, right = shape.pads
    sh, sw = shape.stride
    if subsampled(shape):
        rows, cols = shape.out_h, shape.out_w
        inner = replace(shape, h=rows, w=cols, stride=(1, 1))
        top = left = bottom = right = 0
    else:
        rows, cols = shape.h + top + bottom, shape.w + left + right
        inner = replace(shape, h=rows, w=cols, pads=(0, 0, 0, 0))
        sh = sw = 1
    x_block, block = block, words
    pairs: int | PrimExpr
    if isinstance(shape.c_in, int):
        pairs = pair_blocks(shape.c_in, block)
    else:
        pairs = cast(int, x.shape[1] // 2)
    # a 1x1 layer at stride 1 reads its positions in order: one row of them, so that a
    # tile's positions are one address apart by constants, not one address register each
    flat = (shape.kh, shape.kw) == (1, 1) and inner.stride == (1, 1)
    xb = Buffer("xbf16", (shape.n, pairs, rows * cols, block) if flat
                else (shape.n, pairs, rows, cols, block), "int32")
    word = input_words(x, shape.c_in, x_block, block)

    def fill(n: PrimExpr, p: PrimExpr, i: PrimExpr) -> Stmt:
        def image(q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return word(n, p, (i - top) * sh, (q - left) * sw, v)

        def span(c: tuple[int, int], value: Callable[[PrimExpr, PrimExpr], PrimExpr]
                 ) -> list[Stmt]:
            if c[1] <= c[0]:
                return []
            if block == 1:  # an NCHW input: the row's columns are the vector
                return [lanes_loop("q", c[1] - c[0], lambda q: Store(
                    xb, value(q + c[0], _c(0)), at(q + c[0], _c(0))))]
            return [_loop("q", c[1] - c[0], lambda q: lanes_loop("v", block, lambda v: Store(
                xb, value(q, v), at(q, v))), start=c[0])]

        def at(q: PrimExpr, v: PrimExpr) -> tuple[PrimExpr, ...]:
            return (n, p, i * cols + q, v) if flat else (n, p, i, q, v)

        def zeros(q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return as_expr(0, "int32")

        h_end, w_end = rows - bottom, cols - right
        row = seq(*span((0, left), zeros), *span((w_end, cols), zeros),
                  *span((left, w_end), image))
        if not (top or bottom):
            return row
        return IfThenElse((i < top) | (i >= h_end), seq(*span((0, cols), zeros)), row)

    # each float32 value is read once and stored as half a word: the pass streams the
    # input (the "element" rate estimated a quarter of its time and kept 1x1 layers of
    # 100-400 thousand values on one thread)
    values = 2 * shape.n * pairs * rows * cols * block
    # by rows: a few pairs of blocks (3 of 96 channels) split unevenly over the threads
    loop = parallel_when(lambda: parallel_tiles((shape.n, pairs, rows), fill), values,
                         "stream", isa=isa)
    return xb, inner, [Allocate(xb), loop]


def row_tap_input(x: Buffer, shape: ConvShape) -> tuple[Buffer, ConvShape, list[Stmt]]:
    """`converted_input` of an NCHW first layer with `ROW_TAPS`: words `[n][ci][rows]
    [cols][1]` over the padded image, word `(c, i, u)` pairing its values at columns `u`
    and `u + dw` (zero in the padding and past the edge), and the geometry the sums read
    them with: a kernel of `ceil(kw / 2)` columns dilated `2 dw` (word `m` holds taps `2m`
    and `2m + 1`). One parallel loop over the image's rows; the columns whose pair lies
    inside the image read without bounds checks."""
    top, left, bottom, right = shape.pads
    dw = shape.dilation[1]
    rows, cols = shape.h + top + bottom, shape.w + left + right
    xb = Buffer("xbf16", (shape.n, shape.c_in, rows, cols, 1), "int32")
    inner = replace(shape, c_in=2 * shape.c_in, h=rows, w=cols, kw=(shape.kw + 1) // 2,
                    pads=(0, 0, 0, 0), dilation=(shape.dilation[0], 2 * dw))
    zero = as_expr(0.0, "float32")

    def value(n: PrimExpr, c: int, r: PrimExpr, u: PrimExpr, checked: bool) -> PrimExpr:
        col = u - left
        if not checked:
            return x[n, c, r, col]
        safe = x[n, c, r, max_(min_(col, shape.w - 1), 0)]
        return select((col >= 0) & (col < shape.w), safe, zero)

    # columns [lo, hi) read both values inside the image
    lo, hi = left, max(left, left + shape.w - dw)

    def span(n: PrimExpr, r: PrimExpr, c: int, start: int, end: int, checked: bool
             ) -> Stmt:
        def word(u: PrimExpr) -> Stmt:
            q = u + start
            return Store(xb, bf16_word(value(n, c, r, q, checked),
                                       value(n, c, r, q + dw, checked)),
                         (n, _c(c), r + top, q, _c(0)))

        return lanes_loop("u", end - start, word)

    def row(n: PrimExpr, r: PrimExpr) -> Stmt:
        spans = ((0, lo, True), (lo, hi, False), (hi, cols, True))
        return seq(*(span(n, r, c, *sp) for c in range(shape.c_in) for sp in spans
                     if sp[1] > sp[0]))

    def border(start: int, count: int) -> list[Stmt]:  # padding rows: words of zeros
        return [_nest(("n", "c", "i"), (shape.n, shape.c_in, count),
                      lambda n, c, i: lanes_loop("u", cols, lambda u: Store(
                          xb, as_expr(0, "int32"), (n, c, i + start, u, _c(0)))))
                ] if count else []

    # parallel whatever its size: a word rounds two values (about ten vector operations
    # each, where `parallel_when`'s elements count one), and the pool runs a loop it
    # measures too short on the caller alone (kiln_host.c, KILN_SERIAL_NS)
    image = parallel_tiles((shape.n, shape.h), row)
    return xb, inner, [Allocate(xb), *border(0, top), *border(rows - bottom, bottom), image]


def bf16_conv_body(layer: _Layer) -> Stmt:
    """The parallel tiles over (image, channel tile, tile of positions)."""
    tiles = parallel_tiles((layer.shape.n, layer.blocks, layer.tiles),
                           lambda n, ob, t: _tile(layer, n, ob, t))
    border = [] if layer.word_pads is None else zero_border(layer.out, layer.word_pads)
    return seq(*border, tiles) if layer.pf is None else seq(*border, *layer.pf.decls, tiles)


def prefetches_bf16_weights(shape: ConvShape, cb: int, words: int, isa: ISA) -> bool:
    """Whether the tiles of `cb` output channels prefetch the next channel tile's
    packed words (the float32 blocked kernel's rule, `prefetches_weights`, on the
    bfloat16 words' bytes): a small image's few tiles per channel tile would otherwise
    wait on memory for its weights, which at that size are read from beyond the L2 on
    every call (ResNet's 512 > 512 3x3 layers at 7x7: 4.7 MB). Tiles of 4 vectors
    only: GoogLeNet's 14x14 3x3 layers on tiles of 1 x 14 and 2 x 10 took twice as
    long with the prefetches (their channel tiles' 27 and 64 KB of weights stay in
    the caches anyway). `words`: the packed weight's int32 words."""
    return (shape.out_h * shape.out_w <= PREFETCH_MAX_POSITIONS and isa.l2_bytes > 0
            and cb == POINTWISE_VECTORS * tile_lanes(isa)
            and words * 4 >= PREFETCH_WEIGHT_L2_SHARE * isa.l2_bytes)


#: The dimension scalar of a run-time-width kernel's packed weight: its word rows.
WORDS_NAME = "kiln_conv_words"


def run_time_width(shape: ConvShape, in_block: int, x_ndim: int, prefetch: bool) -> bool:
    """Whether the kernel of a layer of `shape` on an input of `x_ndim` dims in blocks of
    `in_block` takes its channel count at run time: an unpadded 1x1 layer at stride 1 (its
    workspace is its input, converted), on an NCHW{b}c input of an even count of whole
    blocks (word rows of `b` lanes pairing blocks `2p` and `2p + 1`: no block of zeros,
    whatever the count), whose tiles do not prefetch weights (that choice and its spans
    follow the weight's size)."""
    return (x_ndim == 5 and (shape.kh, shape.kw) == (1, 1) and shape.stride == (1, 1)
            and not any(shape.pads) and shape.c_in % (2 * in_block) == 0 and not prefetch)


#: The most bytes of a tile's own converted words (`stages_input`): a part of the L1.
STAGE_MAX_BYTES = 16 * 1024
#: The most channel blocks of an input past the L2 that a tile converts from
#: (`stages_input`): each block is a stream of its own from memory.
STAGE_MAX_BLOCKS = 8


def stages_input(shape: ConvShape, cb: int, tile_w: int, words: int, pf: bool,
                 isa: ISA) -> bool:
    """Whether each tile of positions converts its own input words (`staged_words`)
    rather than reading a workspace converted before the tiles: a 1x1 stride-1 unpadded
    layer whose output channels are one channel tile (MobileNetV2's projections to 16-64
    channels: no input word is converted twice) and whose `words` (per position) fit
    STAGE_MAX_BYTES for the tile. The workspace's round trip through memory (its
    writes, then the tiles' reads: half the float32 input's bytes each) and its
    parallel loop go; the float32 input is read once as before. Before a run-time
    width (`run_time_width`): the projections 32 > 16 at 112x112 and 192 > 32 at 28x28
    gain more from it than from sharing a kernel (docs/performance.md). Not with the
    weight prefetch (large weights: many channel tiles), nor from an input past the L2
    in more than STAGE_MAX_BLOCKS channel blocks, which a tile reads as that many
    streams at once (MobileNetV2's 144 > 24 at 56x56, 9 blocks of 1.8 MB: 4% slower
    so, where the workspace's conversion reads two blocks at a time)."""
    lanes = tile_lanes(isa)
    blocks = -(-shape.c_in // lanes)
    streams = blocks > STAGE_MAX_BLOCKS and shape.h * shape.w * blocks * lanes * 4 > isa.l2_bytes
    return ((shape.kh, shape.kw) == (1, 1) and shape.stride == (1, 1)
            and not any(shape.pads) and shape.c_out <= cb and not pf and not streams
            and words * tile_w * 4 <= STAGE_MAX_BYTES)


def staged_words(layer: _Layer, n: PrimExpr, rows: Sequence[PrimExpr],
                 cols: Sequence[PrimExpr]) -> list[Stmt]:
    """The tile's stage `xb[p][r][v]` filled with the input words of its positions
    (`rows`, `cols`), `b` lanes at a time."""
    assert layer.words is not None
    words, xb = layer.words, layer.xb
    block = int(xb.shape[2])

    def position(p: PrimExpr, r: int) -> Stmt:
        return lanes_loop("v", block, lambda v: Store(
            xb, words(n, p, rows[r], cols[r], v), (p, _c(r), v)))

    return [Allocate(xb), _loop("p", layer.pairs, lambda p: seq(*(
        position(p, r) for r in range(layer.tile_w))))]


def _tile(layer: _Layer, n: PrimExpr, ob: PrimExpr, t: PrimExpr) -> Stmt:
    """Tile `t` of channel tile `ob` of image `n`: its sums, then its stores."""
    tile_w, cb, block, shape = layer.tile_w, layer.cb, layer.in_block, layer.shape
    acc = Buffer("acc", (tile_w, cb), "float32", "local")
    zero = as_expr(0.0, "float32")
    head: list[Stmt] = [Allocate(acc), lanes_loop("v", cb, lambda v: seq(*(
        Store(acc, zero, (_c(r), v)) for r in range(tile_w))))]
    rows: list[PrimExpr] = []
    cols: list[PrimExpr] = []
    positions: list[PrimExpr] = []
    last = (layer.tiles - 1) * tile_w
    for r in range(tile_w):
        pos: PrimExpr = t * tile_w + r
        if last + r >= layer.positions:  # past the end: read the last position
            pos = min_(pos, layer.positions - 1)
        rv, cv = Var(f"oh{r}", INDEX_DTYPE), Var(f"ow{r}", INDEX_DTYPE)
        head += [LetStmt(rv, pos // shape.out_w), LetStmt(cv, pos % shape.out_w)]
        rows.append(rv)
        cols.append(cv)
        positions.append(pos)
    if layer.words is not None:
        head += staged_words(layer, n, rows, cols)
    sh, sw = shape.stride
    dh, dw = shape.dilation
    pf = layer.pf
    line = LINE_BYTES // 4  # int32 words per cache line
    # the channel tile's last `cb / line` tiles prefetch the next one's weights, one line
    # of its weight row per step each (tile `first + i` line `i`); earlier, the next
    # tile's weights would crowd this one's out of the L2 (590 KB each at 512 > 512 3x3)
    first = layer.tiles - cb // line
    if pf is not None:
        head.append(pf.start((ob, _c(0), _c(0), _c(0), _c(0)),
                             int(layer.pairs) * block * shape.kh * shape.kw * cb))

    def word(r: int, p: PrimExpr, kh: PrimExpr, kw: PrimExpr, j: PrimExpr) -> PrimExpr:
        if layer.words is not None:  # the tile's stage
            return layer.xb[p, _c(r), j]
        if layer.xb.ndim == 4:  # a flat workspace (strided: a 1x1 layer's stored words)
            at = positions[r] if (sh, sw) == (1, 1) else rows[r] * sh * shape.w + cols[r] * sw
            return layer.xb[n, p, at, j]
        return layer.xb[n, p, rows[r] * sh + kh * dh, cols[r] * sw + kw * dw, j]

    def step(p: PrimExpr, j: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
        xs = [Var(f"x{r}", "int32") for r in range(tile_w)]
        lets: list[Stmt] = [LetStmt(xv, word(r, p, kh, kw, j)) for r, xv in enumerate(xs)]
        if pf is not None:
            fetch = seq(*pf.at((((p * block + j) * shape.kh + kh) * shape.kw + kw) * cb
                               + (t - first) * line, line))
            lets.append(IfThenElse(t >= first, fetch, None) if first > 0 else fetch)

        def lane(v: PrimExpr) -> Stmt:
            wv = Var("w", "int32")
            return seq(LetStmt(wv, layer.wp[ob, p * block + j, kh, kw, v]), *(
                Store(acc, Intrin(DOT2_BF16, (acc[_c(r), v], xs[r], wv)), (_c(r), v))
                for r in range(tile_w)))

        return seq(*lets, lanes_loop("v", cb, lane))

    sums = _loop("p", layer.pairs, lambda p: _loop("j", block, lambda j: _nest(
        ("kh", "kw"), (shape.kh, shape.kw), lambda kh, kw: step(p, j, kh, kw))))
    stage = Buffer("stage", (tile_w, cb), "float32", "local")
    copy = lanes_loop("v", cb, lambda v: seq(*(
        Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(tile_w))))
    real = [t * tile_w + r < layer.positions if last + r >= layer.positions else None
            for r in range(tile_w)]
    out_block = layer.block
    if layer.word_pads is not None:
        stores = word_tile_stores(layer.out, stage, layer.epilogue, n, ob, rows, cols, real,
                                  out_block, layer.word_pads, shape.out_w)
    else:
        stores = blocked_tile_stores(layer.out, stage, layer.epilogue, n, ob, rows, cols,
                                     real, out_block, layer.c_out, layer.blocks,
                                     -(-layer.c_out // out_block))
    return seq(*head, sums, Allocate(stage), copy, *stores)


@dataclass(frozen=True)
class NchwcBf16(Family):
    """An ungrouped `conv2d_blocked` on NCHW{b}c input, or on a region's NCHW input with
    the output block attribute `block` (the `nchwc-layout` pass's blocked call, before
    the float32 NCHWc family packs it) -> `conv2d_nchwc_bf16` on a `precision=bf16`
    target with 16 float32 lanes (AVX-512)."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        x, w = call.args[0].type, call.args[1]
        return (isa.precision == "bf16" and tile_lanes(isa) == 16
                and call.op == "conv2d_blocked" and call.attrs.get("group", 1) == 1
                and isinstance(w, g.Constant) and w.data.dtype == np.float32
                and isinstance(call.attrs.get("channels"), int)
                and isinstance(x, TensorType) and x.dtype == "float32"
                and all(isinstance(d, int) for d in x.shape[1:])
                and ((x.ndim == 5 and x.shape[4] == 16 and NCHW_INPUT_BLOCK not in call.attrs)
                     or (x.ndim == 4 and call.attrs.get(NCHW_INPUT_BLOCK) == 16
                         and not stem_stays_float32(w.data.shape[3:5], call.attrs))))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        x, w = call.args[0].type, call.args[1]
        assert isinstance(x, TensorType) and isinstance(w, g.Constant)
        channels = call.attrs["channels"]
        assert isinstance(channels, int)  # `applies` checked it
        oihw = unpack_blocked_weight(np.asarray(w.data), channels)
        attrs = {k: v for k, v in call.attrs.items() if k not in (TILE, "ksegment")}
        attrs["c_in"] = int(oihw.shape[1])
        shape = conv_shape((x.shape[0], oihw.shape[1], x.shape[2], x.shape[3]), channels,
                           oihw.shape[2:], attrs)
        tile = bf16_tile(shape, isa)
        in_block = conv_blocks(x.shape, attrs)[0]
        if x.ndim == 4 and row_taps_pay(shape.c_in, shape.kw):
            attrs[ROW_TAPS] = shape.kw
            packed = g.Constant(pack_row_taps(oihw, tile[0]), w.name)
        else:
            packed = g.Constant(pack_conv_bf16(oihw, tile[0], in_block), w.name)
        return make_call(CONV_BF16, call.args[0], packed, *call.args[2:],
                         **{**attrs, TILE: tile})

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        x, wp = args[0], args[1]
        if not all(isinstance(d, int) for d in (*x.shape[1:], *wp.shape)):
            return None  # only the batch may be symbolic
        shape = bf16_conv_shape(args, attrs)
        in_block, block = conv_blocks(x.shape, attrs)
        cb = int(wp.shape[4])
        tile = recorded_tile(attrs, 2, self.op) or bf16_tile(shape, isa)
        conv_out = layout.block_shape((shape.n, shape.c_out, shape.out_h, shape.out_w), block)
        output = words_output(params, anchor, result, conv_out)
        if output is None:
            return None
        store, out, source = output.store, output.out, output.source
        word_pads = None
        if source is not None:  # the consumers' words (kiln.transform.bf16_words)
            unit = block if source.half else 2 * block  # the channels of a word row
            if cb % unit or shape.c_out % unit:
                return None
            word_pads = source.pads
        epilogue = store.epilogue
        if len(args) > 2:
            epilogue = blocked_bias(epilogue, store.buffers[args[2]], block)
        words = [int(d) for d in wp.shape]
        prefetch = prefetches_bf16_weights(shape, cb, int(np.prod(words)), isa)
        buffers = [store.buffers[t] for t in params]
        xs, ws = (next(i for i, b in enumerate(buffers) if b is store.buffers[t])
                  for t in (x, wp))
        x_buf, w_buf = buffers[xs], buffers[ws]
        fattrs: dict[str, Any] = {ATTR_CONV_KERNEL: self.op, ATTR_NO_SLP: True}
        lanes = word_block(shape.c_in, in_block)
        tile_w = min(tile[1], shape.out_h * shape.out_w)
        staged = len(x.shape) == 5 and stages_input(
            shape, cb, tile_w, words[1], prefetch, isa)

        def body(shape: ConvShape, x_buf: Buffer, w_buf: Buffer) -> Stmt:
            reader = None
            prologue: list[Stmt]
            if attrs.get(WORDS_INPUT):  # stored by its producer: the workspace
                xb, inner = stored_words(x_buf, shape)
                prologue, width = [], lanes
            elif attrs.get(ROW_TAPS):
                xb, inner, prologue = row_tap_input(x_buf, shape)
                width = word_block(inner.c_in, in_block)
            elif staged:
                xb = Buffer("xw", (words[1] // lanes, tile_w, lanes), "int32", "local")
                inner, prologue, width = shape, [], lanes
                reader = input_words(x_buf, shape.c_in, in_block, lanes)
            else:
                xb, inner, prologue = converted_input(x_buf, shape, in_block, lanes, isa)
                width = lanes
            pf = WeightPrefetch(w_buf, int(np.prod(words[1:]))) if prefetch else None
            layer = _Layer(inner, xb, w_buf, out, epilogue, width, block, cb,
                           tile_w, shape.c_out, pf, reader, word_pads)
            return seq(*prologue, bf16_conv_body(layer))

        stmt = None
        # stored words (`[n][P][rows * cols][b]`) count pairs of blocks along their dim 1
        pairs = 2 if attrs.get(WORDS_INPUT) else 1
        if (not staged and not attrs.get(HALF_WORDS)
              and run_time_width(shape, in_block, 5 if pairs == 2 else len(x.shape), prefetch)):
            blocks, rows = Var(WIDTH_NAME, INDEX_DTYPE), Var(WORDS_NAME, INDEX_DTYPE)
            wide_x = Buffer(x_buf.name, (x_buf.shape[0], blocks, *x_buf.shape[2:]),
                            x_buf.dtype, x_buf.scope)
            wide_w = Buffer(w_buf.name, (w_buf.shape[0], rows, *w_buf.shape[2:]),
                            w_buf.dtype, w_buf.scope)
            # ConvShape types its symbolic sizes as ints (kiln.ops.conv_geometry)
            stmt = body(replace(shape, c_in=cast(int, blocks * pairs * in_block)), wide_x,
                        wide_w)
            if any(b is x_buf or b is w_buf for b in read_buffers(stmt)):
                stmt = None  # the epilogue reads the input at its static width
            else:
                buffers[xs], buffers[ws] = wide_x, wide_w
                fattrs[ATTR_ARG_DIMS] = ((WIDTH_NAME, xs, 1), (WORDS_NAME, ws, 1))
        if stmt is None:
            stmt = body(shape, x_buf, w_buf)
        return PrimFunc((*buffers, out), stmt, fattrs)

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` over a run-time channel count (`run_time_width`) is
        built from besides that count, or None: a kernel of its own. Calls with the same
        key share one kernel (kiln.transform.fuse_ops; the attribute `c_in` left out of
        the group's key, `NchwcBf16Lowering.width_attrs`)."""
        types = [a.type for a in call.args]
        # only the batch may be symbolic, as `build` takes it
        if call.op != self.op or not all(isinstance(t, TensorType) and is_static(t.shape[1:])
                                         for t in types):
            return None
        x, wp = cast(TensorType, types[0]), cast(TensorType, types[1])
        words = [d for d in wp.shape if isinstance(d, int)]
        if len(words) != wp.ndim:
            return None
        shape = bf16_conv_shape(types, call.attrs)
        in_block, block = conv_blocks(x.shape, call.attrs)
        prefetch = prefetches_bf16_weights(shape, words[4], int(np.prod(words)), isa)
        tile = recorded_tile(call.attrs, 2, self.op) or bf16_tile(shape, isa)
        tile_w = min(tile[1], shape.out_h * shape.out_w)
        stored = bool(call.attrs.get(WORDS_INPUT))
        if (call.attrs.get(HALF_WORDS)
                or not run_time_width(shape, in_block, 5 if stored else x.ndim, prefetch)
                or (not stored and stages_input(shape, words[4], tile_w, words[1], prefetch,
                                                isa))):
            return None
        return (replace(shape, c_in=0), in_block, block, words[4], tile, stored)


NCHWC_BF16 = NchwcBf16("nchwc_bf16", CONV_BF16, (), -1)


@dataclass(frozen=True)
class NchwcBf16Lowering:
    """The kernel of a `conv2d_nchwc_bf16` call (float32 input and result; the weight's
    int32 words), built by `NCHWC_BF16` with the fused elementwise tail; the batch may be
    symbolic."""

    supports_symbolic = True
    fuses_producers = False
    #: What the group key of a kernel over a run-time width leaves to `width_key`.
    width_attrs = ("c_in",)

    def builds(self, call: g.Call) -> bool:
        """Every call: `lower_fused` declines what the kernel does not take."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        words = words_source(result) if result is not None else None
        if not float32_operands([] if attrs.get(WORDS_INPUT) else args[:1],
                                words.tensor if words is not None else result):
            return None
        return NCHWC_BF16.build(params, args, attrs, anchor, result, isa)

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """`NCHWC_BF16.width_key`."""
        return NCHWC_BF16.width_key(call, isa)


LOWERING = NchwcBf16Lowering()
