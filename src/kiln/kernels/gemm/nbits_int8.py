"""The GEMV of 4-bit weights with A quantized to int8 per block (MatMulNBits'
accuracy_level 4, onnxruntime's `CompInt8`): `matmul_nbits_packed` with `words`.

A decode step's GEMV reads every weight byte once; the float path (kiln.kernels.gemm.nbits)
spends about 14 vector instructions a byte row of codes on unpacking and converting
them, which keeps one thread below the memory bandwidth. Here the codes stay integers:

- **A, once a call**: each block of A is quantized as onnxruntime's MLAS does
  (`QuantizeARow_CompInt8`): `scale = max|a| / 127`, `q = round_half_even(a * (127 /
  max|a|))` (0 where the block is all zero; the multiplier is `127 / max|a|` rounded
  once, as MLAS computes it, not `1 / scale`, which is an ulp off in a quarter of the
  blocks and then rounds an A value near a half the other way), packed 4 int8 a word,
  word `g` of a block holding `k = g + i * block / 4` in byte `i`, so the packing reads
  contiguous vectors of A.
  Each block's sum of `q` is kept for the zero points. This runs on one thread before
  every GEMV's parallel tiles, so each step is a vector operation: the block's peak and
  its codes' sum are folded by halves, and its codes are computed as one contiguous run
  before the words gather them.
- **B**: `pack_nbits_words`' int32 words of 8 codes a column (kiln.ops.quant_nbits); a
  word's low nibbles (one mask) are the 4 codes that pair with A's word `j`, its high
  nibbles (a shift and the mask) those of word `j + block / 8`.
- **The step**: per word and vector of columns, a load, `and`, `shift`, `and` and two
  `dot4_u8s8` (codes unsigned, A signed: one `vpdpbusd` each with VNNI) into int32 block
  sums, the low nibbles' and the high nibbles' in separate sums added at the block's end:
  two dependent chains of `block / 8` dots each, not one of `block / 4`, so weights in
  cache are not held to the dot's latency (0.77-0.89x the time of one chain for layers of
  2-7 MiB on Zen 5, the same from memory; docs/performance.md). Without VNNI (AVX2,
  AVX-512BW) the step is `dot4_u8s8_sat16` (`vpmaddubsw`, `vpmaddwd` by ones, an add):
  its int16 pair sums cannot saturate here, since `2 * 15 * 127 < 32767`, so both forms
  give the exact integer sums.
- **Prefetches**: each step also prefetches its word row `PREFETCH_ROWS` rows (whole
  blocks) ahead, and each block the scales there: weights read from memory (an LM
  head) arrive before the sums reach them.
- **Each block's end**: `acc += scale_b * (scale_a * dot - zero_point * scale_a * sum(q))`
  in float32, the zero point folded as in the float GEMV.

Rows of A past one (prefill) take the int8 GEMM on the same words
(kiln.kernels.gemm.nbits_int8_gemm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    DOT4_U8S8,
    DOT4_U8S8_SAT16,
    Allocate,
    Buffer,
    Cast,
    Const,
    Evaluate,
    For,
    Intrin,
    LetStmt,
    PrimExpr,
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
from kiln.kernels.tiles import const, lanes_loop, madd, parallel_tiles, parallel_when
from kiln.target.isa import ISA

if TYPE_CHECKING:
    from kiln.kernels.gemm.nbits import NbitsNest

#: (tile, panels a tile, float accumulators `[panels, nr]`) -> the tile's stores.
TileStore = Callable[[PrimExpr, int, Buffer], Stmt]


def tile_panels_of(t: PrimExpr, rows: int, count: int) -> tuple[list[Stmt], list[Var]]:
    """The panels `t * rows ...` of GEMV tile `t` as variables (the lets binding them and
    the variables), each clamped to the last of `count` panels: a last tile's surplus
    panels reread that panel."""
    lets: list[Stmt] = []
    panels: list[Var] = []
    for r in range(rows):
        pv = Var(f"p{r}", INDEX_DTYPE)
        lets.append(LetStmt(pv, min_(t * rows + r, count - 1)))
        panels.append(pv)
    return lets, panels


def tile_panels(isa: ISA) -> int:
    """Panels of one register tile (2 vectors a panel): 4 with 32 vector registers (16
    int32 block sums, two a vector, and 8 float accumulators), else 2."""
    return 4 if isa.vector_registers >= 32 else 2

#: The largest |q| of A's int8 codes (symmetric, as MLAS: -128 is never produced).
Q_MAX = 127.0
#: The mask of a word's four low nibbles (codes unsigned, 0 to 15).
LOW_NIBBLES = 0x0F0F0F0F
#: Word rows (of `nr` columns, 128 bytes on AVX-512) ahead of the sums that each step
#: prefetches, rounded up to whole blocks, with the scales of that block: a tile reads
#: its panels as 2 x `tile_panels` streams, which the hardware prefetchers leave behind
#: once the weights come from memory (an LM head: 10-25% less time with 3 blocks of 32
#: ahead, none lost on weights in cache; docs/performance.md).
PREFETCH_ROWS = 12
_LINE_WORDS = 16  # int32 words of a 64-byte cache line
#: Families whose `dot4_u8s8` is a widening emulation: `dot4_u8s8_sat16` is cheaper there
#: and exact for 4-bit codes.
_PAIR_FAMILIES = ("avx512bw", "avx2")


def dot_for(isa: ISA) -> str:
    """The dot-product intrinsic of the step on `isa`."""
    return DOT4_U8S8_SAT16 if isa.int8_dot in _PAIR_FAMILIES else DOT4_U8S8


def _f32(v: float) -> PrimExpr:
    return as_expr(v, "float32")


def quantize_a(nest: NbitsNest, aw: Buffer, ascale: Buffer, aqsum: Buffer,
               lead: tuple[PrimExpr, ...] | None = None, first: PrimExpr | None = None
               ) -> Stmt:
    """A's row at `lead` (the first row by default; zero past K) as int8 words from
    `aw[first * block / 4]` (`first` the row's first block, 0 by default), each block's
    scale `ascale[first + blk]` and its codes' sum times that scale `aqsum[first + blk]`."""
    block, quarter = nest.block, nest.block // 4
    lead = lead if lead is not None else (const(0),) * (nest.a.ndim - 1)
    first = first if first is not None else const(0)
    blk, g = (Var(v, INDEX_DTYPE) for v in ("blk", "g"))
    amax, scale, inv = (Var(v, "float32") for v in ("amax", "scale", "inv"))
    lane_peak = Buffer("a_lane_peak", (quarter,), "float32", "local")
    qpart = Buffer("a_qpart", (quarter,), "int32", "local")
    qbuf = Buffer("a_codes", (block,), "int32", "local")

    def a_at(kk: PrimExpr) -> PrimExpr:
        if nest.k % block == 0:
            return nest.a[(*lead, kk)]
        inside = compare("lt", kk, const(nest.k))
        clamped = select(inside, kk, const(nest.k - 1))
        return select(inside, nest.a[(*lead, clamped)], _f32(0.0))

    def q(kk: PrimExpr) -> PrimExpr:
        return Cast("int32", Intrin("round", (a_at(kk) * inv,)))

    base = blk * block
    # each lane's peak over its 4 values (one vector op each), then the lanes' peak: a
    # serial scan of the block would chain `block` dependent max operations
    mags = [Intrin("abs", (a_at(base + g + b * quarter),)) for b in range(4)]
    lanes = For(g, const(0), const(quarter), "vectorized", Store(
        lane_peak, max_(max_(mags[0], mags[1]), max_(mags[2], mags[3])), (g,)))
    find_peak = seq(lanes, _fold_lanes(lane_peak, quarter, max_))
    # the block's codes first, one contiguous vector operation each, then the words
    # from contiguous runs of them: computed inside the word, LLVM packed each word's
    # 4 codes into one vector and gathered their values of A (docs/performance.md)
    e = Var("e", INDEX_DTYPE)
    codes = For(e, const(0), const(block), "vectorized", Store(qbuf, q(base + e), (e,)))
    qs = [qbuf[g + b * quarter] for b in range(4)]
    byte = Const(255, "int32")
    word: PrimExpr = qs[3] << Const(24, "int32")
    for b in range(3):
        word = word | ((qs[b] & byte) << Const(8 * b, "int32"))
    pack = seq(codes, For(g, const(0), const(quarter), "vectorized", seq(
        Store(aw, word, ((first + blk) * quarter + g,)),
        Store(qpart, qs[0] + qs[1] + qs[2] + qs[3], (g,)))))
    total = _fold_lanes(qpart, quarter, lambda x, y: x + y)
    body = seq(
        find_peak, LetStmt(amax, lane_peak[const(0)]), LetStmt(scale, amax / _f32(Q_MAX)),
        LetStmt(inv, select(compare("ne", amax, _f32(0.0)), _f32(Q_MAX) / amax, _f32(0.0))),
        pack, total, Store(ascale, scale, (first + blk,)),
        Store(aqsum, Cast("float32", qpart[const(0)]) * scale, (first + blk,)))
    return seq(Allocate(lane_peak), Allocate(qpart), Allocate(qbuf),
               For(blk, const(0), const(nest.blocks), "serial", body))


def _fold_lanes(buf: Buffer, width: int,
                combine: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> Stmt:
    """`buf[0] = combine(buf[0], ..., buf[width - 1])` by halves (each half a vector
    operation; `width` a power of two, as a block's quarter is): a serial scan chains
    `width` dependent operations on the quantization's path before every GEMV."""
    g = Var("h", INDEX_DTYPE)
    steps: list[Stmt] = []
    half = width // 2
    while half >= 1:
        steps.append(For(g, const(0), const(half), "vectorized" if half > 1 else "serial",
                         Store(buf, combine(buf[g], buf[g + half]), (g,))))
        half //= 2
    return seq(*steps)


def _block(nest: NbitsNest, panels: list[Var], blk: PrimExpr, aw: Buffer,
           ascale: Buffer, aqsum: Buffer, acc: Buffer) -> Stmt:
    """One block of K into the float accumulators `acc[r, v]` of `panels`."""
    nr, rows = nest.nr, len(panels)
    quarter, eighth = nest.block // 4, nest.block // 8
    dot = dot_for(nest.isa)
    # the low nibbles' sums and the high nibbles': two independent chains of dots
    part = Buffer("part", (rows, nr), "int32", "local")
    part_hi = Buffer("part_hi", (rows, nr), "int32", "local")
    init = lanes_loop("v", nr, lambda v: seq(*(
        Store(buf, Const(0, "int32"), (const(r), v))
        for r in range(rows) for buf in (part, part_hi))))
    j = Var("j", INDEX_DTYPE)
    lo, hi = Var("a_lo", "int32"), Var("a_hi", "int32")
    mask = Const(LOW_NIBBLES, "int32")

    def lane(v: PrimExpr) -> Stmt:
        out: list[Stmt] = []
        for r in range(rows):
            w = nest.bp[panels[r], blk, j, v]
            at = (const(r), v)
            out.append(Store(part, Intrin(dot, (part[at], w & mask, lo)), at))
            out.append(Store(part_hi, Intrin(
                dot, (part_hi[at], (w >> Const(4, "int32")) & mask, hi)), at))
        return seq(*out)

    ahead = min_(blk + -(-PREFETCH_ROWS // eighth), nest.blocks - 1)
    fetch = [Evaluate(Intrin("prefetch", (nest.bp[panels[r], ahead, j, const(c)],)))
             for r in range(rows) for c in range(0, nr, _LINE_WORDS)]
    step = seq(LetStmt(lo, aw[blk * quarter + j]), LetStmt(hi, aw[blk * quarter + j + eighth]),
               *fetch, lanes_loop("v", nr, lane))
    sa, sq = Var("a_scale", "float32"), Var("a_qsum", "float32")

    def scale(v: PrimExpr) -> Stmt:
        out: list[Stmt] = []
        for r in range(rows):
            dots = part[const(r), v] + part_hi[const(r), v]
            t = Cast("float32", dots) * sa - nest.zero_point(panels[r], blk, v) * sq
            out.append(Store(acc, madd(acc[const(r), v], nest.scales[panels[r], blk, v], t,
                                       nest.isa.fma), (const(r), v)))
        return seq(*out)

    scales_ahead = [Evaluate(Intrin("prefetch", (nest.scales[panels[r], ahead, const(c)],)))
                    for r in range(rows) for c in range(0, nr, _LINE_WORDS)]
    return seq(Allocate(part), Allocate(part_hi), init, *scales_ahead,
               For(j, const(0), const(eighth), "serial", step),
               LetStmt(sa, ascale[blk]), LetStmt(sq, aqsum[blk]), lanes_loop("v", nr, scale))


def gemv_nbits_int8(nest: NbitsNest, tile_store: TileStore) -> Stmt:
    """M = 1 at accuracy level 4: A quantized once, then parallel tiles of
    `tile_panels` panels, stored through `tile_store` (the float GEMV's)."""
    quarter = nest.block // 4
    aw = Buffer("a_words", (nest.blocks * quarter,), "int32")
    ascale = Buffer("a_scales", (nest.blocks,), "float32")
    aqsum = Buffer("a_qsums", (nest.blocks,), "float32")
    rows = min(tile_panels(nest.isa), nest.panels)
    tiles = -(-nest.panels // rows)

    def tile(t: PrimExpr) -> Stmt:
        lets, panels = tile_panels_of(t, rows, nest.panels)
        acc = Buffer("acc", (rows, nest.nr), "float32", "local")
        init = lanes_loop("v", nest.nr, lambda v: seq(*(
            Store(acc, _f32(0.0), (const(r), v)) for r in range(rows))))
        blk = Var("blk", INDEX_DTYPE)
        blocks = For(blk, const(0), const(nest.blocks), "serial",
                     _block(nest, panels, blk, aw, ascale, aqsum, acc))
        return seq(*lets, Allocate(acc), init, blocks, tile_store(t, rows, acc))

    loop = parallel_when(lambda: parallel_tiles((tiles,), tile),
                         nest.k * nest.panels * nest.nr // 4, isa=nest.isa)
    return seq(Allocate(aw), Allocate(ascale), Allocate(aqsum),
               quantize_a(nest, aw, ascale, aqsum), loop)
