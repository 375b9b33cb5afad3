"""The GEMM of 4-bit weights with A quantized to int8 per block (MatMulNBits'
accuracy_level 4 over rows M > 1: a prompt's prefill), beside the GEMV of
kiln.kernels.gemm.nbits_int8 and on the same `pack_nbits_words` words.

- **A, once a call**: every row is quantized per block as the GEMV's row is
  (`quantize_a`: onnxruntime MLAS' `QuantizeARow_CompInt8`), rows in parallel, into a
  heap buffer of `M x blocks` int8 words, scales and scaled code sums, before the
  parallel tiles.
- **A parallel tile** is one panel by a chunk of `GEMM_CHUNK_TILES` row tiles of `mr`
  rows (as the float GEMM's, kiln.kernels.gemm.nbits). For each block of K the panel's
  words are unpacked once into a tile of unsigned codes on the stack, word `g` of it
  pairing with A's word `g` of the block (low nibbles first, then high), so the mask
  and shift are paid once a chunk, not once a row.
- **A row tile** then takes, per word of the block, `mr` broadcasts of A's words by the
  two vectors of codes into `2 mr` int32 sums (`dot4_u8s8`: one `vpdpbusd` with VNNI;
  `dot4_u8s8_sat16` without, exact for 4-bit codes as in the GEMV), and at the block's
  end adds `scale_b * (scale_a * dot - zero_point * scale_a * sum(q))` into the chunk's
  float partial sums: the zero point folded through A's block sums.

The chunk's partial sums are stored through the epilogue after the last block (the
float GEMM's stores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    Const,
    For,
    Intrin,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    min_,
    seq,
)
from kiln.kernels.gemm.micro_kernel import unflatten
from kiln.kernels.gemm.nbits_int8 import LOW_NIBBLES, dot_for, quantize_a
from kiln.kernels.tiles import const, lanes_loop, madd, parallel_tiles, parallel_when

if TYPE_CHECKING:
    from kiln.kernels.gemm.nbits import NbitsNest

#: (panel, first row of the chunk, rows of the chunk before M, partial sums
#: `[mc, nr]`) -> the chunk's stores.
ChunkStore = Callable[[PrimExpr, PrimExpr, PrimExpr, Buffer], Stmt]


def _quantize_rows(nest: NbitsNest, m: Any, aw: Buffer, ascale: Buffer,
                   aqsum: Buffer) -> Stmt:
    """Every row of A quantized per block: row `r`'s words from `aw[r * blocks * block / 4]`,
    its scales and scaled sums from `ascale[r * blocks]`, `aqsum[r * blocks]`."""
    def one(row: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        lead = unflatten(row, nest.rows, "q", lets)
        return seq(*lets, quantize_a(nest, aw, ascale, aqsum, lead, row * nest.blocks))

    # rows in parallel: about 1 ns an element on one thread, a tenth of a prompt's
    # 4864-deep product if left serial
    if isinstance(m, int):
        return parallel_when(lambda: parallel_tiles((m,), one), m * nest.k, "element",
                             isa=nest.isa)
    return parallel_tiles((cast(int, m),), one)


def _unpack(nest: NbitsNest, p: PrimExpr, blk: PrimExpr, codes: Buffer) -> Stmt:
    """Block `blk` of panel `p` as unsigned codes: `codes[j]` the low nibbles of word `j`,
    `codes[j + block / 8]` its high ones (each pairs with A's word of that index)."""
    eighth = nest.block // 8
    j = Var("j", INDEX_DTYPE)
    mask = Const(LOW_NIBBLES, "int32")

    def lane(v: PrimExpr) -> Stmt:
        w = nest.bp[p, blk, j, v]
        return seq(Store(codes, w & mask, (j, v)),
                   Store(codes, (w >> Const(4, "int32")) & mask, (j + eighth, v)))

    return For(j, const(0), const(eighth), "serial", lanes_loop("v", nest.nr, lane))


def _row_tile(nest: NbitsNest, p: PrimExpr, blk: PrimExpr, rows: list[Var], rt: PrimExpr,
              a: tuple[Buffer, Buffer, Buffer], codes: Buffer, psum: Buffer) -> Stmt:
    """Row tile `rt` (A rows `rows`) over block `blk` into the chunk's partial sums."""
    aw, ascale, aqsum = a
    nr, mr, quarter = nest.nr, len(rows), nest.block // 4
    part = Buffer("part", (mr, nr), "int32", "local")
    init = lanes_loop("v", nr, lambda v: seq(*(
        Store(part, Const(0, "int32"), (const(r), v)) for r in range(mr))))
    g = Var("g", INDEX_DTYPE)
    avs = [Var(f"a{r}", "int32") for r in range(mr)]
    dot = dot_for(nest.isa)
    step = seq(*(LetStmt(avs[r], aw[(rows[r] * nest.blocks + blk) * quarter + g])
                 for r in range(mr)),
               lanes_loop("v", nr, lambda v: seq(*(Store(part, Intrin(dot, (
                   part[const(r), v], codes[g, v], avs[r])), (const(r), v))
                   for r in range(mr)))))
    sas = [Var(f"a_scale{r}", "float32") for r in range(mr)]
    sqs = [Var(f"a_qsum{r}", "float32") for r in range(mr)]
    lets: list[Stmt] = []
    for r in range(mr):
        lets += [LetStmt(sas[r], ascale[rows[r] * nest.blocks + blk]),
                 LetStmt(sqs[r], aqsum[rows[r] * nest.blocks + blk])]

    def scale(v: PrimExpr) -> Stmt:
        sb, zp = nest.scales[p, blk, v], nest.zero_point(p, blk, v)
        return seq(*(Store(psum, madd(psum[rt * mr + r, v], sb, Cast(
            "float32", part[const(r), v]) * sas[r] - zp * sqs[r], nest.isa.fma),
            (rt * mr + r, v)) for r in range(mr)))

    return seq(Allocate(part), init, For(g, const(0), const(quarter), "serial", step),
               *lets, lanes_loop("v", nr, scale))


def gemm_nbits_int8(nest: NbitsNest, mr: int, chunk_tiles: int,
                    chunk_store: ChunkStore) -> Stmt:
    """M > 1 at accuracy level 4: A quantized once, then parallel tiles of (panel, chunk
    of `chunk_tiles` row tiles of `mr` rows), stored through `chunk_store`."""
    m = dim_product(nest.rows)
    mc = mr * chunk_tiles
    chunks = cast(int, (m + mc - 1) // mc)  # symbolic where M is
    quarter = nest.block // 4
    aw = Buffer("a_rows_words", (m * nest.blocks * quarter,), "int32")
    ascale = Buffer("a_rows_scales", (m * nest.blocks,), "float32")
    aqsum = Buffer("a_rows_qsums", (m * nest.blocks,), "float32")

    def tile(p: PrimExpr, c: PrimExpr) -> Stmt:
        psum = Buffer("psum", (mc, nest.nr), "float32", "local")
        codes = Buffer("codes", (quarter, nest.nr), "int32", "local")
        row0, here = Var("row0", INDEX_DTYPE), Var("rows_here", INDEX_DTYPE)
        static = isinstance(m, int) and m % mc == 0
        zero = as_expr(0.0, "float32")
        i, blk, rt = (Var(v, INDEX_DTYPE) for v in ("i", "blk", "rt"))
        init = For(i, const(0), const(mc), "serial",
                   lanes_loop("v", nest.nr, lambda v: Store(psum, zero, (i, v))))
        rows = [Var(f"row{r}", INDEX_DTYPE) for r in range(mr)]
        # rows past M reread the last row (their sums are never stored)
        row_lets = [LetStmt(rows[r], min_(row0 + rt * mr + r, m - 1)) for r in range(mr)]
        tiles = For(rt, const(0), (here + (mr - 1)) // mr, "serial", seq(
            *row_lets, _row_tile(nest, p, blk, rows, rt, (aw, ascale, aqsum), codes, psum)))
        blocks = For(blk, const(0), const(nest.blocks), "serial",
                     seq(_unpack(nest, p, blk, codes), tiles))
        return seq(LetStmt(row0, c * mc),
                   LetStmt(here, const(mc) if static else min_(mc, m - c * mc)),
                   Allocate(psum), Allocate(codes), init, blocks,
                   chunk_store(p, row0, here, psum))

    if isinstance(m, int):
        loop = parallel_when(lambda: parallel_tiles((nest.panels, chunks), tile),
                             m * nest.k * nest.panels * nest.nr // 4, isa=nest.isa)
    else:  # one parallel nest: a serial twin would double the kernel
        loop = parallel_tiles((nest.panels, chunks), tile)
    return seq(Allocate(aw), Allocate(ascale), Allocate(aqsum),
               _quantize_rows(nest, m, aw, ascale, aqsum), loop)
