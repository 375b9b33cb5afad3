"""The input copies of the dot-form convolution's kernel (kiln.kernels.int8.conv_dot):
the input padded with its zero point (`padded_input`), or copied once as words of 4
channels (`padded_words`), and a strided convolution's input split into phase planes
(`PhasePlanes`), where its taps read contiguously as a stride-1 convolution's do.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kiln.ir.tensor import (
    Allocate,
    Buffer,
    DeclBuffer,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.kernels.int8 import dot
from kiln.kernels.tiles import loop as tile_loop
from kiln.kernels.tiles import nest
from kiln.ops import quant_words as qw
from kiln.ops import te


def padded_input(x: Buffer, x_zp: Buffer, begins: Sequence[int], ends: Sequence[int]
                 ) -> tuple[Buffer, Stmt]:
    """`x` padded with its zero point (a scratch copy: the im2col reads need no bounds
    tests), or `x` itself when the convolution is not padded. The copy fills the whole
    scratch with `x_zp`, then copies the rows: both contiguous, so both vectorize."""
    if not any(begins) and not any(ends):
        return x, seq()
    shape = (*(int(d) for d in x.shape[:2]),
             *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
    xp = Buffer("x_padded", shape, x.dtype, "global")
    flat = Buffer("x_padded_flat", (int(np.prod(shape)),), x.dtype)
    fill = tile_loop("i", int(np.prod(shape)), lambda i: Store(flat, x_zp[()], (i,)))

    def copy(*i: PrimExpr) -> Stmt:
        n, c, rest = i[0], i[1], i[2:]
        return Store(xp, x[(n, c, *rest)], (n, c, *(r + b for r, b in zip(rest, begins))))

    rows = nest(("n", "c", *(f"i{j}" for j in range(len(shape) - 2))),
                [int(d) for d in x.shape], copy)
    return xp, seq(Allocate(xp), DeclBuffer(flat, xp, 0), fill, rows)


#: The top bit of each byte of a word (int32): flipping them adds 128 to each int8 byte
#: (kiln.ops.quant_words.a_shift).
_SIGN_BITS = -0x7F7F7F80


@dataclass(frozen=True)
class ConvInput:
    """A dot-form convolution's input: NCHW bytes, or (`words_of`: the bytes' dtype) the
    int32 view `[N][C / 4][H][W]` of a WORDS_LAYOUT input."""

    buffer: Buffer
    words_of: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The NCHW shape."""
        dims = [int(d) for d in self.buffer.shape]
        if self.words_of is None:
            return tuple(dims)
        return (dims[0], dims[1] * qw.GROUP, *dims[2:])

    @staticmethod
    def of(x: Buffer, in_words: bool) -> tuple[ConvInput, tuple[Stmt, ...]]:
        """The input of buffer parameter `x` and the declarations it needs."""
        if not in_words:
            return ConvInput(x), ()
        view = Buffer("x_in_words", tuple(int(d) for d in x.shape[:4]), "int32")
        return ConvInput(view, str(x.dtype)), (DeclBuffer(view, x, 0),)


def padded_words(src: ConvInput, x_zp: Buffer, begins: Sequence[int], ends: Sequence[int]
                 ) -> tuple[Buffer, Stmt]:
    """The input (C a multiple of 4) padded with its zero point as words of 4 channels,
    `[N][C / 4][*padded spatial]` int32: byte i of word (n, c4, ...) is channel 4 c4 + i
    at that place, an unsigned byte as the dot product reads it. With k = (tap, c)
    (`int8-pairs=saturate`), an im2col word is 4 channels of one tap: a word of this
    grid, so the im2col copies words instead of gathering bytes from 4 planes (and
    the gather runs once per input word here, not once per tap). An input already in
    words (WORDS_LAYOUT) copies whole words, and none when it needs no padding and no
    shift (unsigned bytes): it is then read in place."""
    x = src.buffer
    rank = len(x.shape) - 2
    if src.words_of == "uint8" and not any(begins) and not any(ends):
        return x, seq()
    shape = (int(x.shape[0]), src.shape[1] // qw.GROUP,
             *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
    xw = Buffer("x_words4", shape, "int32", "global")

    # the words stored through one view, each plane flat (a loop splits along c4 only
    # when every store in it goes to one buffer)
    plane = int(np.prod(shape[2:]))
    planes = Buffer("x_words4_planes", (shape[0], shape[1], plane), "int32")

    def copy(n: PrimExpr, c4: PrimExpr, *i: PrimExpr) -> Stmt:
        if src.words_of is None:
            word = dot.pack_word(lambda b: qw.a_byte(
                x[(n, c4 * qw.GROUP + b, *i)]))
        else:  # int8 bytes shifted to unsigned ones: their top bits flipped
            word = x[(n, c4, *i)]
            if qw.a_shift(src.words_of):
                word = word ^ as_expr(_SIGN_BITS, "int32")
        at = i[0] + begins[0]  # the place in the plane, row-major
        for j in range(1, rank):
            at = at * shape[2 + j] + (i[j] + begins[j])
        return Store(planes, word, (n, c4, at))

    spatial = [int(d) for d in x.shape[2:]]
    if not any(begins) and not any(ends):
        return xw, seq(Allocate(xw), DeclBuffer(planes, xw, 0), nest(
            ("n", "c4", *(f"i{j}" for j in range(rank))), [shape[0], shape[1], *spatial],
            copy))
    # plane by plane: the zero point over the plane, then its rows, while the plane is
    # in the L1 cache, in one loop nest (one hand-off where it is split); the word is
    # computed once, since packed in the loop it would look to `parallelize` several
    # times the copy's work
    zp_word = Var("zp_word", "int32")

    def fill_and_copy(n: PrimExpr, c4: PrimExpr) -> Stmt:
        fill = tile_loop("i", plane, lambda i: Store(planes, zp_word, (n, c4, i)))
        return seq(fill, nest(tuple(f"i{j}" for j in range(rank)), spatial,
                              lambda *i: copy(n, c4, *i)))

    return xw, seq(Allocate(xw), DeclBuffer(planes, xw, 0),
                   LetStmt(zp_word, dot.pack_word(lambda i: qw.a_byte(x_zp[()]))),
                   nest(("n", "c4"), shape[:2], fill_and_copy))


@dataclass(frozen=True)
class PhasePlanes:
    """The padded input of a strided convolution split into phase planes: along a
    dimension of stride s, input index i = s * i' + phase, and a tap at offset
    t = k * dilation reads phase t % s at i' = o + t // s for output position o. The
    planes `[N][C * phases][*extents]` (phases of a dimension: s, or 1 when every tap
    reads phase 0, as a 1x1 convolution's) are copied once, each from whole rows of the
    input; then every tap's reads for an output row are contiguous (stride-2 reads of
    bytes otherwise, one at a time). With stride 1 the planes are the input itself.
    When the padded input holds every plane whole (`whole_ends`), one loop nest copies
    all phases (a row's phases read its bytes in pairs or groups of s)."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    phases: tuple[int, ...]
    extents: tuple[int, ...]

    @staticmethod
    def of(grid: Sequence[int], ws: Sequence[int], strides: Sequence[int],
           dilations: Sequence[int], spatial: Sequence[int]) -> PhasePlanes:
        """The planes the convolution (weight shape `ws`, output `spatial`) reads from
        its padded input's spatial `grid`."""
        rank = len(spatial)
        taps = [[k * dilations[j] for k in range(ws[2 + j])] for j in range(rank)]
        phases = tuple(1 if all(t % s == 0 for t in ts) else s
                       for ts, s in zip(taps, strides))
        # a plane holds the rows its taps read: o + t // s for every output o and tap t
        extents = tuple(spatial[j] + max(taps[j]) // strides[j] if strides[j] > 1
                        else int(grid[j]) for j in range(rank))
        return PhasePlanes(tuple(strides), tuple(dilations), phases, extents)

    def whole_ends(self, grid: Sequence[int], ends: Sequence[int]) -> list[int]:
        """`ends` (the padding past the input's end) grown so that the padded input holds
        every phase plane whole (s * extent along a dimension of s phases): its rows then
        copy in one loop nest. The rows added are the zero point's and never read."""
        need = [s * e if p > 1 else s * (e - 1) + 1
                for s, e, p in zip(self.strides, self.extents, self.phases)]
        return [end + max(0, n - g) for end, n, g in zip(ends, need, grid)]

    @property
    def strided(self) -> bool:
        return any(s > 1 for s in self.strides)

    def plane(self, c: PrimExpr, kk: Sequence[PrimExpr]) -> PrimExpr:
        """The plane tap `kk` of input channel `c` reads."""
        if not self.strided:
            return c
        phase = [(k * d) % s if p > 1 else as_expr(0)
                 for k, d, s, p in zip(kk, self.dilations, self.strides, self.phases)]
        return c * int(np.prod(self.phases)) + te.flat_index(phase, self.phases)

    def offsets(self, kk: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
        """Where tap `kk` reads its plane, relative to the output position."""
        return tuple(k * d if s == 1 else (k * d) // s
                     for k, d, s in zip(kk, self.dilations, self.strides))

    def split(self, xp: Buffer) -> tuple[Buffer, Stmt]:
        """The planes of the padded input `xp` and the copy that fills them (`xp` itself
        and nothing with stride 1). A phase's rows past the input's end are never read
        and not copied."""
        if not self.strided:
            return xp, seq()
        batch, chans = int(xp.shape[0]), int(xp.shape[1])
        count = int(np.prod(self.phases))
        planes = Buffer("x_phases", (batch, chans * count, *self.extents), xp.dtype, "global")
        grid = [int(d) for d in xp.shape[2:]]
        names = ("n", "c", *(f"i{j}" for j in range(len(grid))))
        all_phases = list(itertools.product(*(range(p) for p in self.phases)))

        def read(n: PrimExpr, c: PrimExpr, i: Sequence[PrimExpr], phase: Sequence[int]
                 ) -> PrimExpr:
            return xp[(n, c, *(i[j] * s + p for j, (s, p) in enumerate(
                zip(self.strides, phase))))]

        if self.whole_ends(grid, [0] * len(grid)) == [0] * len(grid):
            return planes, seq(Allocate(planes), nest(
                names, [batch, chans, *self.extents], lambda n, c, *i: seq(*(
                    Store(planes, read(n, c, i, phase), (n, c * count + index, *i))
                    for index, phase in enumerate(all_phases)))))
        copies = []
        for index, phase in enumerate(all_phases):
            rows = [min(e, -(-(g - p) // s)) for e, g, p, s in
                    zip(self.extents, grid, phase, self.strides)]

            def copy(n: PrimExpr, c: PrimExpr, *i: PrimExpr, index: int = index,
                     phase: tuple[int, ...] = phase) -> Stmt:
                return Store(planes, read(n, c, i, phase), (n, c * count + index, *i))

            copies.append(nest(names, [batch, chans, *rows], copy))
        return planes, seq(Allocate(planes), *copies)

    def split_padded(self, x: Buffer, x_zp: Buffer, begins: Sequence[int]) -> tuple[Buffer, Stmt]:
        """The planes of `x` padded with its zero point (`begins` before each spatial
        dimension, the zero point as far as the planes reach past its end), filled from
        `x` itself in one loop nest: one pass over the bytes and one parallel loop (the
        plane rows) where `padded_input` and `split` made two passes and a parallel loop
        per channel. Along the last dimension the positions whose every phase reads
        inside `x` copy in one loop, all phases at once (a stride-2 row reads its bytes
        in pairs); the few at either end, and the rows wholly in the padding, take the
        zero point."""
        batch, chans = int(x.shape[0]), int(x.shape[1])
        dims = [int(d) for d in x.shape[2:]]
        last, count = len(dims) - 1, int(np.prod(self.phases))
        width = self.extents[last]
        planes = Buffer("x_phases", (batch, chans * count, *self.extents), x.dtype, "global")
        all_phases = list(itertools.product(*(range(p) for p in self.phases)))

        def inside(j: int, p: int) -> tuple[int, int]:
            # the plane indices whose input index, i * s + p - begin, lies in x
            s, b = self.strides[j], begins[j]
            lo = min(self.extents[j], max(0, -(-(b - p) // s)))
            return lo, max(lo, min(self.extents[j], -(-(dims[j] + b - p) // s)))

        spans = [inside(last, p) for p in range(self.phases[last])]
        lo = max(a for a, _ in spans)
        hi = max(lo, min(b for _, b in spans))

        def source(j: int, i: PrimExpr, p: int) -> PrimExpr:
            return i * self.strides[j] + (p - begins[j])

        def span(start: int, stop: int, body: Callable[[PrimExpr], Stmt]) -> Stmt:
            return tile_loop(f"i{last}", stop - start, body, start=start) if stop > start \
                else seq()

        def row(n: PrimExpr, c: PrimExpr, outer: Sequence[PrimExpr],
                phases: Sequence[tuple[int, ...]]) -> Stmt:
            def store(i: PrimExpr, phase: tuple[int, ...], value: PrimExpr) -> Stmt:
                return Store(planes, value, (n, c * count + all_phases.index(phase), *outer, i))

            def read(i: PrimExpr, phase: tuple[int, ...], edge: bool) -> Stmt:
                rows = [source(j, outer[j], phase[j]) for j in range(last)]
                col = source(last, i, phase[last])
                if not edge:
                    return store(i, phase, x[(n, c, *rows, col)])
                at = min_(max_(col, 0), dims[last] - 1)
                return store(i, phase, Select((col >= 0) & (col < dims[last]),
                                              x[(n, c, *rows, at)], x_zp[()]))

            def edge(start: int, stop: int, phase: tuple[int, ...]) -> Stmt:
                return span(start, stop, lambda i: read(i, phase, True))

            return seq(
                *(edge(0, lo, ph) for ph in phases),
                span(lo, hi, lambda i: seq(*(read(i, ph, False) for ph in phases))),
                *(edge(hi, width, ph) for ph in phases))

        def pad(n: PrimExpr, plane: PrimExpr, outer: Sequence[PrimExpr]) -> Stmt:
            return span(0, width, lambda i: Store(planes, x_zp[()], (n, plane, *outer, i)))

        def rows(n: PrimExpr, *rest: PrimExpr) -> Stmt:
            outer, c, parts = rest[:-1], rest[-1], []
            for head in itertools.product(*(range(p) for p in self.phases[:last])):
                phases = [(*head, p) for p in range(self.phases[last])]
                filled = seq(*(pad(n, c * count + all_phases.index(ph), outer)
                               for ph in phases))
                within: PrimExpr | None = None
                for j in range(last):
                    a, b = inside(j, head[j])
                    test = (outer[j] >= a) & (outer[j] < b)
                    within = test if within is None else within & test
                copied = row(n, c, outer, phases)
                parts.append(copied if within is None else IfThenElse(within, copied, filled))
            return seq(*parts)

        # the plane rows outside the channels: every store indexes the plane's row by
        # that loop's variable, so the rows are the loop that splits over the threads
        names = ("n", *(f"i{j}" for j in range(last)), "c")
        return planes, seq(Allocate(planes),
                           nest(names, [batch, *self.extents[:last], chans], rows))


#: Bytes of two cache lines: a pitch that is a multiple of it maps a column of words
#: (one per plane) onto every other cache set or fewer.
_LINE_PAIR = 128


def spread(extents: Sequence[int], planes: int) -> tuple[int, ...]:
    """2-D `extents` of planes of int32 words grown (the added rows and columns are never
    read) so that `planes` of them, the step from one channel word to the next, are not
    a multiple of two cache lines: a column first when every row count would be (rows
    of 8 words in 4 phase planes), then rows. The channels-as-lanes tile broadcasts one
    word of each channel word's plane in turn: at a pitch of 16 x 16 words (1 KiB, a
    14 x 14 image padded by one) those words fall into 4 of the L1 cache's 64 sets and
    evict one another between the tile's steps."""
    rows, cols = int(extents[0]), int(extents[1])
    if planes * cols * 4 % _LINE_PAIR == 0:
        cols += 1
    while planes * rows * cols * 4 % _LINE_PAIR == 0:
        rows += 1
    return (rows, cols)
