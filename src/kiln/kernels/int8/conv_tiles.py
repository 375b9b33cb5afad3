"""The register tiles of the dot-form convolution (kiln.kernels.int8.conv_dot).

`position_tiles`: rows of output channels (a broadcast weight word each) x `nr` output
positions (vectors of input words), one dot product per accumulator and word; stores
contiguous along the output row, requantized in the epilogue (`RowEpilogue`: bias with
the zero-point correction, per-channel multiplier, range). `channel_tiles`: the
transposed tile, output channels as the lanes (a row of a weight panel) and output
positions as the rows (a broadcast input word each), requantized along the lanes. Either
reads its input words from an im2col buffer `[N][groups][positions]` or in place
(`InPlace`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    DOT4_U8S8,
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    IfThenElse,
    Intrin,
    PrimExpr,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_tile import ConvTile, word_stores
from kiln.kernels.tiles import lanes_loop, nest, parallel_tiles
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import quant_words as qw
from kiln.ops.quant import requantize_float, requantize_value

if TYPE_CHECKING:  # conv_residual builds on this module's byte helpers
    from kiln.kernels.int8.conv_residual import Residual

#: Column tiles that keep the threads busy; with fewer, row tiles (channels) run in parallel.
PARALLEL_TILES = 8
#: `requantized(acc, channel)`: the output value of a channels tile's accumulator
Epilogue = Callable[[PrimExpr, PrimExpr], PrimExpr]


def unsigned_byte(value: PrimExpr, dtype: str) -> PrimExpr:
    """An output byte of `dtype` (uint8 or int8) as int32 in [0, 255], as `dot.pack_word`
    packs it."""
    q = Cast("int32", value)
    return q if dtype == "uint8" else Select(compare("lt", q, 0), q + 256, q)


@dataclass(frozen=True)
class RowEpilogue:
    """The requantization of one output channel's row of a positions tile. Its
    accumulators start from the channel's bias (`start`); the multiplier and the zero
    point are first copied into registers (`buffers` / `load`), so the store loop over
    the row reads only the tile's own buffers: the vectorize-loops pass can then prove
    its lanes independent and emit it as vector code
    (left to LLVM, it unrolls a one-vector row and vectorizes across the rows with
    gathers and byte scatters, or vectorizes it again after unrolling it, at a large
    share of the compile time). The clamp is the select form
    (`requantize_value(..., selects=True)`: one `vmaxps` / `vminps` per bound), the
    rounding the magic number's (`magic_round`: int32 and float32 lanes only), the store
    a narrowing one (int32 lanes to bytes; with `packs`, clamped to the range as well:
    `narrows_by_packs`). With `residual` (a fused residual add,
    kiln.kernels.int8.conv_residual) each requantized value is added to the residual's
    element where it is stored, whose view is the tiles' output's."""

    bias: Buffer
    multiplier: Buffer
    y_zp: Buffer
    lo: int
    hi: int
    packs: bool = False
    residual: Residual | None = None

    def start(self, oc: PrimExpr) -> PrimExpr:
        """The value channel `oc`'s accumulators start from: its bias (the correction of
        the zero points included), so the epilogue adds nothing."""
        return self.bias[oc]

    def buffers(self, suffix: str = "") -> tuple[Buffer, Buffer]:
        """The per-tile register copies (multiplier, zero point)."""
        return (Buffer(f"row_multiplier{suffix}", (1,), "float32", "local"),
                Buffer(f"row_zp{suffix}", (1,), self.y_zp.dtype, "local"))

    def load(self, regs: Sequence[Buffer], oc: PrimExpr) -> Stmt:
        """Copy channel `oc`'s parameters into `regs`."""
        m = self.multiplier
        zero = (as_expr(0, "int64"),)
        return seq(Store(regs[0], m[()] if m.ndim == 0 else m[oc], zero),
                   Store(regs[1], self.y_zp[()], zero))

    def value(self, regs: Sequence[Buffer], acc: PrimExpr) -> PrimExpr:
        """The requantized output of accumulator `acc` (bias included) of the loaded
        channel."""
        return requantize_value(acc, regs[0][0], regs[1][0], self.lo, self.hi,
                                self.y_zp.dtype, selects=True, magic_round=True,
                                packs=self.packs)

    def value_float(self, regs: Sequence[Buffer], acc: PrimExpr, shift: int) -> PrimExpr:
        """`value` plus `shift` as an exact float32 (kiln.ops.quant.requantize_float)."""
        return requantize_float(acc, regs[0][0], regs[1][0], self.lo, self.hi, shift)


@dataclass(frozen=True)
class InPlace:
    """Where a positions tile reads its input words without an im2col: word group g =
    `outer` * `inner` group + inner group (taps x words of channels) at `read(n, outer,
    inner, p)`; the step loop is nested the same way, so the read's address steps by a
    constant in the inner loop (a flat loop over g divides per step)."""

    inner: int
    read: Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


def steps(words: Buffer | InPlace, groups: int, n: PrimExpr,
          products: Callable[[PrimExpr, Callable[[PrimExpr], PrimExpr]], Stmt]) -> Stmt:
    """A tile's loop over its word groups g: `products(g, word)`, `word(p)` the input word
    of group g at position p (`words[n, g, p]`, or read in place, `InPlace`: nested
    loops over its outer and inner groups)."""
    if isinstance(words, InPlace):
        inner, read = words.inner, words.read
        return tile_loop("t", groups // inner, lambda t: tile_loop(
            "c", inner, lambda c: products(t * inner + c, lambda p: read(n, t, c, p))))
    return tile_loop("g", groups, lambda g: products(g, lambda p: words[n, g, p]))


@dataclass(frozen=True)
class PositionStores:
    """The epilogue of a positions tile (`position_tiles`): each row requantized
    (`RowEpilogue`; with its fused residual add, kiln.kernels.int8.conv_residual) and
    stored along the output row into `flat_out`, or with `out_bytes` each 4 rows packed
    into a word of 4 channels per position (WORDS_LAYOUT). `shape`: the tile's rows and
    columns; `rest`: the positions of the last of `col_tiles` column tiles."""

    flat_out: Buffer
    epilogue: RowEpilogue
    shape: tuple[int, int]
    rest: int
    col_tiles: int
    oc_n: int
    out_bytes: str | None

    def of(self, n: PrimExpr, ct: PrimExpr, rt: PrimExpr, acc: Buffer, last: bool | None,
           row: Callable[[PrimExpr], PrimExpr]) -> Stmt:
        """The stores of the tile at column tile `ct`, row tile `rt` (`acc` its
        accumulators, `last` whether it is the last column tile, None: either; `row(r)`
        the output channel of row r)."""
        epilogue, flat_out, out_bytes = self.epilogue, self.flat_out, self.out_bytes
        (mr, nr), rest, width = self.shape, self.rest, int(acc.shape[1])
        regs = epilogue.buffers()
        # a fused residual add: its coefficients in registers, each row's residual
        # elements copied into a local row before the stores read them
        res = epilogue.residual.rows(width, nr) if epilogue.residual is not None else None

        def output(regs_: Sequence[Buffer], accumulator: PrimExpr, v: PrimExpr,
                   byte: int = 0) -> PrimExpr:
            if res is None:
                return epilogue.value(regs_, accumulator)
            return res.value(epilogue.value_float(regs_, accumulator, res.shift), v, byte)

        def along_row(first: PrimExpr, loads: Stmt, store_at: Callable[[PrimExpr], Stmt],
                      at: Callable[[PrimExpr], tuple[PrimExpr, ...]]) -> Stmt:
            # whole column tiles store unguarded (vector code); the last, partial one
            # stores its positions only; rows past the last channel (whose first row is
            # `first`) store nothing
            def lanes(extent: int) -> Stmt:
                stores = lanes_loop("v", extent, store_at)
                return stores if res is None else seq(res.copy(extent, at), stores)

            stores: Stmt = lanes(rest if last else width)
            if rest != nr and last is None:
                stores = IfThenElse(compare("lt", ct, self.col_tiles - 1), stores, lanes(rest))
            stores = seq(loads, stores)
            if self.oc_n % mr == 0:
                return stores
            return IfThenElse(compare("lt", rt * mr + first, self.oc_n), stores)

        def store_row(r: PrimExpr) -> Stmt:
            def at(v: PrimExpr) -> tuple[PrimExpr, ...]:
                return (n, rt * mr + r, ct * nr + v)

            return along_row(r, epilogue.load(regs, row(r)), lambda v: Store(
                flat_out, output(regs, acc[r, v], v), at(v)), at)

        setup = res.setup() if res is not None else ()
        if out_bytes is None:
            return seq(*(Allocate(b) for b in regs), *setup,
                       tile_loop("r", mr, store_row, "unrolled"))
        # WORDS_LAYOUT: rows 4 q .. 4 q + 3 (4 channels) requantized and packed to a word
        # per position, along the lanes (vector code)
        quad = [epilogue.buffers(f"_{b}") for b in range(qw.GROUP)]

        def store_words(q: PrimExpr) -> Stmt:
            first = q * qw.GROUP

            def at(v: PrimExpr) -> tuple[PrimExpr, ...]:
                return (n, rt * (mr // qw.GROUP) + q, ct * nr + v)

            def store(v: PrimExpr) -> Stmt:
                word = dot.pack_word(lambda b: unsigned_byte(
                    output(quad[b], acc[first + b, v], v, b), out_bytes))
                return Store(flat_out, word, at(v))

            return along_row(first, seq(*(epilogue.load(quad[b], row(first + b))
                                          for b in range(qw.GROUP))), store, at)

        return seq(*(Allocate(b) for regs_ in quad for b in regs_), *setup,
                   tile_loop("q", mr // qw.GROUP, store_words, "unrolled"))


def position_tiles(words: Buffer | InPlace, ww: Buffer, flat_out: Buffer, tile: ConvTile,
                   epilogue: RowEpilogue, positions: int, oc_n: int, big: bool,
                   intrinsic: str = DOT4_U8S8,
                   blocks: tuple[int, Callable[[PrimExpr, PrimExpr], Stmt]] | None = None,
                   out_bytes: str | None = None, lanes: int = 0) -> Stmt:
    """Tiles of output channels (a broadcast weight word each) x output positions (the
    lanes: vectors of input words, `words[n, g, p]`, or read in place, `InPlace`),
    stored along the output rows. With `blocks` (column tiles per block,
    `fill(n, block)`), the blocks run in parallel, each packing its words with `fill`
    before its column tiles. With `out_bytes` (the output's byte dtype) `flat_out` is
    int32 words of 4 channels `[N][OC / 4][positions]` (WORDS_LAYOUT): each 4 rows of
    the tile (rows a multiple of 4) store one word per position. With `lanes` (int32
    lanes of a vector) the last column tile is only as wide as its positions need
    (`dot.tail_cols`); the input words must then cover no more than the positions' vectors."""
    batch, groups = int(flat_out.shape[0]), int(ww.shape[1])
    mr, nr = tile.rows, tile.cols
    col_tiles, row_tiles = -(-positions // nr), -(-oc_n // mr)
    rest = positions - (col_tiles - 1) * nr  # positions of the last column tile
    tail = dot.tail_cols(rest, nr, lanes)

    def one(n: PrimExpr, ct: PrimExpr, rt: PrimExpr) -> Stmt:
        if tail == nr:
            return one_of(n, ct, rt, nr, None)
        # the last column tile narrowed to the vectors its positions fill
        return IfThenElse(compare("lt", ct, col_tiles - 1), one_of(n, ct, rt, nr, False),
                          one_of(n, ct, rt, tail, True))

    def one_of(n: PrimExpr, ct: PrimExpr, rt: PrimExpr, width: int, last: bool | None
               ) -> Stmt:
        """The tile at column tile `ct` (`width` lanes from position ct * nr); `last`:
        whether it is the last column tile (None: either)."""
        acc = Buffer("acc", (mr, width), "int32", "local")

        def row(r: PrimExpr) -> PrimExpr:
            return rt * mr + r if oc_n % mr == 0 else min_(rt * mr + r, oc_n - 1)

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", width, lambda v: Store(acc, epilogue.start(row(r)), (r, v)), "vectorized"))

        def products(g: PrimExpr, word: Callable[[PrimExpr], PrimExpr]) -> Stmt:
            return tile_loop("r", mr, lambda r: tile_loop("v", width, lambda v: Store(
                acc, Intrin(intrinsic, (acc[r, v], word(ct * nr + v), ww[row(r), g])),
                (r, v)), "vectorized"), "unrolled")

        step = steps(words, groups, n, products)
        stores = PositionStores(flat_out, epilogue, (mr, nr), rest, col_tiles, oc_n, out_bytes)
        return seq(Allocate(acc), zero, step, stores.of(n, ct, rt, acc, last, row))

    if blocks is not None:
        per, fill = blocks
        return tile_loop("n", batch, lambda n: tile_loop("b", col_tiles // per, lambda b: seq(
            fill(n, b), tile_loop("ct", per, lambda ct: tile_loop(
                "rt", row_tiles, lambda rt: one(n, b * per + ct, rt))))),
            "parallel" if big else "serial")
    if col_tiles >= PARALLEL_TILES or row_tiles < col_tiles:
        # column tiles outer: each thread reads the input words of its positions
        return tiles_of(batch, (col_tiles, row_tiles), one, big)
    # few output positions (one column tile): output channels outer
    return tiles_of(batch, (row_tiles, col_tiles), lambda n, rt, ct: one(n, ct, rt), big)


def tiles_of(batch: int, extents: tuple[int, int], one: Callable[..., Stmt], big: bool
             ) -> Stmt:
    """`one(n, i, j)` for every image and tile (i, j) of `extents`: with `big`, one
    parallel loop over all of them, split in contiguous shares (a thread takes
    consecutive tiles of the outer dimension, and so reads the same inputs for all of
    its inner tiles); else serial. A parallel loop over the outer dimension alone
    leaves a thread idle where it has few tiles (5 weight panels on two threads: 3 and
    2)."""
    if big:
        return parallel_tiles((batch, *extents), one)
    return tile_loop("n", batch, lambda n: nest(("i", "j"), extents, lambda i, j: one(n, i, j)))


def channel_tiles(words: Buffer | InPlace, ww: Buffer, flat_out: Buffer, tile: ConvTile,
                  requantized: Epilogue, positions: int, oc_n: int, big: bool,
                  word_at: Callable[[PrimExpr], PrimExpr], intrinsic: str = DOT4_U8S8,
                  out_dtype: str = "", words_out: bool = False,
                  residual: Residual | None = None) -> Stmt:
    """Tiles of output positions (a broadcast input word each, output position p's at
    `words[n, g, word_at(p)]`) x output channels (the lanes: a row of a weight panel),
    the per-channel requantization along the lanes into bytes of `out_dtype` (default:
    `flat_out`'s). With `words_out`, `flat_out` is int32 words of 4 channels `[N][OC /
    4][positions]` (WORDS_LAYOUT): each row's bytes are 4 channels to a word already.
    The tiles run in parallel panel by panel (`tiles_of`): a thread keeps its weight
    panel in cache while the positions' words stream past it. `residual`: a fused
    residual add (`residual_tile`), viewed as `flat_out`."""
    batch, groups = int(flat_out.shape[0]), int(ww.shape[1])
    mr, nr = tile.rows, tile.cols
    col_tiles, row_tiles = int(ww.shape[0]), -(-positions // mr)
    table, fill = _row_words(row_tiles * mr, word_at)

    def row_word(p: PrimExpr) -> PrimExpr:
        return Cast(INDEX_DTYPE, table[p])

    # tiles of 4 rows over whole words of each channel's bytes store a channel's 4
    # output bytes as one int32 (a tile of 4 x 16 bytes: 16 stores instead of 64)
    byte_dtype = out_dtype or str(flat_out.dtype)
    out_words = (Buffer("out_words", (batch, oc_n, positions // qw.GROUP), "int32")
                 if word_stores(mr, positions) and byte_dtype in ("uint8", "int8")
                 and not words_out else None)

    def one(n: Var, ct: Var, pt: Var) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, as_expr(0, "int32"), (r, v)), "vectorized"))

        def products(g: PrimExpr, word: Callable[[PrimExpr], PrimExpr]) -> Stmt:
            return tile_loop("r", mr, lambda r: tile_loop("v", nr, lambda v: Store(
                acc, Intrin(intrinsic, (acc[r, v], word(row_word(pt * mr + r)), ww[ct, g, v])),
                (r, v)), "vectorized"), "unrolled")

        step = steps(words, groups, n, products)

        # requantized along the lanes into a tile of output bytes (contiguous: LLVM
        # vectorizes it), then copied out a channel at a time (its positions are
        # contiguous in the output; an element-wise requantizing scatter costs more than
        # the products of a short K)
        quant = Buffer("quant", (mr, nr), byte_dtype, "local")
        rest = oc_n - (col_tiles - 1) * nr  # channels of the last panel

        def by_panel(body: Callable[[int], Stmt]) -> Stmt:
            # whole panels unguarded (per-channel loads contiguous, not clamped into
            # gathers); the last, partial one its channels only
            return body(nr) if rest == nr else IfThenElse(
                compare("lt", ct, col_tiles - 1), body(nr), body(rest))

        added, res_fill = residual_tile(residual, n, ct, pt, (mr, nr), positions, oc_n)
        requant = by_panel(lambda lanes: tile_loop("r", mr, lambda r: lanes_loop(
            "v", lanes, lambda v: Store(quant, added(requantized(acc[r, v], ct * nr + v), r, v),
                                        (r, v))),
            "unrolled"))

        def byte(r: PrimExpr | int, v: PrimExpr) -> PrimExpr:  # as int32 in [0, 255]
            return unsigned_byte(quant[r, v], byte_dtype)

        def channels(rows: int) -> Stmt:
            if words_out:
                # a row's 4 channels are one word of the output: packed along the row,
                # then stored one each
                group = qw.GROUP
                packed = Buffer("packed", (mr, nr // group), "int32", "local")
                return seq(Allocate(packed), by_panel(lambda lanes: seq(
                    tile_loop("r", rows, lambda r: lanes_loop("j", lanes // group, lambda j: Store(
                        packed, dot.pack_word(lambda b: byte(r, j * group + b)), (r, j))),
                        "unrolled"),
                    tile_loop("r", rows, lambda r: tile_loop("j", lanes // group, lambda j: Store(
                        flat_out, packed[r, j], (n, ct * (nr // group) + j, pt * mr + r))),
                        "unrolled"))))
            if rows == qw.GROUP and out_words is not None:
                # a channel's 4 positions are one word of the output: the words packed
                # along the lanes (vector code), then one store each
                packed = Buffer("packed", (nr,), "int32", "local")
                return seq(Allocate(packed), by_panel(lambda lanes: seq(
                    lanes_loop("v", lanes, lambda v: Store(
                        packed, dot.pack_word(lambda r: byte(r, v)), (v,))),
                    tile_loop("v", lanes, lambda v: Store(
                        out_words, packed[v], (n, ct * nr + v, pt))))))
            return by_panel(lambda lanes: tile_loop("v", lanes, lambda v: tile_loop(
                "r", rows, lambda r: Store(flat_out, quant[r, v], (n, ct * nr + v, pt * mr + r)))))

        last = positions - (row_tiles - 1) * mr
        out = channels(mr) if last == mr else IfThenElse(
            compare("lt", pt, row_tiles - 1), channels(mr), channels(last))
        return seq(Allocate(acc), zero, step, res_fill, Allocate(quant), requant, out)

    tiles = tiles_of(batch, (col_tiles, row_tiles), one, big)
    if out_words is not None:
        tiles = seq(DeclBuffer(out_words, flat_out, 0), tiles)
    return seq(Allocate(table), fill, tiles)


def _row_words(rows: int, word_at: Callable[[PrimExpr], PrimExpr]) -> tuple[Buffer, Stmt]:
    """Where each row of the channels tiles reads its words (`word_at`), and its fill:
    computed once per call, as per tile it was a clamp and a division per row (the
    grid's row width), which LLVM turned into ~170 instructions of byte-vector arithmetic
    in every tile."""
    table = Buffer("row_words", (rows,), "int32", "global")
    return table, tile_loop("p", rows, lambda p: Store(table, Cast("int32", word_at(p)), (p,)))


def residual_tile(residual: Residual | None, n: PrimExpr, ct: PrimExpr, pt: PrimExpr,
                  shape: tuple[int, int], positions: int, oc_n: int
                  ) -> tuple[Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr], Stmt]:
    """A channels tile's fused residual add: `(added(value, r, v), fill)`, `fill` copying
    the tile's residual elements (rows: positions from pt * mr, lanes: channels from ct *
    nr; clamped to the last) into a local tile of bytes, along which `added` then adds
    them to the requantized values (vector code: a byte load widened per vector). Words
    of 4 channels are copied whole (a row's nr / 4 words are its nr bytes, read through
    a byte view of the local words); NCHW bytes one at a time. Without `residual`, the
    values unchanged."""
    if residual is None:
        return (lambda value, r, v: value), seq()
    mr, nr = shape
    regs, view = residual.registers(), residual.view
    values = Buffer("residual_tile", (mr, nr), residual.dtype, "local")
    if residual.words:
        quads = nr // qw.GROUP
        words = Buffer("residual_words", (mr, quads), "int32", "local")
        copy = tile_loop("r", mr, lambda r: tile_loop("j", quads, lambda j: Store(words, view[
            n, min_(ct * quads + j, oc_n // qw.GROUP - 1), min_(pt * mr + r, positions - 1)],
            (r, j))))
        tile: tuple[Stmt, ...] = (Allocate(words), copy, DeclBuffer(values, words, 0))
    else:
        tile = (Allocate(values), tile_loop("r", mr, lambda r: tile_loop("v", nr, lambda v: Store(
            values, view[n, min_(ct * nr + v, oc_n - 1), min_(pt * mr + r, positions - 1)],
            (r, v)))))

    def added(value: PrimExpr, r: PrimExpr, v: PrimExpr) -> PrimExpr:
        return residual.value(regs, residual.shifted(value), Cast("int32", values[r, v]))

    return added, seq(Allocate(regs), residual.load(regs), *tile)


def flat_output(out: Buffer, out_words: bool, positions: int) -> Buffer:
    """The view the tiles store into: `[N][OC][positions]` bytes, or with `out_words`
    `[N][OC / 4][positions]` int32 words of 4 channels (WORDS_LAYOUT)."""
    if out_words:
        return Buffer("out_words4", (int(out.shape[0]), int(out.shape[1]), positions), "int32")
    return Buffer("out_flat", (int(out.shape[0]), int(out.shape[1]), positions), out.dtype)
