"""The kernel of `attention_tiled` (kiln.ops.attention_blocks): attention by blocks of
query rows, the block's scores kept in a small workspace instead of the whole
`[*batch, m, n]` score tensor.

The keys are packed into the micro-kernel's panels once per call (kiln.kernels.gemm
.run_time_pack); then one parallel loop over (batch, block of `rows` query rows) runs,
per block, the three steps the unfused graph runs as three kernels over all rows:

1. `S = Q_block @ K^T * scale` into a `[rows][n]` workspace by register tiles
   (kiln.kernels.gemm.micro_kernel.register_tile);
2. softmax of each row of `S` in place (kiln.kernels.rows.softmax.softmax_row);
3. `out_block = S @ V` by register tiles reading V in place (its rows are the product's
   K steps, `nr` consecutive values each: no packing needed).

With `precision=bf16` (`attention_tiled_bf16`) both products take bfloat16 operands
with float32 sums, as `matmul_tiled_bf16`'s kernel (kiln.kernels.gemm.bf16_tiled):
the keys and values converted once per call into bfloat16 panels of words, each row
tile's query rows and score rows into words on the stack before its panels, one
`dot2_bf16` (`vdpbf16ps`) per 16 lanes and word; the softmax stays float32. Its rows
keep `exp(x - max)` and their `1 / sum`, which the score rows' conversion to words
multiplies in (the product softmax_row would store): one pass less over the scores.

A causal attention (attribute `causal`) does no work above the diagonal: each row tile
computes the score panels its rows see (up to its last row's position, rounded up to
whole panels, and for bfloat16 to whole pairs of words), overwrites the few scores of
those panels past each row's position with `MASKED_SCORE` (as the mask the pass took it
from would give), runs each row's softmax over those columns only, and sums P @ V over
those keys only: the masked probabilities are exactly 0 there, and the columns past
are skipped. For GPT-2's 128 x 128 scores a half of both products and the softmax.
An attention mask computed from the inputs (`bias`, broadcast over the scores) is added
as the softmax reads each score; `zero_nan` zeroes NaN probabilities as P @ V reads them.
A `softcap` caps each scaled score as the first product stores it (`tanh`, which the
expand-math pass makes vector arithmetic): the masks and the bias come after it.

The keys' and values' batch dims of 1 broadcast (grouped-query attention: a group's
one key/value head read by each of its query heads, packed once per group). Float32
calls also take symbolic batch, query rows and keys (an export's dynamic axes): the
blocks are then one register tile of rows, a workspace of `mr x n` scores.

A block's workspace is sized to stay in the L2 cache (`ISA.l2_bytes`) with the keys and
values of its head, so the scores are written and read back in cache: the unfused
kernels move the whole score tensor through memory three times (for the Whisper
encoder's 8 x 1500 x 1500 scores, 72 MB a layer). The last block's rows past `m` are
computed from the last query row and not stored. The sums are those of the unfused
kernels' tiles: each score and output element is one register tile's chain over K, in
order, so the results equal theirs for the same tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, cast

from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    DOT2_BF16,
    Allocate,
    Buffer,
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    max_,
    min_,
    select,
    seq,
)
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.gemm.bf16_tiled import ActivationB, pack_b_bf16_at_run_time
from kiln.kernels.gemm.families import choose_tile
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.lowering import GemmLowering
from kiln.kernels.gemm.micro_kernel import register_tile, unflatten
from kiln.kernels.gemm.run_time_pack import pack_b_at_run_time
from kiln.kernels.rows.loops import RowLoops
from kiln.kernels.rows.softmax import softmax_exp_row, softmax_row
from kiln.kernels.tiles import const, lanes_loop, loop, parallel_tiles, tile_lanes
from kiln.ops import te
from kiln.ops.attention_blocks import (
    ATTENTION,
    ATTENTION_BF16,
    MASKED_SCORE,
    attention_dims,
    bias_index,
    capped,
    key_count,
    result_shape,
    zero_nan,
)
from kiln.ops.broadcast import broadcast_index
from kiln.ops.gemm_bf16 import PAIR_BLOCK, PAIR_STRIDE
from kiln.target.isa import ISA

F32 = "float32"

#: The share of the L2 cache a block's score rows may take; the rest holds the packed
#: keys and the values they are multiplied with.
SCORES_L2_SHARE = 8


def block_rows(m: int, n: int, mr: int, l2_bytes: int) -> int:
    """Query rows per block: whole tiles of `mr` rows whose `n` float32 scores fit a
    `SCORES_L2_SHARE`th of `l2_bytes` (one tile at least), evened out over the blocks
    `m` rows need (so the last block is not mostly rows past `m`)."""
    tiles = -(-m // mr)
    fit = max(1, l2_bytes // SCORES_L2_SHARE // (4 * n * mr))
    blocks = -(-tiles // min(fit, tiles))
    return -(-tiles // blocks) * mr


Tile = tuple[PrimExpr, ...]
#: A row tile's operand A: (row within the tile, k) -> value.
ARows = Callable[[PrimExpr, PrimExpr], PrimExpr]
#: A row tile's store: (row within the tile, column, value) -> statement.
TileStore = Callable[[int, PrimExpr, PrimExpr], Stmt]


@dataclass(frozen=True)
class Product:
    """One of the two products as a row tile runs it: `k` steps of the sum, `columns`
    output columns in panels of `nr`, B's value at (batch index, panel, k, lane) for
    float32 tiles, or B's bfloat16 words ((flat batch index, batch index), panel, word,
    lane) and their count per panel for bfloat16 tiles (`k` and `columns` symbolic
    for float32 ones). `k_used` and `columns_used`: the steps
    and columns a causal tile runs (whole panels, whole pairs of words), all when
    None."""

    k: int | PrimExpr
    columns: int | PrimExpr
    b_at: Callable[..., PrimExpr]
    words: int = 0
    k_used: PrimExpr | None = None
    columns_used: PrimExpr | None = None

    def used(self, *, k: PrimExpr | None = None, columns: PrimExpr | None = None
             ) -> Product:
        """This product as a causal tile runs it."""
        return replace(self, k_used=k, columns_used=columns)

    def panels(self, nr: int) -> PrimExpr:
        """The panels of `nr` columns a tile runs."""
        columns = self.columns if self.columns_used is None else self.columns_used
        return (as_expr(columns, INDEX_DTYPE) + (nr - 1)) // nr


@dataclass(frozen=True)
class Operands:
    """The operands and sizes of one attention kernel."""

    q: Buffer
    k: Buffer
    v: Buffer
    out: Buffer
    transpose_b: bool
    scale: float
    causal: bool = False
    bias: Buffer | None = None
    zero_nan: bool = False
    counts: Buffer | None = None
    softcap: float = 0.0

    @property
    def dims(self) -> tuple[tuple[int, ...], int, int, int, int]:
        """(batch, m, n, d, dv)."""
        batch, m, n, d, dv = attention_dims([self.q.shape, self.k.shape, self.v.shape],
                                            {"transpose_b": self.transpose_b})
        return batch, m, n, d, dv


@dataclass(frozen=True)
class AttentionLowering(GemmLowering):
    """The kernel of `attention_tiled` (float32) or `attention_tiled_bf16` calls (a
    kiln.kernels.lowering.Lowering) for static float32 operands."""

    supports_symbolic: bool = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The blocked attention kernel; None for a fused chain, or symbolic shapes where
        the kernel takes static ones only (bfloat16, causal, the head widths)."""
        bf16 = self.op == ATTENTION_BF16
        if anchor is not None or result is not None or \
                len(args) - bool(attrs.get("key_counts")) not in (3, 4):
            return None
        if not all(isinstance(d, int) for t in args for d in t.shape) and (
                bf16 or attrs.get("causal") or not all(
                    isinstance(d, int) for t in args[:3] for d in t.shape[-1:])):
            return None
        if bf16 and tile_lanes(isa) != 16:
            return None  # dot2_bf16 computes 16 lanes
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        q, k, v = (buffers[t] for t in args[:3])
        counts = buffers[args[-1]] if attrs.get("key_counts") else None
        rest = args[3:-1] if counts is not None else args[3:]
        batch, m, _, _, dv = attention_dims([t.shape for t in args[:3]], attrs)
        ops = Operands(q, k, v, Buffer("out", result_shape(batch, m, dv, attrs), F32),
                       bool(attrs.get("transpose_b")), float(attrs.get("scale", 1.0)),
                       bool(attrs.get("causal")), buffers[rest[0]] if rest else None,
                       bool(attrs.get("zero_nan")), counts,
                       float(attrs.get("softcap", 0.0)))
        return PrimFunc((*(buffers[t] for t in params), ops.out),
                        attention_body(ops, bf16, isa=isa), {ATTR_GEMM_KERNEL: self.op})


def attention_body(ops: Operands, bf16: bool, *, isa: ISA) -> Stmt:
    """The statements computing `out = softmax(q @ k^T * scale) @ v` (module docstring)."""
    _, m, n, _, _ = ops.dims
    tile = choose_tile(m, n, isa)  # Q @ K^T's, the larger product; P @ V takes it too
    if isinstance(m, int) or tile.mr == 1:
        return _blocks(ops, bf16, tile, isa)
    # symbolic rows: a decode step's one query row runs one-row tiles (the products' own
    # for one row), not `mr` copies of itself
    return IfThenElse(compare("eq", as_expr(m, INDEX_DTYPE), const(1)),
                      _blocks(ops, bf16, choose_tile(1, n, isa), isa),
                      _blocks(ops, bf16, tile, isa))


def _out_index(ops: Operands, bidx: Tile, row: PrimExpr, col: PrimExpr) -> Tile:
    """The output element of head `bidx`'s `row` and value `col`: with `merge_heads`
    (an output one rank below the operands) the heads sit side by side in each row."""
    if len(ops.out.shape) == len(ops.q.shape):
        return (*bidx, row, col)
    return (*bidx[:-1], row, bidx[-1] * ops.v.shape[-1] + col)


def _blocks(ops: Operands, bf16: bool, tile: GemmTiling, isa: ISA) -> Stmt:
    """`attention_body` by register tiles of `tile`."""
    batch, m, n, d, dv = ops.dims
    heads = dim_product(batch)
    mr, nr = tile.mr, tile.nr
    static = isinstance(m, int) and isinstance(n, int)
    # symbolic sizes: blocks of one row tile, whose scores fit L2 up to long contexts
    rows = block_rows(m, n, mr, isa.l2_bytes) if static else mr
    blocks = (as_expr(m, INDEX_DTYPE) + (rows - 1)) // rows if not static else -(-m // rows)
    k_batch, v_batch = tuple(ops.k.shape[:-2]), tuple(ops.v.shape[:-2])
    bounding, packed = _most_keys(ops.counts, n)  # pack only the keys some row attends
    if bf16:
        pack_k, keys, words_d, _ = pack_b_bf16_at_run_time(
            ActivationB(ops.k, k_batch, d, n, ops.transpose_b), nr, isa=isa)
        pack_v, values, words_n, _ = pack_b_bf16_at_run_time(
            ActivationB(ops.v, v_batch, n, dv, False), nr, isa=isa)
        packing = [*pack_k, *pack_v]
        qk = Product(d, n, _words_at(keys, k_batch, batch), words_d)
        pv = Product(n, dv, _words_at(values, v_batch, batch), words_n)
        row_tile: Callable[..., Stmt] = _bf16_row_tile
    else:
        packing, key_at = pack_b_at_run_time(ops.k, k_batch, d, cast(int, packed), nr,
                                             ops.transpose_b, isa=isa)
        # a partial last panel reads V's last column again past dv (not stored); V's
        # batch dims of 1 (a group's heads) broadcast
        qk = Product(d, n, key_at)
        pv = Product(n, dv, lambda bidx, p, kk, lane: ops.v[(
            *broadcast_index(bidx, v_batch), kk,
            p * nr + lane if dv % nr == 0 else min_(p * nr + lane, dv - 1))])
        row_tile = _f32_row_tile
    factor = as_expr(ops.scale, F32)
    lanes = min(tile_lanes(isa), n) if isinstance(n, int) else tile_lanes(isa)
    last_row = as_expr(m, INDEX_DTYPE) - 1
    # a causal tile's columns come in whole panels (and, for bf16, whole pairs of words)
    grain = math.lcm(nr, PAIR_BLOCK) if bf16 else nr

    def block(h: PrimExpr, blk: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        bidx = unflatten(h, batch, "j", lets)
        first = blk * rows
        scores = Buffer("scores", (rows, n), F32)

        keys = _KeyBounds.of(ops, bidx, first, mr, grain, lets)
        seen = keys.columns

        def scores_tile(t: Var) -> Stmt:
            def a_at(r: PrimExpr, kk: PrimExpr) -> PrimExpr:  # rows past m repeat the last one
                return ops.q[(*bidx, min_(first + t * mr + r, last_row), kk)]

            def store(r: int, col: PrimExpr, x: PrimExpr) -> Stmt:
                return Store(scores, capped(x * factor, ops.softcap), (t * mr + r, col))

            return row_tile(qk.used(columns=seen(t)), (h, bidx), mr, nr, a_at, store, isa)

        # bf16: the rows keep exp(x - max) and their 1 / sum, which the conversion of
        # P @ V's rows to words multiplies in (the same float32 product softmax_row
        # stores), saving a pass over the block's scores
        inv = Buffer("row_inv", (rows,), F32)

        def softmax(r: Var) -> Stmt:
            def at(j: PrimExpr) -> tuple[Buffer, tuple[PrimExpr, ...]]:
                return scores, (r, j)

            def read(j: PrimExpr) -> PrimExpr:  # the bias joins as the softmax reads
                if ops.bias is None:
                    return scores[r, j]
                row = min_(first + r, last_row)  # rows past m repeat the last one
                return scores[r, j] + ops.bias[bias_index((*bidx, row, j), ops.bias.shape)]

            columns = seen(r // mr)
            loops = RowLoops(n if columns is None else columns, lanes)
            if bf16:
                row = softmax_exp_row(loops, read, at, lambda x: Store(inv, x, (r,)), isa=isa)
            else:
                row = softmax_row(loops, read, at,
                                  lambda j, x: Store(scores, x, (r, j)), False, isa=isa)
            if columns is None:
                return row
            return seq(_masked_past(scores, r, keys.unseen(r), columns), row)

        def out_tile(t: Var) -> Stmt:
            def store(r: int, col: PrimExpr, x: PrimExpr) -> Stmt:
                row = first + t * mr + r
                return IfThenElse(compare("lt", row, as_expr(m, INDEX_DTYPE)),
                                  Store(ops.out, x, _out_index(ops, bidx, row, col)))

            def probs(r: PrimExpr, kk: PrimExpr) -> PrimExpr:
                p: PrimExpr = scores[t * mr + r, kk]
                p = p * inv[t * mr + r] if bf16 else p
                return zero_nan(p) if ops.zero_nan else p

            return row_tile(pv.used(k=keys.value_rows(t, bf16)), (h, bidx), mr, nr, probs,
                            store, isa)

        return seq(*lets, Allocate(scores), *([Allocate(inv)] if bf16 else []),
                   loop("t", rows // mr, scores_tile), loop("r", rows, softmax),
                   loop("t", rows // mr, out_tile))

    return seq(*bounding, *packing,
               parallel_tiles(cast(Sequence[int], (heads, blocks)), block))


@dataclass(frozen=True)
class _KeyBounds:
    """The keys the row tiles of one block (its first query row `first`) see: through
    each row's position (`causal`) and the batch row's `attended` keys (`key_counts`);
    all `n` when neither bounds them."""

    ops: Operands
    first: PrimExpr
    mr: int
    grain: int
    attended: Var | None

    @staticmethod
    def of(ops: Operands, bidx: Tile, first: PrimExpr, mr: int, grain: int,
           lets: list[Stmt]) -> _KeyBounds:
        """The bounds of the block at batch index `bidx`, their LetStmts added to `lets`."""
        attended = None
        if ops.counts is not None:
            attended = Var("attended", INDEX_DTYPE)
            lets.append(LetStmt(attended, key_count(ops.counts[(bidx[0],)], ops.dims[2])))
        return _KeyBounds(ops, first, mr, grain, attended)

    def _end(self, causal_end: Callable[[], PrimExpr]) -> PrimExpr | None:
        ends = ([causal_end()] if self.ops.causal else []) + (
            [] if self.attended is None else [self.attended])
        return None if not ends else ends[0] if len(ends) == 1 else min_(*ends)

    def columns(self, t: PrimExpr) -> PrimExpr | None:
        """The columns row tile `t` computes (whole grains), None for all."""
        _, m, n, _, _ = self.ops.dims
        # one past the tile's last row's last key
        end = self._end(lambda: self.first + t * self.mr + (self.mr + n - m))
        if end is None:
            return None
        return min_(as_expr(n, INDEX_DTYPE), (end + (self.grain - 1)) // self.grain * self.grain)

    def unseen(self, r: PrimExpr) -> PrimExpr:
        """Row `r`'s first key it does not see (when `columns` bounds its tile)."""
        _, m, n, _, _ = self.ops.dims
        end = self._end(lambda: self.first + r + (n - m + 1))
        assert end is not None
        return end

    def value_rows(self, t: PrimExpr, bf16: bool) -> PrimExpr | None:
        """The rows of V row tile `t` sums over: its columns, and float32 tiles no row
        past the attended keys (a cache buffer's rows past the cached ones may hold
        anything, and 0 * NaN is NaN)."""
        columns = self.columns(t)
        if self.attended is None or bf16:
            return columns
        return min_(cast(PrimExpr, columns), self.attended)


def _most_keys(counts: Buffer | None, n: int | PrimExpr
               ) -> tuple[list[Stmt], int | PrimExpr]:
    """Statements binding the most keys any batch row attends (`key_count` of each
    count), and that bound: the keys to pack (no statements and all `n` without
    counts)."""
    if counts is None:
        return [], n
    most = Buffer("most_keys", (1,), INDEX_DTYPE, "local")
    bound = Var("packed_keys", INDEX_DTYPE)
    rows = as_expr(counts.shape[0], INDEX_DTYPE)
    gather = loop("b", rows, lambda b: Store(
        most, max_(most[const(0)], key_count(counts[(b,)], n)), (const(0),)))
    return [Allocate(most), Store(most, const(1), (const(0),)), gather,
            LetStmt(bound, most[const(0)])], bound


def _words_at(read: Callable[..., PrimExpr], dims: tuple[Any, ...], batch: tuple[Any, ...]
              ) -> Callable[..., PrimExpr]:
    """The reader of bfloat16 panels packed per batch entry of `dims` (the keys' or the
    values'), indexed by a row tile's (flat batch index, batch index) over `batch`: its
    dims of 1 broadcast (a group's heads read their group's panels)."""
    if dims == batch:
        return lambda at, p, w, v: read(at[0], p, w, v)

    def at_entry(at: tuple[PrimExpr, Tile], p: PrimExpr, w: PrimExpr, v: PrimExpr
                 ) -> PrimExpr:
        flat: PrimExpr = const(0)
        for i, d in zip(broadcast_index(at[1], dims), dims):
            if not isinstance(d, int) or d > 1:
                flat = flat * d + as_expr(i, INDEX_DTYPE)
        return read(flat, p, w, v)

    return at_entry


def _masked_past(scores: Buffer, r: PrimExpr, start: PrimExpr, columns: PrimExpr) -> Stmt:
    """Row `r`'s scores from `start` (its first key past its position) to its tile's
    `columns`, set to `MASKED_SCORE`: a loop of their own, not a select in every score's
    store (which LLVM takes twice as long to compile)."""
    begin = min_(start, columns)
    return loop("j", columns - begin,
                lambda j: Store(scores, as_expr(MASKED_SCORE, F32), (r, j)), start=begin)


def _f32_row_tile(product: Product, at: tuple[PrimExpr, Tile], mr: int, nr: int,
                  a_at: ARows, store: TileStore, isa: ISA) -> Stmt:
    """A row tile of `mr` rows by every panel of `product`: float32 register tiles."""
    bidx = at[1]

    def panel(p: Var) -> Stmt:
        k = product.k if product.k_used is None else product.k_used
        acc, stmts = register_tile(
            mr, nr, k, [partial(a_at, const(r)) for r in range(mr)],
            lambda kk, lane: product.b_at(bidx, p, kk, lane), F32, isa.fma)
        return seq(*stmts, *(_stores(_row_store(store, r, p, nr, acc), nr, product.columns, p)
                             for r in range(mr)))

    return loop("p", product.panels(nr), panel)


def _bf16_row_tile(product: Product, at: tuple[PrimExpr, Tile], mr: int, nr: int,
                   a_at: ARows, store: TileStore, isa: ISA) -> Stmt:
    """A row tile of `mr` rows by every panel of `product`: the rows converted to
    bfloat16 words once (`k` zero-padded to whole blocks, paired as the panels are,
    kiln.ops.gemm_bf16), then per panel a tile of `dot2_bf16` sums. A causal tile's
    `k_used` steps are whole blocks of pairs but for the last block of all."""
    assert isinstance(product.k, int)  # the bfloat16 kernel takes static shapes only
    k = product.k
    words: PrimExpr | int = product.words
    abuf = Buffer("a_bf16", (mr, product.words), "int32", "local")
    zero = as_expr(0.0, F32)

    def a_padded(r: PrimExpr, kk: PrimExpr) -> PrimExpr:
        return select(compare("lt", kk, const(k)), a_at(r, min_(kk, k - 1)), zero)

    def pairs(r: PrimExpr, blk: PrimExpr, a: ARows) -> Stmt:
        def pair(j: PrimExpr) -> Stmt:
            k0 = blk * PAIR_BLOCK + j
            return Store(abuf, bf16_word(a(r, k0), a(r, k0 + PAIR_STRIDE)),
                         (r, blk * PAIR_STRIDE + j))

        return lanes_loop("j", PAIR_STRIDE, pair)

    # whole blocks read A as it is (contiguous vector loads); only a last block that
    # `k` ends inside is padded, whose clamped reads would be gathers. One loop over
    # the rows: the conversion is in the IR once, not once per row.
    whole, padded = divmod(k, PAIR_BLOCK)
    used: PrimExpr | int = whole
    k_used = product.k_used

    def tail(r: PrimExpr) -> list[Stmt]:
        if not padded:
            return []
        last = pairs(r, const(whole), a_padded)
        # a causal tile's steps end in the padded block only when they are all of K
        return [last if k_used is None else
                IfThenElse(compare("eq", k_used, const(k)), last)]

    if k_used is not None:
        used = min_(k_used // PAIR_BLOCK, whole)
        words = (k_used + (PAIR_BLOCK - 1)) // PAIR_BLOCK * PAIR_STRIDE
    convert = loop("cr", mr, lambda r: seq(
        loop("q", used, lambda blk: pairs(r, blk, a_at)), *tail(r)))

    def panel(p: Var) -> Stmt:
        acc = Buffer("acc", (mr, nr), F32, "local")
        init = lanes_loop("v", nr, lambda lane: seq(*(Store(acc, zero, (const(r), lane))
                                                       for r in range(mr))))
        w = Var("w", INDEX_DTYPE)
        xs = [Var(f"a{r}", "int32") for r in range(mr)]

        def lane_sums(lane: PrimExpr) -> Stmt:
            bv = Var("b", "int32")
            return seq(LetStmt(bv, product.b_at(at, p, w, lane)), *(
                Store(acc, Intrin(DOT2_BF16, (acc[const(r), lane], xs[r], bv)),
                      (const(r), lane)) for r in range(mr)))

        step = seq(*(LetStmt(x, abuf[const(r), w]) for r, x in enumerate(xs)),
                   lanes_loop("v", nr, lane_sums))
        sums = For(w, const(0), as_expr(words, INDEX_DTYPE), "serial", step)
        return seq(Allocate(acc), init, sums, *(_stores(
            _row_store(store, r, p, nr, acc), nr, product.columns, p) for r in range(mr)))

    return seq(Allocate(abuf), convert, loop("p", product.panels(nr), panel))


def _row_store(store: TileStore, r: int, panel: Var, nr: int, acc: Buffer
               ) -> Callable[[PrimExpr], Stmt]:
    """The store of tile row `r`'s lane (in `panel`) from the accumulators `acc`."""
    return lambda lane: store(r, panel * nr + lane, acc[const(r), lane])


def _stores(store: Callable[[PrimExpr], Stmt], nr: int, columns: int | PrimExpr,
            panel: Var) -> Stmt:
    """`store(lane)` for the `nr` lanes of a tile row in `panel`, only those under
    `columns` in the last panel when `nr` does not divide `columns`."""
    whole = lanes_loop("v", nr, store)
    if isinstance(columns, int) and columns % nr == 0:
        return whole
    width = as_expr(columns, INDEX_DTYPE) - panel * nr
    lane = Var("v", INDEX_DTYPE)
    part = For(lane, const(0), min_(nr, width), "serial", store(lane))
    return IfThenElse(compare("ge", width, const(nr)), whole, part)


ATTENTION_TILED = AttentionLowering(ATTENTION)
ATTENTION_TILED_BF16 = AttentionLowering(ATTENTION_BF16)
