"""The kernel of `qlinear_conv_dot` (kiln.ops.quant_conv_words): a 2-D int8 convolution
on the dot-product form (kiln.kernels.int8.dot), for static shapes.

At run time the input is packed into words of the weight's k for every output position
(`[N][ceil(K / 4)][P]`, P the output positions padded to whole column tiles): the input
rows of an im2col, 4 k to a word, read with the zero point where the convolution is
padded (shifted to unsigned bytes like A of the packed matrix products). The register
tile (kiln.kernels.int8.conv_tile) is rows of output channels (a broadcast weight word
each) x `nr` output positions (vectors of input words), one `dot4_u8s8` per accumulator
and word; stores are contiguous along the output row, requantized in the epilogue (bias
with the zero-point correction, per-channel multiplier, range).

Where the output positions fill the vectors badly (7 x 7 = 49 positions in 64 lanes) the
tile is transposed (`choose_tile`): output channels are the lanes and output positions
the rows (a broadcast input word each), as in a matrix product whose B is the weight,
packed in panels of the tile's channels; the requantization takes its per-channel
multiplier along the lanes. That tile's input words are read at each output
position's place in the padded input grid (`ImageGrid`), a strided convolution's at
the stride (a broadcast word reads any place). The positions tile's im2col of a
strided convolution reads its input split into phase planes
(kiln.kernels.int8.conv_input.PhasePlanes), where its taps read contiguously as a
stride-1 convolution's do.

Without VNNI (AVX2, AVX-512BW: `dot.PAIRS16`) the words hold 2 k as int16 halves
(attribute `k_group=2`: `[OC][ceil(K / 2)]`), the im2col writes its words the same way
and the tile step is `dot2_i16`.

With `int8-pairs=saturate` (k = (tap, c)) and C a multiple of 4, every im2col word is 4
channels of one tap: the input is copied once as such words (`padded_words`) and the
im2col copies whole words; a stride-1 convolution on an image wide enough reads them in
place instead (kiln.kernels.int8.conv_in_place: no im2col, grid positions as the tile's
lanes).

Between such convolutions the activations may be kept as those words (WORDS_LAYOUT,
`NCHW4c`: attributes `in_layout` / `out_layout`, chosen by kiln.transform.quant_layout):
the input is then read as words where it needs no padding (1x1 layers: no im2col at all)
and copied word by word where it does; each 4 rows of a positions tile store one word
per position, and a channels tile's rows are words of 4 channels already.

`tiles` builds the kernel from a `ConvSchedule` (the choices: tile, layouts, padding,
planes), one function per variant: read in place (`in_place`), the channels tile on
input words read in place (`channels_in_place`), or either tile on an im2col of words
(`on_im2col`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.graph import Call
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    DeclBuffer,
    PrimExpr,
    PrimFunc,
    Select,
    Stmt,
    Store,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_in_place import in_place, in_place_pays, in_place_width
from kiln.kernels.int8.conv_input import (
    ConvInput,
    PhasePlanes,
    padded_input,
    padded_words,
    spread,
)
from kiln.kernels.int8.conv_residual import Residual
from kiln.kernels.int8.conv_tile import ConvTile, channel_rows, narrows_by_packs, position_rows
from kiln.kernels.int8.conv_tiles import (
    InPlace,
    RowEpilogue,
    channel_tiles,
    flat_output,
    position_tiles,
)
from kiln.kernels.int8.per_sample import PerSample, chunk_loop
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import loop as tile_loop
from kiln.kernels.tiles import nest, tuned_split
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import out_range, requantize_value
from kiln.ops.quant_conv_words import (
    CONV_ARGS,
    CONV_DOT,
    conv_dot_infer,
    fused_residual,
    layouts,
    tap_major_k,
    w_shape,
)
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
#: `load(plane, offsets)`: an input byte of an im2col word (kiln.kernels.int8.conv_input)
Load = Callable[[PrimExpr, Sequence[PrimExpr]], PrimExpr]


@dataclass(frozen=True)
class TiledConv:
    """The register-tiled kernel for static shapes on a target with a dot product (the
    te definition where the words were packed for another target)."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """Whether the kernel applies to `call`: the tiles take it whole."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The tiled kernel of the convolution alone (None under a fused tail)."""
        dot_isa = dot.target_isa(isa, qw.saturates(attrs))
        if result is not None or len(args) != len(params) or dot_isa is None \
                or dot.k_group(dot_isa) != qw.word_group(attrs):
            return None  # (words packed for another target: the te definition reads them)
        buffers = [Buffer(t.name, t.shape, t.dtype) for t in params]
        x, ww, bias, x_zp, multiplier, y_zp = buffers[:CONV_ARGS]
        # a fused residual add's operands follow the convolution's
        residual = Residual.of(buffers[CONV_ARGS:], attrs) if fused_residual(attrs) else None
        out_type = conv_dot_infer([TensorType(t.shape, t.dtype) for t in params], attrs)
        assert isinstance(out_type, TensorType)
        out = Buffer("out", out_type.shape, y_zp.dtype)
        batch = int(x.shape[0])
        chunk = batch_chunk(conv_schedule(x, ww, bias, multiplier, y_zp, out, attrs, dot_isa),
                            dot_isa)
        if chunk == batch:
            body = tiles(x, ww, bias, x_zp, multiplier, y_zp, out, attrs, dot_isa,
                         residual=residual)
        else:  # the kernel of `chunk` samples, run on each chunk's slice
            sliced = (x, out) if residual is None else (x, out, residual.source)
            views = [(b, Buffer(f"{b.name}_chunk", (chunk, *b.shape[1:]), b.dtype), True)
                     for b in sliced]
            kind = chunks_kind(batch // chunk)
            body, _ = chunk_loop(batch, as_expr(0, INDEX_DTYPE), chunk, views,
                                 tiles(views[0][1], ww, bias, x_zp, multiplier, y_zp,
                                       views[1][1], attrs, dot_isa,
                                       serial=kind == "parallel",
                                       residual=residual and residual.chunk(views[2][1])),
                                 kind)
        return PrimFunc((*buffers, out), body, {ATTR_GEMM_KERNEL: CONV_DOT})


def batch_chunk(s: ConvSchedule, isa: ISA) -> int:
    """Samples the kernel takes at a time: the whole batch where the bytes one call
    works through (its input, im2col words and output) fit the L2, else the largest
    divisor of the batch whose share does (at least 1). A kernel over the whole batch
    packs every sample's im2col before its tiles read any, and at batch 8 of ResNet-50
    those words (7 MB for a 3x3 at 28 x 28) come back from memory; sample by sample
    they stay in the L2, as at batch 1."""
    words = s.groups * s.positions * 4 if not s.in_place else 0
    per_sample = (int(np.prod(s.source.shape[1:])) + words
                  + s.oc_n * s.positions)
    if s.batch * per_sample <= isa.l2_bytes:
        return s.batch
    fits = [c for c in range(1, s.batch + 1)
            if s.batch % c == 0 and c * per_sample <= isa.l2_bytes]
    return max(fits, default=1)


#: The fewest chunks from which they run in parallel, each thread whole chunks on
#: workspaces of its own with serial tiles, rather than one chunk after the other with
#: each chunk's packing and tiles split over the threads: a thread then keeps its chunk's
#: input, im2col words and output in its own L2 (the reason for the chunks), and a layer
#: makes one hand-off to the pool instead of two per chunk (docs/performance.md,
#: "int8 ResNet-50 (QOperator) at batch 8"). From 4 chunks two threads are balanced.
MIN_PARALLEL_CHUNKS = 4


def chunks_kind(count: int) -> str:
    """How `count` chunks of a batch run: "parallel" from MIN_PARALLEL_CHUNKS (unless a
    tuned split chose the kernel's parallel loops), else "serial"."""
    return "parallel" if count >= MIN_PARALLEL_CHUNKS and tuned_split() is None \
        else "serial"


#: The lowering of `qlinear_conv_dot` (kiln.kernels.lowering); over a symbolic batch,
#: chunk by chunk (kiln.kernels.int8.per_sample).
TILED_CONV = PerSample(TiledConv())


@dataclass(frozen=True)
class ConvSchedule:
    """The choices of one dot-form convolution's kernel (`conv_schedule`): its geometry,
    the tile, whether the input is copied as words of 4 channels (`quads`), the padding
    of the input copy (`ends`, grown to the planes' needs) and the phase planes it is
    read through."""

    ws: tuple[int, ...]
    source: ConvInput
    decls: tuple[Stmt, ...]
    out_words: bool
    rank: int
    dilations: tuple[int, ...]
    begins: tuple[int, ...]
    ends: tuple[int, ...]
    batch: int
    oc_n: int
    spatial: tuple[int, ...]
    positions: int
    taps: int
    k_total: int
    groups: int
    by_tap: bool
    intrinsic: str
    group: int
    tile: ConvTile
    big: bool
    quads: bool
    planes: PhasePlanes
    #: the grid's step from one output position to the next along each dimension: the
    #: stride where the padded words are read at the stride, else 1 (planes or stride 1)
    step: tuple[int, ...]
    lo: int
    hi: int
    row_epilogue: RowEpilogue
    #: the positions tile reads its input words in place (kiln.kernels.int8.conv_in_place)
    in_place: bool
    #: int32 lanes of a vector: the positions tile's last column tile takes the vectors
    #: its positions fill (kiln.kernels.int8.conv_tiles.tail_cols)
    lanes: int


def conv_schedule(x: Buffer, ww: Buffer, bias: Buffer, multiplier: Buffer, y_zp: Buffer,
                  out: Buffer, attrs: Attrs, isa: ISA) -> ConvSchedule:
    """The schedule of the convolution of `x` by the weight words `ww` into `out` on
    `isa` (the dot form's planning ISA)."""
    ws = w_shape(attrs)
    in_words, out_words = layouts(attrs)
    source, decls = ConvInput.of(x, in_words)
    x_shape = source.shape
    rank, strides, dilations, begins, _ = conv_geometry(x_shape, ws, attrs, CONV_DOT)
    batch, oc_n = int(out.shape[0]), ws[0]
    spatial = tuple(int(d) for d in out.shape[2:2 + len(ws) - 2])
    positions = int(np.prod(spatial))
    taps, k_total, groups = int(np.prod(ws[2:])), int(np.prod(ws[1:])), int(ww.shape[1])
    by_tap = tap_major_k(attrs)
    group = qw.word_group(attrs)
    if ww.ndim == 3:  # weight panels: channels as lanes, as wide as the panels
        nr = int(ww.shape[2])
        tile = ConvTile(True, channel_rows(isa, positions, nr, k_total), nr)
    else:
        nr = dot.tile_cols_for(isa, positions)
        tile = ConvTile(False, position_rows(isa, nr, oc_n, out_words), nr)
    # the padding past the input's end that the last output position reads
    ends = [max(0, (spatial[j] - 1) * strides[j] + (ws[2 + j] - 1) * dilations[j]
                - begins[j] + 1 - x_shape[2 + j]) for j in range(rank)]
    grid_in = [x_shape[2 + j] + begins[j] + ends[j] for j in range(rank)]
    # k = (tap, c) with whole words of channels: the input is copied once as words of
    # 4 channels (`padded_words`), and the im2col copies whole words; an input in
    # words (WORDS_LAYOUT: `conv_dot_infer` checked its k order) is read as such
    quads = in_words or (by_tap and group == qw.GROUP and taps > 1 and ws[1] % group == 0)
    # the channels tile reads its words in place (`channels_in_place`), a broadcast word
    # per output position wherever it lies: a strided one reads the padded words at the
    # stride, with no copy into phase planes
    at_stride = quads and tile.channels_as_lanes
    if at_stride and rank == 2:
        grown = spread(grid_in, 1)
        ends = [e + s - g for e, s, g in zip(ends, grown, grid_in)]
        grid_in = list(grown)
    step = tuple(strides) if at_stride else (1,) * rank
    planes = PhasePlanes.of(grid_in, ws, (1,) * rank if at_stride else strides, dilations,
                            spatial)
    lo, hi = out_range(attrs, y_zp.dtype)
    # (strided ones on their phase planes ran slower in place than on the im2col)
    reads_in_place = quads and rank == 2 and ww.ndim == 2 and not planes.strided \
        and in_place_pays(isa, spatial, in_place_width(x_shape, begins, ends))
    if planes.strided and (quads or any(begins) or any(ends)):
        # already a padded copy: a little more of it lets one loop copy every phase
        ends = planes.whole_ends(grid_in, ends)
    return ConvSchedule(
        ws, source, decls, out_words, rank, tuple(dilations), tuple(begins), tuple(ends),
        batch, oc_n, spatial, positions, taps, k_total, groups, by_tap,
        dot.dot_intrinsic(attrs), group, tile,
        worth_parallel(batch * positions * oc_n * k_total, "madd", isa, "int8"), quads,
        planes, step, lo, hi,
        RowEpilogue(bias, multiplier, y_zp, lo, hi, narrows_by_packs(isa)),
        reads_in_place, isa.lanes("int32"))


def tiles(x: Buffer, ww: Buffer, bias: Buffer, x_zp: Buffer, multiplier: Buffer,
          y_zp: Buffer, out: Buffer, attrs: Attrs, isa: ISA, *, serial: bool = False,
          residual: Residual | None = None) -> Stmt:
    """The kernel's body: the variant its schedule takes (the module docstring); with
    `serial`, every loop on one thread (a chunk of a batch whose chunks run in parallel);
    with `residual`, a fused residual add (kiln.kernels.int8.conv_residual) in the tiles'
    epilogues."""
    s = conv_schedule(x, ww, bias, multiplier, y_zp, out, attrs, isa)
    if serial:
        s = replace(s, big=False)
    decls = s.decls
    if residual is not None:  # viewed as the tiles' output
        residual = residual.at(flat_output(out, s.out_words, s.positions))
        s = replace(s, row_epilogue=replace(s.row_epilogue, residual=residual))
        decls = (*decls, residual.decl())
    if s.in_place:
        return seq(*decls, in_place(s.source, ww, x_zp, out, s.out_words, s.row_epilogue,
                                      s.ws, s.begins, s.ends, s.dilations, s.big, isa,
                                      s.intrinsic))
    # bytes of a strided convolution with few channels (a stem's image) go straight
    # into its phase planes, padded there
    split_here = not s.quads and s.planes.strided and s.ws[1] < FEW_CHANNELS
    if s.quads:
        xp, pad = padded_words(s.source, x_zp, s.begins, s.ends)
    elif split_here:
        xp, pad = s.planes.split_padded(x, x_zp, s.begins)
    else:
        xp, pad = padded_input(x, x_zp, s.begins, s.ends)
    grid = ImageGrid.of(s, xp, split=not split_here)
    flat_out = flat_output(out, s.out_words, s.positions)

    def requantized(acc: PrimExpr, oc: PrimExpr) -> PrimExpr:
        # vector code along the channels (vectorize-loops): select clamp, magic rounding
        mult = multiplier[()] if multiplier.ndim == 0 else multiplier[oc]
        return requantize_value(acc + bias[oc], mult, y_zp[()], s.lo, s.hi, y_zp.dtype,
                                selects=True, magic_round=True)

    if s.tile.channels_as_lanes and s.quads:
        nest_ = channels_in_place(s, grid, ww, flat_out, requantized, str(y_zp.dtype))
        return seq(*decls, pad, grid.split, DeclBuffer(grid.view, grid.src, 0),
                   DeclBuffer(flat_out, out, 0), nest_)
    return seq(*decls, pad, *on_im2col(s, grid, ww, out, flat_out, requantized,
                                       str(y_zp.dtype)))


@dataclass(frozen=True)
class ImageGrid:
    """Where an output position reads its input: the phase planes `src` of the padded
    input (filled by `split`) and their grid.

    A strided convolution reads its input through phase planes (`PhasePlanes`): there
    output position o reads plane (c, phase of the tap) at o + the tap's offset, as a
    stride-1 convolution reads its input. With stride 1 the planes are the input, and
    so they are where the channels tile reads a strided convolution's padded words at
    the stride (`step`, ConvSchedule.step). Output position o's words are then packed
    at o's place in the plane grid, q(o) = sum(o_j * step_j * row_j): one loop over q
    reads every plane contiguously and vectorizes (the rows of a 7 x 7 or 14 x 14 image
    are too short to). The columns past the output's width get
    words too, unread: the channels tile reads a row's word at q(o); the positions tile
    only where q(o) = o (`in_grid`: the grid is the output's, as with a 1x1
    convolution, unpadded or strided). `padded`: the im2col's positions (the grid's,
    or the output positions padded to whole tiles, zero words past the last)."""

    src: Buffer
    split: Stmt
    row: tuple[int, ...]
    in_grid: bool
    padded: int
    #: the planes viewed flat, `[N][planes][grid positions]`
    view: Buffer
    #: the grid positions from one output position to the next (ConvSchedule.step)
    step: tuple[int, ...]

    @staticmethod
    def of(s: ConvSchedule, xp: Buffer, split: bool = True) -> ImageGrid:
        """The grid of schedule `s` over its padded input `xp` (with `split` false: its
        phase planes, already filled)."""
        src, fill = s.planes.split(xp) if split else (xp, seq())
        grid = list(s.planes.extents)
        row = tuple(int(np.prod(grid[j + 1:])) for j in range(s.rank))
        tile, nr = s.tile, s.tile.cols
        in_grid = tile.channels_as_lanes or grid[1:] == list(s.spatial[1:])
        if in_grid:
            padded = sum((s.spatial[j] - 1) * s.step[j] * row[j] for j in range(s.rank)) + 1
            if not tile.channels_as_lanes:
                padded = -(-s.positions // nr) * nr
        else:  # the output positions, padded to whole tiles (zero words past the last)
            padded = (-(-s.positions // tile.rows) * tile.rows if tile.channels_as_lanes
                      else -(-s.positions // nr) * nr)
        view = Buffer("x_grid", (s.batch, int(src.shape[1]), int(np.prod(grid))), src.dtype)
        return ImageGrid(src, fill, row, in_grid, padded, view, s.step)

    def at(self, o: Sequence[PrimExpr], rank: int) -> PrimExpr:
        """Output position `o`'s place in the grid, q(o)."""
        return self.tap([o[j] * self.step[j] for j in range(rank)], rank)

    def tap(self, off: Sequence[PrimExpr], rank: int) -> PrimExpr:
        """Where a tap at offsets `off` reads, relative to the output position's q(o)."""
        return sum((off[j] * self.row[j] for j in range(1, rank)), off[0] * self.row[0])


def channels_in_place(s: ConvSchedule, grid: ImageGrid, ww: Buffer, flat_out: Buffer,
                      requantized: Callable[[PrimExpr, PrimExpr], PrimExpr],
                      out_dtype: str) -> Stmt:
    """The channels tile reading its words of 4 channels in place, at q(o) + the tap's
    offset in the grid: no im2col."""
    def read(n: PrimExpr, t: PrimExpr, c4: PrimExpr, q: PrimExpr) -> PrimExpr:
        kk = te.unflatten_index(t, s.ws[2:])
        off = s.planes.offsets(kk)
        return grid.view[n, s.planes.plane(c4, kk), q + grid.tap(off, s.rank)]

    return channel_tiles(InPlace(s.ws[1] // s.group, read), ww, flat_out, s.tile, requantized,
                         s.positions, s.oc_n, s.big, _word_at(s, grid), s.intrinsic,
                         out_dtype, s.out_words, s.row_epilogue.residual)


def _word_at(s: ConvSchedule, grid: ImageGrid) -> Callable[[PrimExpr], PrimExpr]:
    """Where the channels tile reads output position `p`'s words (p past the last
    position: the last's)."""
    def word_at(p: PrimExpr) -> PrimExpr:
        if not grid.in_grid:
            return p
        return grid.at(te.unflatten_index(min_(p, s.positions - 1), s.spatial), s.rank)

    return word_at


def im2col_word(s: ConvSchedule) -> Callable[[PrimExpr, Load], PrimExpr]:
    """`word(g, load)`: the im2col word of group g, its `group` k read by `load(plane,
    offsets)` (0 past K)."""
    ws, planes, group = s.ws, s.planes, s.group

    def word(g: PrimExpr, load: Load) -> PrimExpr:
        if s.quads:  # k = (tap, c): the word of channels 4 c4 .. 4 c4 + 3 at tap g // (C / 4)
            quarter = ws[1] // group
            kk = te.unflatten_index(g // quarter, ws[2:])
            return load(planes.plane(g % quarter, kk), planes.offsets(kk))

        def value(i: int) -> PrimExpr:
            k = g * group + i
            if s.by_tap:  # k = (tap, c)
                c, kk = k % ws[1], te.unflatten_index(min_(k // ws[1], s.taps - 1), ws[2:])
            else:
                c, kk = k // s.taps, te.unflatten_index(k % s.taps, ws[2:])
            byte = qw.a_byte(load(planes.plane(min_(c, ws[1] - 1), kk), planes.offsets(kk)))
            if s.k_total % group:
                byte = Select(compare("lt", k, s.k_total), byte, as_expr(0, "int32"))
            return byte

        return dot.pack_word(value, group)

    return word


def on_im2col(s: ConvSchedule, grid: ImageGrid, ww: Buffer, out: Buffer, flat_out: Buffer,
              requantized: Callable[[PrimExpr, PrimExpr], PrimExpr], out_dtype: str
              ) -> tuple[Stmt, ...]:
    """Either tile on an im2col of words `[N][groups][positions]`, packed group by group
    before the tiles (or, `fill`, a block of output rows at a time within them)."""
    # a group's words start an odd number of cache lines after the previous group's: a
    # tile reads one vector per group, and a pitch of an even count of lines (3136
    # positions: 196) maps those vectors onto a few cache sets, which then evict one
    # another between the tile's row tiles
    lines = -(-grid.padded // 16)
    words = Buffer("x_words", (s.batch, s.groups, 16 * (lines + 1 - lines % 2)), "int32",
                   "global")
    word = im2col_word(s)
    names = tuple(f"o{j}" for j in range(s.rank))
    tile, nr, spatial, src = s.tile, s.tile.cols, s.spatial, grid.src

    def pack_group(n: PrimExpr, g: PrimExpr) -> Stmt:
        if grid.in_grid:
            extent = grid.padded if tile.channels_as_lanes else s.positions
            rows = tile_loop("q", extent, lambda q: Store(words, word(g, lambda c, off: grid.view[
                n, c, q + sum(off[j] * grid.row[j] for j in range(s.rank))]), (n, g, q)))
        else:  # per output row: contiguous loads along the plane's row
            rows = nest(names, spatial, lambda *o: Store(words, word(g, lambda c, off: src[(
                n, c, *(o[j] + off[j] for j in range(s.rank)))]),
                (n, g, te.flat_index(o, spatial))))
        if s.positions >= grid.padded or (grid.in_grid and tile.channels_as_lanes):
            return rows
        tail = tile_loop("p", grid.padded - s.positions, lambda p: Store(
            words, as_expr(0, "int32"), (n, g, p)), start=s.positions)
        return seq(rows, tail)

    # the positions tile off the output's grid: the im2col is packed a block of whole
    # output rows at a time, just before that block's column tiles read it (in the same
    # thread: in cache, not evicted by the whole image's words; ResNet-50's first layer
    # has 1.8 MB of words), one hand-off to the pool instead of two
    block = block_rows(spatial, nr, s.groups) if (
        not tile.channels_as_lanes and not grid.in_grid) else 0

    def fill(n: PrimExpr, b: PrimExpr) -> Stmt:
        width = spatial[1]
        return tile_loop("g", s.groups, lambda g: nest(
            names, (block, width), lambda o0, o1: Store(words, word(g, lambda c, off: src[(
                n, c, b * block + o0 + off[0], o1 + off[1])]),
                (n, g, (b * block + o0) * width + o1))))

    pack = seq() if block else tile_loop("n", s.batch, lambda n: tile_loop(
        "g", s.groups, lambda g: pack_group(n, g),
        "parallel" if s.big and s.groups > 1 else "serial"))
    if tile.channels_as_lanes:
        nest_ = channel_tiles(words, ww, flat_out, tile, requantized, s.positions, s.oc_n,
                              s.big, _word_at(s, grid), s.intrinsic, out_dtype, s.out_words,
                              s.row_epilogue.residual)
    else:
        nest_ = position_tiles(words, ww, flat_out, tile, s.row_epilogue, s.positions, s.oc_n,
                               s.big, s.intrinsic,
                               (block * spatial[1] // nr, fill) if block else None,
                               out_dtype if s.out_words else None, s.lanes)
    views = (DeclBuffer(grid.view, src, 0),) if grid.in_grid else ()
    return (grid.split, *views, Allocate(words), pack, DeclBuffer(flat_out, out, 0), nest_)


#: Input channels below which a strided convolution's byte input is split into its
#: phase planes in one nest over the plane rows (`PhasePlanes.split_padded`): the stem's
#: 3 channels gave a parallel loop per channel and one over the 3 for its padded copy;
#: with many channels the rows, outside them, visit every channel's planes between two
#: rows of one (the strided layers of the AVX2 int16 pairs, 128-1024 channels, each
#: measured 1-1.5% slower so), where the padded copy splits over the channels.
FEW_CHANNELS = 8


#: Most bytes of im2col words a block of output rows packs at a time (`block_rows`).
BLOCK_BYTES = 384 * 1024


#: Blocks (`block_rows`) that split evenly over 2, 4 or 8 threads where the rows allow:
#: 7 blocks of 16 rows (ResNet-50's 7 x 7/2 first layer, 112 rows) left one of two
#: threads 4 blocks, the other 3.
EVEN_BLOCKS = 8


def block_rows(spatial: Sequence[int], nr: int, groups: int) -> int:
    """Output rows of a 2-D convolution's im2col block: whole column tiles (`nr`
    positions) that divide the image's rows evenly, as many as fit BLOCK_BYTES of
    words and leave at least EVEN_BLOCKS blocks, or else at least 4; 0 when no such
    block exists."""
    if len(spatial) != 2:
        return 0
    rows, width = spatial
    fits = [r for r in range(1, rows + 1) if rows % r == 0 and r * width % nr == 0
            and rows // r >= 4 and r * width * groups * 4 <= BLOCK_BYTES]
    return max([r for r in fits if rows // r >= EVEN_BLOCKS] or fits, default=0)
