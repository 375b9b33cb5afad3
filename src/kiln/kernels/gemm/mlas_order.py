"""A float32 GEMM summed in MLAS's order, on register tiles (kiln.ops.quant_mlas_conv).

`out[b][m][n] = sum over k of A(b, m, k) * B(b, k, n)` for every batch `b`, where each
output's sum is MLAS's SGEMM's: K cut into blocks of a length that depends on the
output's column (`Segment`), each block's products added in k order with fused
multiply-adds starting from 0, the blocks' sums added in order; or, for a product of
one row (`MlasGemm.one_row`), MLAS's M = 1 kernel: in each block, the rounded products
of 4 k at a time added in order, that sum added to the output, then 2 and 1 for the
block's rest, no FMA.

The order is per output, so the tiling is free: a tile is `mr` rows x `width` columns
(`width` the tile's `nr` lanes, or a segment's last few columns), its accumulators
held in registers through each block (kiln.kernels.gemm.micro_kernel.register_tile:
one B row loaded as whole vectors, one broadcast A value per row, `mr` FMAs per
vector), the running sums of the blocks beside them. A is read in place, row-major,
by the caller's reader (a constant weight: no packing at run time); B by the caller's
reader too (an input read in place, or a workspace of its columns). All tiles of all
batches form one `parallel` loop, panel by panel (a thread's consecutive tiles read
one B panel) or, where B's panels fit the L2 (kiln.kernels.gemm.schedule.rows_first),
row tile by row tile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.micro_kernel import GemmShape, choose_gemm_tiling, register_tile
from kiln.kernels.gemm.schedule import rows_first
from kiln.kernels.tiles import (
    const,
    lanes_loop,
    parallel_tiles,
    parallel_when,
    tile_lanes,
    tile_registers,
)
from kiln.ops.quant_mlas_conv import m1_steps
from kiln.target.isa import ISA

#: A's value at (batch, row, k); B's at (batch, k, column).
ARead = Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]
BRead = Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]
#: The statement storing one output's sum at (batch, row, column, sum).
Put = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], Stmt]


@dataclass(frozen=True)
class Segment:
    """Columns `start .. stop`, whose sums take K blocks `stride` long."""

    start: int
    stop: int
    stride: int


def merged(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """`segments` (in column order) with neighbours of one block length joined: their
    columns then share tiles and one loop."""
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].stop == s.start and out[-1].stride == s.stride:
            out[-1] = Segment(out[-1].start, s.stop, s.stride)
        else:
            out.append(s)
    return tuple(out)


@dataclass(frozen=True)
class Run:
    """`count` tiles `width` columns wide from column `first`, summed in K blocks of
    `stride`, each storing its columns from the `skip`-th (the ones before it belong to
    the tile before)."""

    first: int
    count: int
    width: int
    stride: int
    skip: int = 0


@dataclass(frozen=True)
class MlasGemm:
    """The products one kernel computes (module docstring) and their register tile:
    `mr` rows x `nr` columns (whole vectors)."""

    batches: int
    m: int
    k: int
    segments: tuple[Segment, ...]
    mr: int
    nr: int
    lanes: int
    one_row: bool = False

    def runs(self) -> list[Run]:
        """The tiles of every segment: whole tiles of `nr` columns, then one of what is
        left rounded up to whole vectors, ending at the segment's end (it computes some
        of the tile before's columns again and stores the others), or, in a segment
        narrower than that, exactly as wide as what is left (for a tile of a vector and
        a few lanes more, LLVM gathers the rows' A values into one vector for the last
        lanes and shuffles them out again at every step)."""
        out = []
        for s in self.segments:
            whole, rest = divmod(s.stop - s.start, self.nr)
            if whole:
                out.append(Run(s.start, whole, self.nr, s.stride))
            if not rest:
                continue
            width = -(-rest // self.lanes) * self.lanes
            if width <= s.stop - s.start:
                out.append(Run(s.stop - width, 1, width, s.stride, width - rest))
            else:
                out.append(Run(s.stop - rest, 1, rest, s.stride))
        return out

    @property
    def columns(self) -> int:
        """N: the columns of the segments."""
        return sum(s.stop - s.start for s in self.segments)

    @property
    def madds(self) -> int:
        """The multiply-adds of all products (the parallel loop's work)."""
        return self.batches * self.m * self.columns * self.k


def plan(batches: int, m: int, k: int, segments: Sequence[Segment], isa: ISA,
         one_row: bool = False) -> MlasGemm:
    """The product's tile on `isa`: the GEMM rule's (kiln.kernels.gemm.micro_kernel
    .choose_gemm_tiling: 8 rows x 2 vectors with 32 vector registers, 6 x 2 with 16;
    fewer rows, wider, for a product of fewer rows)."""
    segs = merged(segments)
    widest = max(s.stop - s.start for s in segs)
    lanes = tile_lanes(isa)
    t = choose_gemm_tiling(1 if one_row else m, widest, lanes, tile_registers(isa))
    return MlasGemm(batches, m, k, segs, 1 if one_row else t.mr, t.nr, lanes, one_row)


def block_sums(k: int, stride: int, rows: int, width: int,
               a_rows: Sequence[Callable[[PrimExpr], PrimExpr]],
               b_row: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> tuple[Buffer, list[Stmt]]:
    """`total[r][v]`: the sums of K blocks of `stride`, each from 0 with FMAs in k order,
    added in order (MLAS's zero-mode then accumulate-mode SGEMM calls)."""
    total = Buffer("total", (rows, width), "float32", "local")
    whole, rest = divmod(k, stride)
    first = stride if whole else rest
    acc, stmts = register_tile(rows, width, first, a_rows, b_row, "float32", True)
    body: list[Stmt] = [Allocate(total), *stmts, *_combine(total, acc, rows, width, True)]

    def block(k0: PrimExpr, length: int) -> list[Stmt]:
        part, inner = register_tile(rows, width, length, a_rows, b_row, "float32", True,
                                    k0=k0)
        return [*inner, *_combine(total, part, rows, width, False)]

    if whole > 1:
        blk = Var("blk", INDEX_DTYPE)
        body.append(For(blk, const(1), const(whole - 1), "serial",
                        seq(*block(blk * stride, stride))))
    if whole and rest:
        body.extend(block(const(whole * stride), rest))
    return total, body


def _combine(total: Buffer, part: Buffer, rows: int, width: int, first: bool) -> list[Stmt]:
    """`total = part` (the first block) or `total = total + part`, row by row."""

    def row(r: int) -> Stmt:
        def lane(v: PrimExpr) -> Stmt:
            at = (const(r), v)
            return Store(total, part[at] if first else total[at] + part[at], at)
        return lanes_loop("v", width, lane)

    return [row(r) for r in range(rows)]


def m1_sums(k: int, stride: int, width: int, a_row: Callable[[PrimExpr], PrimExpr],
            b_row: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> tuple[Buffer, list[Stmt]]:
    """`total[0][v]` as MLAS's M = 1 kernel sums one row (`m1_steps` per block of
    `stride`; products and sums rounded apart: no FMA)."""
    total = Buffer("total", (1, width), "float32", "local")
    zero = as_expr(0.0, "float32")

    def step(kk: PrimExpr, count: int) -> Stmt:
        def lane(v: PrimExpr) -> Stmt:
            part = a_row(kk) * b_row(kk, v)
            for j in range(1, count):
                part = part + a_row(kk + j) * b_row(kk + j, v)
            return Store(total, part + total[const(0), v], (const(0), v))
        return lanes_loop("v", width, lane)

    def block(k0: PrimExpr, length: int) -> list[Stmt]:
        steps = m1_steps(length)
        groups = steps.count(4)
        body: list[Stmt] = []
        if groups:
            gv = Var("g4", INDEX_DTYPE)
            body.append(For(gv, const(0), const(groups), "serial", step(k0 + gv * 4, 4)))
        at = k0 + groups * 4
        for count in steps[groups:]:
            body.append(step(at, count))
            at = at + count
        return body

    stmts: list[Stmt] = [Allocate(total), lanes_loop("v", width, lambda v: Store(
        total, zero, (const(0), v)))]
    whole, rest = divmod(k, stride)
    if whole:
        blk = Var("blk", INDEX_DTYPE)
        stmts.append(For(blk, const(0), const(whole), "serial", seq(*block(blk * stride,
                                                                           stride))))
    if rest:
        stmts.extend(block(const(whole * stride), rest))
    return total, stmts


def _tile(g: MlasGemm, run: Run, a_at: ARead, b_at: BRead, put: Put, bg: PrimExpr,
          rt: PrimExpr, j: PrimExpr) -> Stmt:
    """Tile `j` of `run` in row tile `rt` of batch `bg`: its sums and their stores (the
    last row tile's surplus rows read A's last row and store nothing)."""
    first: PrimExpr = const(run.first) if run.count == 1 else j * run.width + run.first
    rows = g.mr
    lets: list[Stmt] = []
    a_rows = []
    for r in range(rows):
        rv = Var(f"m{r}", INDEX_DTYPE)
        row: PrimExpr = rt * rows + r
        lets.append(LetStmt(rv, row if g.m % rows == 0 else min_(row, const(g.m - 1))))
        a_rows.append(lambda kk, rv=rv: a_at(bg, rv, kk))

    def b_row(kk: PrimExpr, v: PrimExpr) -> PrimExpr:
        return b_at(bg, kk, first + v)

    total, body = (m1_sums(g.k, run.stride, run.width, a_rows[0], b_row) if g.one_row
                   else block_sums(g.k, run.stride, rows, run.width, a_rows, b_row))
    stores: list[Stmt] = []
    for r in range(rows):
        row = rt * rows + r

        def lane(v: PrimExpr, r: int = r, row: PrimExpr = row) -> Stmt:
            at = v + run.skip if run.skip else v
            return put(bg, row, first + at, total[const(r), at])

        store = lanes_loop("v", run.width - run.skip, lane)
        stores.append(store if g.m % rows == 0 else IfThenElse(compare("lt", row, const(g.m)),
                                                                store))
    return seq(*lets, *body, *stores)


def _over_runs(runs: list[Run], tile: Callable[[Run, PrimExpr], Stmt], panel: PrimExpr
               ) -> Stmt:
    """`tile(run, j)` for the run panel `panel` (an index over all runs' tiles) falls in."""
    starts = [0]
    for run in runs:
        starts.append(starts[-1] + run.count)
    stmt = tile(runs[-1], panel - starts[-2] if starts[-2] else panel)
    for run, start, end in reversed(list(zip(runs[:-1], starts[:-2], starts[1:-1]))):
        stmt = IfThenElse(compare("lt", panel, const(end)),
                          tile(run, panel - start if start else panel), stmt)
    return stmt


def mlas_gemm_body(g: MlasGemm, a_at: ARead, b_at: BRead, put: Put, l2_bytes: int, *,
                   isa: ISA) -> Stmt:
    """The loop nest of every product's tiles (the module docstring): one parallel loop,
    row tile by row tile where B's panels of one product fit `l2_bytes` (rows_first),
    else panel by panel."""
    runs = g.runs()
    panels = sum(r.count for r in runs)
    row_tiles = -(-g.m // g.mr)
    by_rows = rows_first(GemmShape((g.batches,), (), (g.m,), g.columns, g.k),
                         GemmTiling(g.mr, g.nr), l2_bytes)

    def tile(bg: PrimExpr, rt: PrimExpr, panel: PrimExpr) -> Stmt:
        return _over_runs(runs, lambda run, j: _tile(g, run, a_at, b_at, put, bg, rt, j),
                          panel)

    def build() -> Stmt:
        if by_rows:
            return parallel_tiles((g.batches, row_tiles, panels), tile)
        return parallel_tiles((g.batches, panels, row_tiles),
                              lambda bg, panel, rt: tile(bg, rt, panel))

    return parallel_when(build, g.madds, isa=isa)
