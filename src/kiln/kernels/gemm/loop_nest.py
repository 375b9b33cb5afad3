"""The GEMM loop nest: `out = epilogue(A @ B)` on register tiles, one function per variant.

`gemm_body` plans the nest (kiln.kernels.gemm.schedule) and picks its variant: the tiles
in one `parallel` loop panel by panel or row tile by row tile (`_tiles_in_order`), each
panel first copied to the stack (`_panel_copies`), or the sums blocked along K
(`_k_blocked`). Every variant runs `_tile`: one register tile (the micro-kernel of
kiln.kernels.gemm.micro_kernel) stored through the epilogue (`_tile_stores`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Const,
    DeclBuffer,
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
from kiln.kernels.gemm.knobs import KBlocking, choose_k_blocking, k_block_caches
from kiln.kernels.gemm.micro_kernel import (
    BReader,
    GemmShape,
    register_tile,
    row_splits,
    row_tile,
    unflatten,
)
from kiln.kernels.gemm.schedule import GemmNest, GemmSchedule, KSegment, plan_nest
from kiln.kernels.tiles import (
    Epilogue,
    bound,
    const,
    lanes_loop,
    parallel_tiles,
    parallel_when,
)
from kiln.ops.broadcast import broadcast_index
from kiln.target.isa import ISA

#: Reads B at `(k, v)` of the current panel from its copy on the stack.
PanelRead = Callable[[PrimExpr, PrimExpr], PrimExpr]


def gemm_body(shape: GemmShape, schedule: GemmSchedule, a: Buffer, b_at: BReader,
              out: Buffer, epilogue: Epilogue, prologue: Sequence[Stmt] = (), *,
              isa: ISA, prefetch: Buffer | None = None) -> Stmt:
    """The loop nest of `out = epilogue(A @ B)` on `schedule` (`GemmSchedule`): `a` is A
    (`[*a_batch, *rows, k]`, read in place), `b_at` reads B's panels, `out` is
    `[*batch, *rows, n]`; `prologue` runs first (a run-time packing of B); `prefetch`:
    B's packed panels, the next of which the full-height row tiles prefetch (the
    unblocked nest, panel by panel: kiln.kernels.gemm.schedule.prefetches_panels)."""
    nest = plan_nest(shape, schedule, a, b_at, out, epilogue, isa, prefetch)
    if nest.pf is not None:
        prologue = (*nest.pf.decls, *prologue)
    nest, prologue = _rows_flattened(nest, prologue)
    blocking = schedule.blocking
    caches = k_block_caches()
    if blocking is None and caches is not None:
        blocking = choose_k_blocking(nest.m, shape.k, schedule.tiling, *caches)
    if schedule.copy_panels and blocking is None and not schedule.by_rows \
            and isinstance(shape.k, int):
        return seq(*prologue, _panel_copies(nest))
    if blocking is None or not nest.static_m or not isinstance(shape.k, int) \
            or shape.k <= blocking.kc:
        return seq(*prologue, _tiles_in_order(nest))
    return seq(*prologue, _k_blocked(nest, blocking))


def _rows_flattened(nest: GemmNest, prologue: Sequence[Stmt]
                    ) -> tuple[GemmNest, Sequence[Stmt]]:
    """Over symbolic rows of more than one dim (`[seq, batch]`), A read and the output
    stored through views of their rows flattened (`[*a_batch, m, k]`, `[*batch, m,
    n]`), so a tile finds each of its rows without a division by the symbolic sizes
    (the epilogue still gets the output's own index: divisions only it reads)."""
    shape, a, out = nest.shape, nest.a, nest.out
    if nest.static_m or sum(1 for d in shape.rows if not (isinstance(d, int) and d == 1)) < 2:
        return nest, prologue
    lets: list[Stmt] = []
    rows = bound("gemm_rows", nest.m, lets)
    a_view = Buffer(f"{a.name}_rows", (*a.shape[:len(shape.a_batch)], rows, shape.k), a.dtype)
    out_view = Buffer(f"{out.name}_rows", (*out.shape[:len(shape.batch)], rows,
                                          out.shape[-1]), out.dtype)
    return (replace(nest, a=a_view, out_rows=out_view),
            (*prologue, *lets, DeclBuffer(a_view, a, 0), DeclBuffer(out_view, out, 0)))


def _tiles_in_order(nest: GemmNest) -> Stmt:
    """All tiles of all products in one parallel loop: panel by panel, or row tile by row
    tile (`by_rows`)."""
    shape = nest.shape
    if nest.schedule.by_rows:
        return parallel_when(lambda: parallel_tiles(
            (shape.batches, nest.mtiles, nest.panels),
            lambda bf, mt, p: _tile(nest, bf, p, mt)), shape.madds, isa=nest.isa)
    return parallel_when(lambda: parallel_tiles(
        (shape.batches, nest.panels, nest.mtiles),
        lambda bf, p, mt: _tile(nest, bf, p, mt)), shape.madds, isa=nest.isa)


def _panel_copies(nest: GemmNest) -> Stmt:
    """A parallel tile per (product, group of `panel_group` panels): the group's panels
    copied into a `local` block (`copy_panels`), then every row tile run over each of
    them, reading the copy."""
    shape, nr, panels, mtiles = nest.shape, nest.nr, nest.panels, nest.mtiles
    k_steps, group = shape.k, max(1, min(nest.schedule.panel_group,
                                         panels if isinstance(panels, int) else 1))
    groups = -(-panels // group)

    def panel_tiles(bflat: PrimExpr, gi: PrimExpr) -> Stmt:
        copied = Buffer("panel", (group, k_steps, nr), nest.acc_t, "local")
        lets: list[Stmt] = []
        bidx = unflatten(bflat, shape.batch, "j", lets)
        kk, mt, j = Var("k", INDEX_DTYPE), Var("mt", INDEX_DTYPE), Var("pj", INDEX_DTYPE)
        here: PrimExpr = (const(group) if panels % group == 0
                          else min_(group, panels - gi * group))
        first = gi * group if group > 1 else gi
        fill = For(j, const(0), here, "serial", For(
            kk, const(0), const(k_steps), "serial", lanes_loop("v", nr, lambda v: Store(
                copied, nest.b_at(bidx, first + j, kk, v), (j, kk, v)))))
        return seq(Allocate(copied), *lets, fill, For(
            mt, const(0), as_expr(mtiles, INDEX_DTYPE), "serial",
            For(j, const(0), here, "serial", _tile(
                nest, bflat, first + j, mt, copied=lambda kk, v: copied[j, kk, v]))))

    return parallel_when(lambda: parallel_tiles((shape.batches, groups), panel_tiles),
                         shape.madds, isa=nest.isa)


def _k_blocked(nest: GemmNest, blocking: KBlocking) -> Stmt:
    """A parallel tile per (product, panel, `mc` rows): its row tiles summed `kc` steps of
    K at a time (`KBlocking`), the partial sums in a `local` array."""
    shape, mr, nr, mtiles = nest.shape, nest.mr, nest.nr, nest.mtiles
    per_block = max(1, blocking.mc // mr)  # row tiles per parallel tile
    mblocks = -(-mtiles // per_block)

    def blocked(bflat: PrimExpr, panel: PrimExpr, mb: PrimExpr) -> Stmt:
        sums = Buffer("sums", (per_block * mr, nr), nest.acc_t, "local")
        tiles_here: PrimExpr = (const(per_block) if mtiles % per_block == 0
                                else min_(per_block, mtiles - mb * per_block))
        kc, k = blocking.kc, shape.k
        blocks = -(-k // kc)

        def over_rows(k0: PrimExpr, steps: int, first: bool, last: bool) -> Stmt:
            j = Var("j", INDEX_DTYPE)
            seg = KSegment(sums, j * mr, k0, steps, first, last)
            return For(j, const(0), tiles_here, "serial",
                       _tile(nest, bflat, panel, mb * per_block + j, seg))

        middle: list[Stmt] = []
        if blocks > 2:
            kb = Var("kb", INDEX_DTYPE)
            middle.append(For(kb, const(1), const(blocks - 2), "serial",
                              over_rows(kb * kc, kc, False, False)))
        return seq(Allocate(sums), over_rows(const(0), kc, True, False), *middle,
                   over_rows(const((blocks - 1) * kc), k - (blocks - 1) * kc, False, True))

    return parallel_when(lambda: parallel_tiles((shape.batches, nest.panels, mblocks),
                                                blocked), shape.madds, isa=nest.isa)


def _a_rows(nest: GemmNest, bidx: tuple[PrimExpr, ...], mt: PrimExpr, head: list[Stmt]
            ) -> list[Callable[[PrimExpr], PrimExpr]]:
    """The readers of the tile's `mr` rows of A (their indices bound in `head`); the
    last tile's surplus rows read the last row."""
    shape, mr = nest.shape, nest.mr
    a_batch = tuple(as_expr(i, INDEX_DTYPE) for i in broadcast_index(bidx, shape.a_batch))
    a_pre: list[tuple[PrimExpr, ...]] = []
    for r in range(mr):
        row: PrimExpr = mt * mr + r if nest.many_tiles else const(r)
        if r >= nest.surplus_from:  # the last tile's surplus rows read the last row
            row = min_(row, nest.m - 1)
        rv = Var(f"m{r}", INDEX_DTYPE)
        head.append(LetStmt(rv, row))
        ridx = (rv,) if nest.out_rows is not None else unflatten(rv, shape.rows, f"r{r}_", head)
        a_pre.append((*a_batch, *ridx))
    a = nest.a

    def read(p: tuple[PrimExpr, ...]) -> Callable[[PrimExpr], PrimExpr]:
        return lambda kk: a[(*p, kk)]

    return [read(p) for p in a_pre]


def _tile(nest: GemmNest, bflat: PrimExpr, panel: PrimExpr, mt: PrimExpr,
          part: KSegment | None = None, copied: PanelRead | None = None) -> Stmt:
    """One register tile (`_one_tile`); over a symbolic M, the last, partial row tile
    runs one row at a time (`_row_remainder`)."""
    if nest.static_m or nest.mr == 1 or part is not None:
        return _one_tile(nest, bflat, panel, mt, part, copied)
    return _row_remainder(nest, bflat, panel, mt, copied)


def _row_remainder(nest: GemmNest, bflat: PrimExpr, panel: PrimExpr, mt: PrimExpr,
                   copied: PanelRead | None) -> Stmt:
    """Row tile `mt` of a symbolic M: the full `mr`-row tile where more than half of
    `mr` rows are left (its surplus rows read the last row again), else the rows left
    on the shortest tile of the same panel that holds them, its height a divisor of
    `mr` (8: 1, 2 or 4 rows; one or two rows on `micro_kernel.row_tile`). A full-height tile
    over the few rows of a small M (batch 1: one row) multiplies `mr` times the work (an
    LSTM's h @ R at batch 1: 6x its pinned product); rows one at a time read B's panel
    once per row (batch 2-4), so a short tile takes them together."""
    mr = nest.mr
    left = nest.m - mt * mr
    # 1, 2, 4, ...: heights dividing mr, so a short tile starts where row tile `mt` does
    heights = [h for h in (1, 2, 4, 8) if 2 * h <= mr and mr % h == 0]

    def tile_of(h: int) -> Stmt:
        sub = replace(nest, mr=h, many_tiles=True, surplus_from=1, last_rows=h)
        return _one_tile(sub, bflat, panel, mt * (mr // h), None, copied)

    if 2 * heights[-1] >= mr:  # the tallest holds every count left
        short = tile_of(heights[-1])
        heights = heights[:-1]
    else:  # (an odd mr) the rows left one at a time
        j = Var("mrow", INDEX_DTYPE)
        one = replace(nest, mr=1, many_tiles=True, surplus_from=1, last_rows=1)
        short = For(j, const(0), left, "serial",
                    _one_tile(one, bflat, panel, mt * mr + j, None, copied))
    for h in reversed(heights):
        short = IfThenElse(compare("le", left, const(h)), tile_of(h), short)
    return IfThenElse(compare("gt", left * 2, const(mr)),
                      _one_tile(nest, bflat, panel, mt, None, copied), short)


def _one_tile(nest: GemmNest, bflat: PrimExpr, panel: PrimExpr, mt: PrimExpr,
              part: KSegment | None = None, copied: PanelRead | None = None) -> Stmt:
    """One register tile; `part`: only K's segment `part.k0 ..` of it, its sums started
    from (and, but in the last segment, left in) the partial sums; `copied`: reads B at
    `(k, v)` from the panel's copy."""
    mr, nr, acc_t, fused = nest.mr, nest.nr, nest.acc_t, nest.schedule.fused
    head: list[Stmt] = []
    bidx = unflatten(bflat, nest.shape.batch, "i", head)
    a_rows = _a_rows(nest, bidx, mt, head)
    b_row = ((lambda kk, v: nest.b_at(bidx, panel, kk, v)) if copied is None
             else copied)
    k = nest.shape.k
    splits = row_splits(mr)
    if part is None and splits > 1 and not nest.static_m and isinstance(k, int) \
            and k >= 2 * splits:  # a symbolic M's few rows left (`_row_remainder`)
        acc, red = row_tile(nr, k, a_rows, b_row, acc_t, fused, splits)
    elif part is None:
        pf = nest.pf if copied is None and mr == nest.schedule.tiling.mr else None
        if pf is not None:  # the next panel's row at each step (`GemmNest.pf`)
            head.append(pf.start((panel, const(0), const(0)), pf.ahead))
        acc, red = register_tile(mr, nr, k, a_rows, b_row, acc_t, fused, also=None if pf is None
                                 else (lambda kk: _next_panel_row(nest, mt, kk)))
    else:
        sums, row0 = part.sums, part.row0
        acc, red = register_tile(
            mr, nr, part.k, a_rows, b_row, acc_t, fused, k0=part.k0,
            init=None if part.first else (lambda r, v: sums[row0 + r, v]))
        if not part.last:
            keep = lanes_loop("v", nr, lambda v: seq(*(
                Store(sums, acc[const(r), v], (row0 + r, v)) for r in range(mr))))
            return seq(*head, *red, keep)
    # Copied out at constant rows as whole vectors, the accumulators stay registers; the
    # stores below loop over `stage` (contiguous along the output row).
    stage = Buffer("stage", (mr, nr), acc_t, "local")
    copy = lanes_loop("v", nr, lambda v: seq(*(Store(stage, acc[const(r), v], (const(r), v))
                                            for r in range(mr))))
    return seq(*head, *red, Allocate(stage), copy,
               *_tile_stores(nest, _TileOut(bidx, panel, mt, stage)))


#: The next panel's rows are prefetched by this many row tiles of the current one, each
#: a consecutive share of them (a prompt's 128 rows: 16 tiles of 8), so the panel
#: streams in over the whole panel's work, not in a burst.
PREFETCH_TILES = 16


def _next_panel_row(nest: GemmNest, mt: PrimExpr, kk: PrimExpr) -> list[Stmt]:
    """Step `kk` of row tile `mt`: a prefetch of the next panel's row that is this
    tile's share (`PREFETCH_TILES` consecutive shares of K's rows), each row for
    `PREFETCH_TILES` steps in turn; the tiles past them prefetch the last share again."""
    assert nest.pf is not None and isinstance(nest.shape.k, int)
    k = nest.shape.k
    share = max(1, k // PREFETCH_TILES)
    row = min_(min_(mt, PREFETCH_TILES - 1) * share + kk // PREFETCH_TILES, k - 1)
    return nest.pf.at(row * nest.nr, nest.nr)


@dataclass(frozen=True)
class _TileOut:
    """Where a tile stores: the product `bidx`, the panel, the row tile `mt`, its sums in
    `stage`."""

    bidx: tuple[PrimExpr, ...]
    panel: PrimExpr
    mt: PrimExpr
    stage: Buffer


def _tile_stores(nest: GemmNest, at: _TileOut) -> list[Stmt]:
    """The tile's stores through the epilogue; with `two_pass`, the sums are stored as
    they are, then the epilogue runs over the tile in L1 on its own: calls in it (exp)
    would otherwise spill the accumulators."""
    mr, nr, panels, m, n = nest.mr, nest.nr, nest.panels, nest.m, nest.n
    n0 = at.panel * nr if not isinstance(panels, int) or panels > 1 else const(0)
    width: PrimExpr = const(nr) if nest.whole_panels else min_(nr, n - n0)
    # the rows this tile stores: all but in the last tile
    rows_here: PrimExpr = (const(mr) if nest.static_m and nest.last_rows == mr
                           else min_(mr, m - at.mt * mr))

    def store_loops(from_out: bool, apply: bool, cols: PrimExpr) -> Stmt:
        """The tile's `cols` columns stored row by row from `stage` (or `out` itself),
        through the epilogue when `apply`: one loop nest, so the epilogue is in the IR
        once per column count."""
        r, v = Var("r", INDEX_DTYPE), Var("v", INDEX_DTYPE)
        lets: list[Stmt] = []
        rv = Var("row", INDEX_DTYPE)
        lets.append(LetStmt(rv, at.mt * mr + r if nest.many_tiles else r))
        idx = (*at.bidx, *unflatten(rv, nest.shape.rows, "o", lets), n0 + v)
        out, to = nest.out, idx
        if nest.out_rows is not None:  # stored through the flat rows (`_rows_flattened`)
            out, to = nest.out_rows, (*at.bidx, rv, n0 + v)
        # a shifted last panel's columns are its upper lanes (`shifted_tail`)
        lane: PrimExpr = v + (const(nr) - cols) if nest.shift and not isinstance(cols, Const) \
            else v
        value: PrimExpr = out[to] if from_out else at.stage[r, lane]
        # whole panels store as vectors when the epilogue allows (vector_loops)
        kind = "vectorized" if isinstance(cols, Const) else "serial"
        row = For(v, const(0), cols, kind,
                  Store(out, nest.epilogue(value, idx) if apply else value, to))
        return For(r, const(0), rows_here, "serial", seq(*lets, row))

    def panel_stores(from_out: bool, apply: bool) -> Stmt:
        """Whole panels store `nr` columns as vectors; a partial last panel (N no
        multiple of nr, or symbolic) stores the columns there are, one by one."""
        if isinstance(width, Const):
            return store_loops(from_out, apply, width)
        if isinstance(n, int) and n < nr:  # one partial panel
            return store_loops(from_out, apply, width)
        return IfThenElse(compare("ge", n - n0, const(nr)),
                          store_loops(from_out, apply, const(nr)),
                          store_loops(from_out, apply, width))

    if nest.two_pass:
        return [panel_stores(False, False), panel_stores(True, True)]
    return [panel_stores(False, True)]
