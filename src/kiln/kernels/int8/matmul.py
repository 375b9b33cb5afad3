"""The kernel of the packed int8 matrix products (`qlinear_matmul_packed`,
`matmul_integer_packed`, kiln.ops.quant_packed; and the integer part of
`dynamic_quant_matmul_packed`, kiln.kernels.int8.dynamic): register tiles of int32
accumulators over B's panels (`build_matmul_tiles`), on the dot form's words where the
target has a dot product (kiln.kernels.int8.dot), with the requantizing (or zero-point
correcting) epilogue applied as the tiles store. A's rows (its leading dims: batch x
seq) may be symbolic: the same tiles, a run-time count of row tiles (`_symbolic_tiles`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.graph import Call
from kiln.ir.shape_expr import dim_product, is_static
from kiln.ir.tensor import (
    DOT4_U8S8,
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    IfThenElse,
    Intrin,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.kernels.int8 import dot
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import bound, parallel_tiles, parallel_when
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.ops.quant import out_range, requantize_value
from kiln.ops.quant_packed import INTEGER, MATMUL, packed_group
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
#: `epilogue(acc, column, output index)`: the value a matrix-product tile stores
TileEpilogue = Callable[[PrimExpr, PrimExpr, tuple[PrimExpr, ...]], PrimExpr]
#: Rows x columns of int32 accumulators of the matrix-product tile: 4 x 64 = 16 AVX-512
#: registers; every B row loaded from cache feeds MR rows of A. Without a dot product
#: B's panels are TILE_COLS wide (kiln.kernels.int8.packing).
TILE_ROWS, TILE_COLS = 4, 64


def tile_isa(attrs: Attrs, isa: ISA) -> ISA | None:
    """The ISA whose register tiles run a packed product of words (`k_group` > 1) on
    `isa`, or None when its dot form packs other words (the te definition reads them)."""
    group = packed_group(attrs)
    dot_isa = dot.target_isa(isa, qw.saturates(attrs)) if group > 1 else None
    return dot_isa if dot_isa is not None and dot.k_group(dot_isa) == group else None


def build_matmul_tiles(a: Buffer, bp: Buffer, n: int, out: Buffer, epilogue: TileEpilogue,
                       isa: ISA | None, intrinsic: str = DOT4_U8S8, *, target: ISA) -> Stmt:
    """The register-tiled loop nest of a packed matrix product (A's leading dims are its
    rows, flattened): tiles of rows x `bp.shape[2]` int32 accumulators (surplus rows and
    columns read the last row/column and are not stored). `epilogue(acc, column, at)`
    is the value stored at output index `at` for an accumulator of output column
    `column` (clamped into the output: safe to read per-column parameters with).

    The tiles run column panel by column panel, every row tile of a panel in turn, as
    one loop over (panel, row tile) split over threads in contiguous chunks: a panel of
    B (`K x nr`, 196 KB for K = 3072 words of 64 columns) is read from memory once and
    then from cache by all row tiles, instead of once per row tile.

    Without `isa`, B holds int8/int16 elements and a tile has TILE_ROWS rows; with it,
    B holds the dot form's words (kiln.kernels.int8.dot), A's rows are packed into words first and
    a tile has `dot.tile_rows(isa)` rows. `target`: the target's ISA (threads)."""
    if not is_static(tuple(a.shape)):
        return _symbolic_tiles(a, bp, n, out, epilogue, isa, intrinsic, target)
    lead = tuple(int(d) for d in a.shape[:-1])
    m, k_extent = int(np.prod(lead, dtype=np.int64)), int(a.shape[-1])
    col_tiles, nr = int(bp.shape[0]), int(bp.shape[2])
    mr = min(dot.tile_rows(isa, nr) if isa else TILE_ROWS, m)
    row_tiles = -(-m // mr)
    work = m * n * k_extent
    prologue: list[Stmt] = []
    if isa is not None:
        packed_a = Buffer("a_words", (m, int(bp.shape[1])), "int32", "global")
        prologue = [Allocate(packed_a), dot.pack_a(
            a, packed_a, "parallel" if worth_parallel(work, "madd", target, "int8") and m > 1
            else "serial", dot.k_group(isa))]

    def tile(ct: PrimExpr, rt: PrimExpr) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        def col(v: PrimExpr) -> PrimExpr:
            # clamped only when the last tile is partial: full tiles load contiguously
            return ct * nr + v if n % nr == 0 else min_(ct * nr + v, n - 1)

        def row(r: PrimExpr) -> PrimExpr:
            return rt * mr + r if m % mr == 0 else min_(rt * mr + r, m - 1)

        def update(k: PrimExpr, r: PrimExpr, v: PrimExpr) -> PrimExpr:
            if isa is not None:
                return Intrin(intrinsic, (acc[r, v], packed_a[row(r), k], bp[ct, k, v]))
            a_rk = Cast("int32", a[(*te.unflatten_index(row(r), lead), k)])
            return acc[r, v] + a_rk * Cast("int32", bp[ct, k, v])

        zero, step = _accumulate(acc, int(bp.shape[1]), update)

        def store(r: PrimExpr, v: PrimExpr) -> Stmt:
            j = ct * nr + v
            at = (*te.unflatten_index(rt * mr + r, lead), j)
            return Store(out, epilogue(acc[r, v], col(v), at), at)

        def store_row(r: PrimExpr) -> Stmt:
            # whole columns store as vectors (a fused tail then runs on vectors too)
            row = tile_loop("v", nr, lambda v: store(r, v), "vectorized") if n % nr == 0 \
                else tile_loop("v", nr, lambda v: IfThenElse(compare("lt", ct * nr + v, n),
                                                             store(r, v)))
            return row if m % mr == 0 else IfThenElse(compare("lt", rt * mr + r, m), row)

        stores = tile_loop("r", mr, store_row)
        return seq(Allocate(acc), zero, step, stores)

    tiles = parallel_when(lambda: parallel_tiles((col_tiles, row_tiles), tile), work,
                          "madd", "int8", isa=target)
    return seq(*prologue, tiles)



def _accumulate(acc: Buffer, k_steps: int, update: Callable[[PrimExpr, PrimExpr, PrimExpr],
                                                            PrimExpr]) -> tuple[Stmt, Stmt]:
    """A register tile's zeroing of `acc` (rows x lanes) and its `k_steps` updates, each
    `acc[r, v] = update(k, r, v)`: rows unrolled, lanes vectorized."""
    mr, nr = int(acc.shape[0]), int(acc.shape[1])
    zero = tile_loop("r", mr, lambda r: tile_loop(
        "v", nr, lambda v: Store(acc, as_expr(0, "int32"), (r, v)), "vectorized"))
    step = tile_loop("k", k_steps, lambda k: tile_loop(
        "r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, update(k, r, v), (r, v)), "vectorized"),
        "unrolled"))
    return zero, step


#: Tile heights a symbolic row count of at most that many rows runs on, below the
#: full height (a recurrent step's or a decoder's few rows at batch 2-4): a full-height
#: tile over them would compute its surplus rows for nothing.
SMALL_ROW_CLASSES = (2, 4)


def _symbolic_tiles(a: Buffer, bp: Buffer, n: int, out: Buffer, epilogue: TileEpilogue,
                    isa: ISA | None, intrinsic: str, target: ISA) -> Stmt:
    """`build_matmul_tiles` for A with symbolic rows (its leading dims: batch, seq; K
    static): the same register tiles, as many row tiles as the rows need at run time,
    the last one's surplus rows reading the last row and not stored. A row count of at
    most a class of `SMALL_ROW_CLASSES` runs tiles of that height instead, chosen at
    run time."""
    m = dim_product(a.shape[:-1])
    k_extent, nr = int(a.shape[-1]), int(bp.shape[2])
    mr = dot.tile_rows(isa, nr) if isa else TILE_ROWS
    lets: list[Stmt] = []
    rows = bound("rows", m, lets)
    work = as_expr(rows) * (n * k_extent)
    # A as rows (one view, no division per element)
    a_rows = Buffer("a_rows", (rows, k_extent), a.dtype)
    lets.append(DeclBuffer(a_rows, a, 0))
    packed_a: Buffer | None = None
    if isa is not None:
        packed_a = Buffer("a_words", (rows, int(bp.shape[1])), "int32", "global")
        pack = a_rows, packed_a, dot.k_group(isa)
        lets += [Allocate(packed_a), parallel_when(
            lambda: dot.pack_a(pack[0], pack[1], "parallel", pack[2]), work, "madd", "int8",
            isa=target)]
    source = _RowSource(a_rows, packed_a, bp, n, out, epilogue, intrinsic, rows, work, target)
    tiles = source.tiles(mr)
    for height in reversed([h for h in SMALL_ROW_CLASSES if h < mr]):
        tiles = IfThenElse(compare("le", as_expr(rows), height), source.tiles(height), tiles)
    return seq(*lets, tiles)


@dataclass(frozen=True)
class _RowSource:
    """What the tiles of a symbolic row count read and write (`_symbolic_tiles`): A's
    rows (or their packed words), B's panels, the output and its epilogue."""

    a_rows: Buffer
    packed_a: Buffer | None
    bp: Buffer
    n: int
    out: Buffer
    epilogue: TileEpilogue
    intrinsic: str
    rows: Any
    work: PrimExpr
    target: ISA

    def tiles(self, mr: int) -> Stmt:
        """Every (panel, row tile) of `mr` rows, over the threads."""
        bp, n, rows, packed_a, a_rows = self.bp, self.n, self.rows, self.packed_a, self.a_rows
        col_tiles, nr = int(bp.shape[0]), int(bp.shape[2])
        lets: list[Stmt] = []
        row_tiles = bound("row_tiles", (as_expr(rows) + (mr - 1)) // mr, lets)
        lead_out = tuple(self.out.shape[:-1])

        def tile(ct: PrimExpr, rt: PrimExpr) -> Stmt:
            acc = Buffer("acc", (mr, nr), "int32", "local")

            def col(v: PrimExpr) -> PrimExpr:
                return ct * nr + v if n % nr == 0 else min_(ct * nr + v, n - 1)

            def row(r: PrimExpr) -> PrimExpr:
                return min_(rt * mr + r, as_expr(rows) - 1)

            def update(k: PrimExpr, r: PrimExpr, v: PrimExpr) -> PrimExpr:
                if packed_a is not None:
                    return Intrin(self.intrinsic, (acc[r, v], packed_a[row(r), k], bp[ct, k, v]))
                return acc[r, v] + Cast("int32", a_rows[row(r), k]) * Cast("int32", bp[ct, k, v])

            zero, step = _accumulate(acc, int(bp.shape[1]), update)

            def store_row(r: PrimExpr) -> Stmt:
                at_row = te.unflatten_index(rt * mr + r, lead_out)

                def store(v: PrimExpr) -> Stmt:
                    at = (*at_row, ct * nr + v)
                    return Store(self.out, self.epilogue(acc[r, v], col(v), at), at)

                cols = tile_loop("v", nr, store, "vectorized") if n % nr == 0 \
                    else tile_loop("v", nr, lambda v: IfThenElse(compare("lt", ct * nr + v, n),
                                                                 store(v)))
                return IfThenElse(compare("lt", rt * mr + r, rows), cols)

            return seq(Allocate(acc), zero, step, tile_loop("r", mr, store_row))

        return seq(*lets, parallel_when(lambda: parallel_tiles((col_tiles, row_tiles), tile),
                                        self.work, "madd", "int8", isa=self.target))


@dataclass(frozen=True)
class TiledMatmul:
    """A packed matrix product (`op`) on register tiles for A of rank >= 2, its rows
    (leading dims) static or symbolic (the te definition otherwise, and under a fused
    elementwise tail)."""

    op: str
    supports_symbolic = True
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """Whether the kernel applies to `call`: the tiles take it whole."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The tiled kernel of the product alone (None under a fused tail)."""
        if result is not None or len(args) != len(params) or args[0].ndim < 2 \
                or not is_static((args[0].shape[-1], *args[1].shape)):
            return None
        buffers = [Buffer(t.name, t.shape, t.dtype) for t in params]
        a, bp = buffers[0], buffers[1]
        epilogue: TileEpilogue
        if self.op == MATMUL:
            bias, multiplier, y_zp = buffers[2:]
            lo, hi = out_range(attrs, y_zp.dtype)
            dtype = y_zp.dtype

            def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
                mult = multiplier[()] if multiplier.ndim == 0 else multiplier[j]
                return requantize_value(acc + bias[j], mult, y_zp[()], lo, hi, y_zp.dtype)
        else:
            colsum, a_zp = buffers[2:]
            dtype = "int32"

            shift = qw.a_shift(a.dtype) if packed_group(attrs) > 1 else 0

            def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
                return acc - (Cast("int32", a_zp[()]) + shift) * colsum[j]

        n = int(attrs["n"])
        out = Buffer("out", (*a.shape[:-1], n), dtype)
        tiles = tile_isa(attrs, isa)
        if packed_group(attrs) > 1 and tiles is None:
            return None  # words packed for another target: the te definition reads them
        body = build_matmul_tiles(a, bp, n, out, epilogue, tiles, dot.dot_intrinsic(attrs),
                                  target=isa)
        return PrimFunc((*buffers, out), body, {ATTR_GEMM_KERNEL: self.op})


#: The lowerings of `qlinear_matmul_packed` and `matmul_integer_packed`
#: (kiln.kernels.lowering).
TILED_MATMUL = TiledMatmul(MATMUL)
TILED_INTEGER = TiledMatmul(INTEGER)
