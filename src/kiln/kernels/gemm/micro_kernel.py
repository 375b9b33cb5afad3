"""The GEMM micro-kernel (float32): register tiles over packed B panels.

`C = A @ B` is cut into register tiles of `mr` rows x `nr` columns (`GemmTiling`).
B is read as panels `[ceil(N / nr)][K][nr]` (`pack_b`, zero-padded past N): for
each `k` one tile step loads one contiguous `nr`-wide row of the panel and
broadcasts one A value per row (A is read in place, row-major), then issues
`mr * nr` multiply-adds into an accumulator array read and written at constant
indices only, so LLVM keeps it in vector registers (onnxruntime's MLAS SGEMM
kernels, IREE's mmt4d micro-kernels and oneDNN's brgemm all hold such a tile).
A constant B is packed at compile time (kiln.transform.matmul_blocking); a B
that is an activation (attention's Q @ K^T and P @ V) is packed into a
workspace at run time by `pack_b_at_run_time`, a copy of K x N elements against
M x N x K multiply-adds.

Remainders need no second tile: the last row tile's surplus rows read the last
row of A and store nothing, the last panel's surplus columns multiply B's zero
padding and are not stored. Each output value passes through
`epilogue(value, index)` as it is stored (bias, activation, residual add: the
elementwise ops FuseOps grouped after the product). The tiles of all products
(batch x panel x row tile, panel-major so that a thread's consecutive tiles
reuse one B panel from L2; batch x row tile x panel when B's panels fit L2,
`rows_first`) form one `parallel` loop, split evenly over threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import cast

import numpy as np

from kiln.errors import IRError
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    CallExtern,
    Const,
    For,
    IfThenElse,
    Intrin,
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
from kiln.ir.visitor import iter_exprs
from kiln.ops.broadcast import broadcast_index
from kiln.ops.kernels.tiles import (
    Epilogue,
    lanes_loop,
    madd,
    parallel_tiles,
    parallel_when,
)
from kiln.target.isa import ISA

# A tile's accumulators: at least 8 independent chains keep two FMA pipes with a
# 4-cycle latency busy; more than 16 only grows the unrolled IR (compile time).
MIN_ACCUMULATORS = 8
MAX_ACCUMULATORS = 16


@dataclass(frozen=True)
class GemmTiling:
    """A register tile of `mr` rows x `nr` columns (`nr` a multiple of the vector lanes)."""

    mr: int
    nr: int


def choose_gemm_tiling(m: int, n: int, lanes: int, registers: int) -> GemmTiling:
    """The tile shape for an `m` x `n` product on a target with `lanes` float32 lanes and
    `registers` vector registers.

    A tile is 2 vectors wide and as tall as the registers allow next to the B row (2
    vectors) and one broadcast A value, at most `MAX_ACCUMULATORS` accumulators:
    AVX2 (16 registers) 6 x 16, AVX-512 (32) 8 x 32, NEON (32) 8 x 8, SSE 6 x 8.
    Each step then loads 2 vectors and `mr` scalars for `2 * mr` vector FMAs.

    A product with fewer rows than that (`m` = 1: a matrix-vector product, the dense
    layers of a model at batch 1) takes all its rows in one tile and widens the tile
    instead, to keep `MIN_ACCUMULATORS` chains: 1 x 8 vectors, 2 x 4, ... Such a
    product streams B once; the width keeps every lane and both FMA pipes busy.
    """
    vecs = 2
    mr = min(MAX_ACCUMULATORS, registers - vecs - 1) // vecs
    if m < mr:
        mr = m
        vecs = min(8, max(2, -(-MIN_ACCUMULATORS // m)))
    # no wider than N rounded up to whole vectors (a 10-column layer is not padded to 64)
    vecs = max(1, min(vecs, -(-n // lanes)))
    return GemmTiling(mr=max(1, mr), nr=vecs * lanes)


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """B `[K, N]` -> panels `[ceil(N / nr)][K][nr]`, the columns past N zero."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def unpack_b(bp: np.ndarray, n: int) -> np.ndarray:
    """`pack_b` undone: B `[K, n]`."""
    panels, k, nr = bp.shape
    return np.ascontiguousarray(bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n])


@dataclass(frozen=True)
class GemmShape:
    """The products one kernel computes: `out[*batch, *rows, n] = A @ B` where the tiles
    loop over the output's `batch` dims (one product each; A's batch dims `a_batch`
    broadcast to them) and the `rows` dims are flattened into one product's M rows
    (all of A's leading dims when B is one constant matrix)."""

    batch: tuple[int, ...]
    a_batch: tuple[int, ...]
    rows: tuple[int, ...]
    n: int
    k: int

    @property
    def m(self) -> int:
        return _prod(self.rows)

    @property
    def batches(self) -> int:
        return _prod(self.batch)

    @property
    def madds(self) -> int:
        return self.batches * self.m * self.n * self.k


# B's value at (the output's batch index, panel, k, lane within the panel)
BReader = Callable[[tuple[PrimExpr, ...], PrimExpr, PrimExpr, PrimExpr], PrimExpr]


def _prod(dims: Sequence[int]) -> int:
    # symbolic dims (kiln.ops.te.dims) make a symbolic product
    return cast(int, dim_product(dims))


def _c(v: int) -> Const:
    return Const(v, INDEX_DTYPE)


def _unflatten(flat: PrimExpr, dims: Sequence[int], name: str,
               lets: list[Stmt]) -> tuple[PrimExpr, ...]:
    """The index into `dims` of the row-major flat index `flat` (bound once in `lets`)."""
    if len(dims) <= 1:
        return (flat,) if dims else ()
    idx: list[PrimExpr] = []
    rest = flat
    for k in range(len(dims) - 1, -1, -1):
        if k == 0:
            part = rest
        elif isinstance(dims[k], int) and dims[k] == 1:
            idx.append(_c(0))
            continue
        else:
            part = rest % dims[k]
            rest = rest // dims[k]
        v = Var(f"{name}{k}", INDEX_DTYPE)
        lets.append(LetStmt(v, part))
        idx.append(v)
    idx.reverse()
    return tuple(idx)


def register_tile(mr: int, nr: int, k: PrimExpr | int,
                  a_rows: Sequence[Callable[[PrimExpr], PrimExpr]],
                  b_row: Callable[[PrimExpr, PrimExpr], PrimExpr], dtype: str,
                  fused: bool, init: Callable[[int, PrimExpr], PrimExpr] | None = None,
                  k0: PrimExpr | int = 0) -> tuple[Buffer, list[Stmt]]:
    """The micro-kernel: `acc[r, v] = init(r, v) + sum over k0 <= kk < k0 + k of
    a_rows[r](kk) * b_row(kk, v)` (`init` zero when None).

    Returns the `local` accumulator buffer `acc[mr][nr]` and the statements computing it.
    Each step binds the `mr` A values once (scalars, broadcast) and runs the lanes `v`
    of the panel row as one `vectorized` loop: per lane, one B value and `mr`
    multiply-adds into the accumulators, at constant rows and whole vectors only, so
    LLVM keeps them in registers (the llvm backend emits the loop as vector
    instructions: one statement per tile row instead of one per element).
    """
    acc = Buffer("acc", (mr, nr), dtype, "local")
    zero = as_expr(0.0, dtype)
    stmts: list[Stmt] = [Allocate(acc), lanes_loop("v", nr, lambda v: seq(*(
        Store(acc, zero if init is None else init(r, v), (_c(r), v)) for r in range(mr))))]

    def step(kk: PrimExpr) -> Stmt:
        xs = [Var(f"a{r}", dtype) for r in range(mr)]
        lets: list[Stmt] = [LetStmt(av, a_rows[r](kk)) for r, av in enumerate(xs)]

        def lane(v: PrimExpr) -> Stmt:
            bv = Var("b", dtype)
            return seq(LetStmt(bv, b_row(kk, v)), *(
                Store(acc, madd(acc[_c(r), v], xs[r], bv, fused), (_c(r), v))
                for r in range(mr)))

        return seq(*lets, lanes_loop("v", nr, lane))

    stmts.append(reduction_loop("k", k0, k, k_unroll(), step))
    return acc, stmts


#: The K unroll factors tuning offers (kiln.ops.kernels.search), those no larger than K.
TUNED_UNROLLS = (2, 4, 8)
#: The K unroll factor GEMM kernels built inside `k_unrolling` take (a tuning knob:
#: kiln.ops.kernels.search's `{"unroll": U}`); None: the rule's, LLVM's to unroll.
_K_UNROLL: ContextVar[int | None] = ContextVar("kiln_k_unroll", default=None)


@contextlib.contextmanager
def k_unrolling(unroll: int | None) -> Iterator[None]:
    """Build the GEMM micro-kernels inside with their K loop unrolled by `unroll`
    (`reduction_loop`; None: the rule's, a plain loop)."""
    token = _K_UNROLL.set(unroll)
    try:
        yield
    finally:
        _K_UNROLL.reset(token)


def k_unroll() -> int | None:
    """The K unroll factor of the kernel being built (`k_unrolling`; None: the rule's)."""
    return _K_UNROLL.get()


def reduction_loop(name: str, k0: PrimExpr | int, k: PrimExpr | int, unroll: int | None,
                   step: Callable[[PrimExpr], Stmt]) -> Stmt:
    """`step(kk)` for `kk` in `k0 .. k0 + k`, in that order: one `serial` loop (unroll
    None or 1: the backend's to unroll), or with `unroll` = U a loop of `k // U` steps
    around an `unrolled` loop of U (both backends unroll it whole: LLVM's
    `llvm.loop.unroll.full`, C's `KILN_UNROLL`), then the `k % U` steps left. The
    steps run in the same order either way, so the sums are rounded the same."""
    start = as_expr(k0, INDEX_DTYPE)
    if unroll is None or unroll == 1:
        kk = Var(name, INDEX_DTYPE)
        return For(kk, start, as_expr(k, INDEX_DTYPE), "serial", step(kk))
    if not isinstance(k, int) or unroll < 1:
        raise IRError(f"a K loop unrolled by {unroll!r} needs a static K and a positive "
                      f"factor, got K = {k}")
    whole, rest = divmod(k, unroll)
    parts: list[Stmt] = []
    if whole:
        ko, ku, kk = (Var(f"{name}{s}", INDEX_DTYPE) for s in ("o", "u", ""))
        at = start + ko * unroll + ku if whole > 1 else start + ku
        inner = For(ku, _c(0), _c(unroll), "unrolled", seq(LetStmt(kk, at), step(kk)))
        parts.append(For(ko, _c(0), _c(whole), "serial", inner) if whole > 1 else inner)
    if rest:
        kr = Var(name, INDEX_DTYPE)
        parts.append(For(kr, start + whole * unroll, _c(rest), "serial", step(kr)))
    return seq(*parts)


@dataclass(frozen=True)
class KBlocking:
    """Blocking along K (GotoBLAS's `kc`/`mc`): each parallel tile is `mc` rows of one
    panel, summed `kc` steps of K at a time over all its row tiles, so the panel's `kc`
    x `nr` block is read from L1 by every row tile (and the `mc` x `kc` block of A
    from L2 by every panel); the partial sums wait in a `local` `[mc][nr]` array."""

    kc: int
    mc: int


#: The partial sums of a K-blocked tile live on the stack: at most this many bytes.
PARTIAL_SUM_BYTES = 32 * 1024


def choose_k_blocking(m: int | PrimExpr, k: int | PrimExpr, tiling: GemmTiling,
                      l1d_bytes: int, l2_bytes: int, itemsize: int = 4) -> KBlocking | None:
    """The K blocking of an `m` x `k` A on a cache of `l1d_bytes` / `l2_bytes` (half of
    each for the blocks, the rest for A's rows, the output and the partial sums), or
    None when K is symbolic or one block already fits L1: `kc` steps of a panel fill
    half of L1 (balanced: K split into equal blocks), `mc` rows of a `kc`-deep A block
    half of L2, no more than `PARTIAL_SUM_BYTES` of partial sums, a multiple of `mr`."""
    if not isinstance(k, int) or not isinstance(m, int):
        return None
    most = max(8, l1d_bytes // 2 // (tiling.nr * itemsize))
    if k <= most:
        return None
    blocks = -(-k // most)
    kc = -(-k // blocks)
    rows = min(PARTIAL_SUM_BYTES // (tiling.nr * itemsize),
               max(tiling.mr, (l2_bytes // 2) // (kc * itemsize)))
    mc = max(tiling.mr, rows // tiling.mr * tiling.mr)
    return KBlocking(kc, min(mc, -(-m // tiling.mr) * tiling.mr))


#: The (L1d, L2) bytes a kernel built inside `k_blocking` blocks its sums for (a tuning
#: knob, off by rule: kiln.ops.kernels.search's `{"kblock": true}`); None: no blocking.
_K_BLOCK: ContextVar[tuple[int, int] | None] = ContextVar("kiln_k_block", default=None)


@contextlib.contextmanager
def k_blocking(caches: tuple[int, int] | None) -> Iterator[None]:
    """Build GEMM kernels inside blocked along K for caches of `caches` = (L1d, L2)
    bytes (`choose_k_blocking`; None: unblocked, the rule)."""
    token = _K_BLOCK.set(caches)
    try:
        yield
    finally:
        _K_BLOCK.reset(token)


#: The share of L2 B's panels (of one product) may fill for the tiles to run row tile
#: by row tile (`rows_first`): the rest holds the row tile's A rows and the output.
ROWS_FIRST_L2_SHARE = 0.75
#: The size counted for a symbolic dimension when deciding the order (attention's seq:
#: its K^T and V panels are head_dim x seq, small at any usual length).
TYPICAL_DIM = 64


def rows_first(shape: GemmShape, tiling: GemmTiling, l2_bytes: int, itemsize: int = 4
               ) -> bool:
    """Whether the tiles of `shape` run row tile by row tile (each sweeping all of B's
    panels) instead of panel by panel (each sweeping all of A's rows): when B's panels
    of one product fit `ROWS_FIRST_L2_SHARE` of L2 (`l2_bytes`; 0: no L2 known).

    Panel by panel, A is read once per panel: from L2 when it fits there (BERT's 128
    rows), from L3 or memory otherwise (attention's `P @ V`: 1500 x 1500 scores read
    once per 16 columns of V), and each output row is written 16 columns at a time,
    one panel apart, so a cache line straddling two panels is fetched and written back
    twice (attention's `Q @ K^T`: 1500 x 1500 scores per head). Row tile by row tile,
    A is read once, B's panels come from L2 and the output is written row by row."""
    if l2_bytes <= 0:
        return False

    def size(d: object) -> int:
        return d if isinstance(d, int) else TYPICAL_DIM

    panels = -(-size(shape.n) // tiling.nr)
    return size(shape.k) * panels * tiling.nr * itemsize <= ROWS_FIRST_L2_SHARE * l2_bytes


def gemm_body(shape: GemmShape, tiling: GemmTiling, a: Buffer, b_at: BReader, out: Buffer,
              epilogue: Epilogue, fused: bool = True,
              prologue: Sequence[Stmt] = (), blocking: KBlocking | None = None,
              by_rows: bool = False, shifted_tail: bool = False,
              copy_panels: bool = False, panel_group: int = 1, *, isa: ISA) -> Stmt:
    """The loop nest of `out = epilogue(A @ B)`: `a` is A (`[*a_batch, *rows, k]`, read
    in place), `b_at` reads B's panels, `out` is `[*batch, *rows, n]`; `prologue` runs
    first (a run-time packing of B). With `blocking` (a static K longer than its `kc`),
    the sums run `kc` steps at a time (`KBlocking`). The tiles run panel by panel (each
    panel's row tiles in turn), or with `by_rows` row tile by row tile (`rows_first`;
    not with `blocking`).

    `shifted_tail` (a static N of at least `nr`, no multiple of it): the last, partial
    panel is computed over the last `nr` columns `n - nr .. n` instead of `nr` columns
    from its start (`b_at` then reads columns `min(panel * nr, n - nr) + v`: B read in
    place needs no zero padding), and stores only its columns past the previous panel,
    from its upper lanes (the columns both panels compute are stored once, so an
    epilogue reading the output's own memory, an in-place residual, reads it once).

    `copy_panels` (a static K; ignored with `blocking` or `by_rows`): a parallel tile is one
    panel of one product with all its row tiles; it first copies the panel's `k` x `nr`
    values (through `b_at`) into a contiguous block on the stack, which every row tile
    then reads (`panel_copy`). `panel_group` (with `copy_panels`): a parallel tile is that
    many consecutive panels (fewer in the last), copied together; each row tile then runs
    over all of them in turn, so it stores (and its epilogue reads) `panel_group * nr`
    consecutive columns of each output row."""
    m, n = shape.m, shape.n
    static_m = isinstance(m, int)  # else an expression of the kernel's dim scalars
    if (static_m and m < 1) or (isinstance(n, int) and n < 1):
        raise IRError(f"gemm kernel: empty product {shape}")
    caches = _K_BLOCK.get()
    if blocking is None and caches is not None:
        blocking = choose_k_blocking(m, shape.k, tiling, *caches)
    mr, nr = min(tiling.mr, m) if static_m else tiling.mr, tiling.nr
    # a symbolic N (attention's seq) makes a symbolic panel count, the last one partial
    mtiles, panels = (m + mr - 1) // mr, (n + nr - 1) // nr
    whole_panels = isinstance(n, int) and n % nr == 0
    if shifted_tail and not (isinstance(n, int) and n >= nr):
        raise IRError(f"gemm kernel: a shifted last panel needs a static N >= {nr}: {shape}")
    shift = shifted_tail and not whole_panels
    last_rows = m - (mtiles - 1) * mr  # rows of the last row tile
    many_tiles = not static_m or mtiles > 1
    # symbolic M: any row but the first may be past the end (M >= 1 when a tile runs)
    surplus_from = last_rows if static_m else 1
    acc_t = a.dtype  # accumulate in float32; the epilogue may cast
    two_pass = out.dtype == acc_t and _calls_a_library(epilogue, out.ndim, isa=isa)

    def tile(bflat: PrimExpr, panel: PrimExpr, mt: PrimExpr, part: _Segment | None = None,
             copied: Callable[[PrimExpr, PrimExpr], PrimExpr] | None = None) -> Stmt:
        """One register tile; `part`: only K's segment `part.k0 ..` of it, its sums
        started from (and, but in the last segment, left in) the partial sums; `copied`:
        reads B at `(k, v)` from the panel's copy."""
        head: list[Stmt] = []
        bidx = _unflatten(bflat, shape.batch, "i", head)
        a_batch = tuple(as_expr(i, INDEX_DTYPE)
                        for i in broadcast_index(bidx, shape.a_batch))
        a_pre = []
        for r in range(mr):
            row: PrimExpr = mt * mr + r if many_tiles else _c(r)
            if r >= surplus_from:  # the last tile's surplus rows read the last row
                row = min_(row, m - 1)
            rv = Var(f"m{r}", INDEX_DTYPE)
            head.append(LetStmt(rv, row))
            ridx = _unflatten(rv, shape.rows, f"r{r}_", head)
            a_pre.append((*a_batch, *ridx))
        a_rows = [(lambda kk, p=p: a[(*p, kk)]) for p in a_pre]
        b_row = ((lambda kk, v: b_at(bidx, panel, kk, v)) if copied is None
                 else copied)
        if part is None:
            acc, red = register_tile(mr, nr, shape.k, a_rows, b_row, acc_t, fused)
        else:
            sums, row0 = part.sums, part.row0
            acc, red = register_tile(
                mr, nr, part.k, a_rows, b_row, acc_t, fused, k0=part.k0,
                init=None if part.first else (lambda r, v: sums[row0 + r, v]))
            if not part.last:
                keep = lanes_loop("v", nr, lambda v: seq(*(
                    Store(sums, acc[_c(r), v], (row0 + r, v)) for r in range(mr))))
                return seq(*head, *red, keep)
        # Copied out at constant rows as whole vectors, the accumulators stay registers; the
        # stores below loop over `stage` (contiguous along the output row).
        stage = Buffer("stage", (mr, nr), acc_t, "local")
        copy = lanes_loop("v", nr, lambda v: seq(*(Store(stage, acc[_c(r), v], (_c(r), v))
                                                for r in range(mr))))
        n0 = panel * nr if not isinstance(panels, int) or panels > 1 else _c(0)
        width: PrimExpr = _c(nr) if whole_panels else min_(nr, n - n0)

        # the rows this tile stores: all but in the last tile
        rows_here: PrimExpr = (_c(mr) if static_m and last_rows == mr
                               else min_(mr, m - mt * mr))

        def store_loops(from_out: bool, apply: bool, cols: PrimExpr) -> Stmt:
            """The tile's `cols` columns stored row by row from `stage` (or `out` itself),
            through the epilogue when `apply`: one loop nest, so the epilogue is in the IR
            once per column count."""
            r, v = Var("r", INDEX_DTYPE), Var("v", INDEX_DTYPE)
            lets: list[Stmt] = []
            rv = Var("row", INDEX_DTYPE)
            lets.append(LetStmt(rv, mt * mr + r if many_tiles else r))
            idx = (*bidx, *_unflatten(rv, shape.rows, "o", lets), n0 + v)
            # a shifted last panel's columns are its upper lanes (`shifted_tail`)
            lane: PrimExpr = v + (_c(nr) - cols) if shift and not isinstance(cols, Const) \
                else v
            value: PrimExpr = out[idx] if from_out else stage[r, lane]
            # whole panels store as vectors when the epilogue allows (vector_loops)
            kind = "vectorized" if isinstance(cols, Const) else "serial"
            row = For(v, _c(0), cols, kind,
                      Store(out, epilogue(value, idx) if apply else value, idx))
            return For(r, _c(0), rows_here, "serial", seq(*lets, row))

        def panel_stores(from_out: bool, apply: bool) -> Stmt:
            """Whole panels store `nr` columns as vectors; a partial last panel (N no
            multiple of nr, or symbolic) stores the columns there are, one by one."""
            if isinstance(width, Const):
                return store_loops(from_out, apply, width)
            if isinstance(n, int) and n < nr:  # one partial panel
                return store_loops(from_out, apply, width)
            return IfThenElse(compare("ge", n - n0, _c(nr)),
                              store_loops(from_out, apply, _c(nr)),
                              store_loops(from_out, apply, width))

        if two_pass:
            # the sums are stored as they are, then the epilogue runs over the tile in L1
            # on its own: calls in it (exp) would otherwise spill the accumulators
            stores = [panel_stores(False, False), panel_stores(True, True)]
        else:
            stores = [panel_stores(False, True)]
        return seq(*head, *red, Allocate(stage), copy, *stores)

    if copy_panels and blocking is None and not by_rows and isinstance(shape.k, int):
        k_steps, group = shape.k, max(1, min(panel_group, panels if isinstance(panels, int)
                                             else 1))
        groups = -(-panels // group)

        def panel_tiles(bflat: PrimExpr, gi: PrimExpr) -> Stmt:
            copied = Buffer("panel", (group, k_steps, nr), acc_t, "local")
            lets: list[Stmt] = []
            bidx = _unflatten(bflat, shape.batch, "j", lets)
            kk, mt, j = Var("k", INDEX_DTYPE), Var("mt", INDEX_DTYPE), Var("pj", INDEX_DTYPE)
            here: PrimExpr = (_c(group) if panels % group == 0
                              else min_(group, panels - gi * group))
            first = gi * group if group > 1 else gi
            fill = For(j, _c(0), here, "serial", For(
                kk, _c(0), _c(k_steps), "serial", lanes_loop("v", nr, lambda v: Store(
                    copied, b_at(bidx, first + j, kk, v), (j, kk, v)))))
            return seq(Allocate(copied), *lets, fill, For(
                mt, _c(0), as_expr(mtiles, INDEX_DTYPE), "serial",
                For(j, _c(0), here, "serial", tile(
                    bflat, first + j, mt, copied=lambda kk, v: copied[j, kk, v]))))

        return seq(*prologue, parallel_when(lambda: parallel_tiles(
            (shape.batches, groups), panel_tiles), shape.madds, isa=isa))
    if blocking is None or not static_m or not isinstance(shape.k, int) \
            or shape.k <= blocking.kc:
        if by_rows:
            loop = parallel_when(lambda: parallel_tiles(
                (shape.batches, mtiles, panels), lambda bf, mt, p: tile(bf, p, mt)),
                shape.madds, isa=isa)
        else:
            loop = parallel_when(lambda: parallel_tiles((shape.batches, panels, mtiles), tile),
                                 shape.madds, isa=isa)
        return seq(*prologue, loop)
    per_block = max(1, blocking.mc // mr)  # row tiles per parallel tile
    mblocks = -(-mtiles // per_block)

    def blocked(bflat: PrimExpr, panel: PrimExpr, mb: PrimExpr) -> Stmt:
        sums = Buffer("sums", (per_block * mr, nr), acc_t, "local")
        tiles_here: PrimExpr = (_c(per_block) if mtiles % per_block == 0
                                else min_(per_block, mtiles - mb * per_block))
        kc, k = blocking.kc, shape.k
        blocks = -(-k // kc)

        def over_rows(k0: PrimExpr, steps: int, first: bool, last: bool) -> Stmt:
            j = Var("j", INDEX_DTYPE)
            seg = _Segment(sums, j * mr, k0, steps, first, last)
            return For(j, _c(0), tiles_here, "serial", tile(bflat, panel, mb * per_block + j,
                                                            seg))

        middle: list[Stmt] = []
        if blocks > 2:
            kb = Var("kb", INDEX_DTYPE)
            middle.append(For(kb, _c(1), _c(blocks - 2), "serial",
                              over_rows(kb * kc, kc, False, False)))
        return seq(Allocate(sums), over_rows(_c(0), kc, True, False), *middle,
                   over_rows(_c((blocks - 1) * kc), k - (blocks - 1) * kc, False, True))

    loop = parallel_when(lambda: parallel_tiles((shape.batches, panels, mblocks), blocked),
                         shape.madds, isa=isa)
    return seq(*prologue, loop)


@dataclass(frozen=True)
class _Segment:
    """K's steps `k0 .. k0 + k` of a K-blocked row tile, its partial sums at rows `row0`
    of `sums`; the `first` segment starts from zero, the `last` applies the epilogue."""

    sums: Buffer
    row0: PrimExpr
    k0: PrimExpr
    k: int
    first: bool
    last: bool


# Intrinsics that become instructions (the others are math library calls).
_INSTRUCTIONS = frozenset({"fma", "sqrt", "abs", "floor", "ceil", "round", "trunc", "isnan",
                           "isinf"})


def _calls_a_library(epilogue: Epilogue, ndim: int, *, isa: ISA) -> bool:
    """Whether the epilogue calls functions (a math library's erf, exp, ...). On a CPU
    target (`isa.kind`) the float32 exp/tanh/sigmoid/erf become arithmetic
    (kiln.transform.expand_math) that vectorizes in the one-pass store loop."""
    from kiln.ops.kernels.math import BUILDERS, CPU_KINDS

    expanded = isa.kind in CPU_KINDS
    zero = (_c(0),) * ndim
    probe = epilogue(Var("probe", "float32"), zero)
    return any(isinstance(e, CallExtern) or (
        isinstance(e, Intrin) and e.name not in _INSTRUCTIONS
        and not (expanded and e.name in BUILDERS and e.dtype == "float32"))
        for e in iter_exprs(probe))


def pack_b_at_run_time(b: Buffer, b_batch: tuple[int, ...], k: int, n: int, nr: int,
                       transposed: bool, *, isa: ISA
                       ) -> tuple[list[Stmt], BReader]:
    """Statements packing the activation `b` (`[*b_batch, k, n]`, or `[*b_batch, n, k]`
    when `transposed`) into a workspace `[prod(b_batch)][panels][k][nr]` (zero past n),
    and the reader of it (indexed by the output's batch index, broadcast to B's)."""
    panels = (n + nr - 1) // nr
    whole_panels = isinstance(n, int) and n % nr == 0
    bb = _prod(b_batch)
    ws = Buffer("b_packed", (bb, panels, k, nr), b.dtype)
    zero = as_expr(0.0, b.dtype)

    def panel_copy(bf: PrimExpr, p: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        bidx = _unflatten(bf, b_batch, "j", lets)
        n0 = p * nr if not isinstance(panels, int) or panels > 1 else _c(0)
        kx = as_expr(k, INDEX_DTYPE)

        def copy(width: PrimExpr) -> Stmt:
            kk, v = Var("k", INDEX_DTYPE), Var("v", INDEX_DTYPE)
            src = b[(*bidx, n0 + v, kk)] if transposed else b[(*bidx, kk, n0 + v)]
            put = Store(ws, src, (bf, p, kk, v))
            # transposed: B's rows run along k, so k is the inner loop of the copy
            body: Stmt = (For(v, _c(0), width, "serial", For(kk, _c(0), kx, "serial", put))
                          if transposed else
                          For(kk, _c(0), kx, "serial", For(v, _c(0), width, "serial", put)))
            if isinstance(width, Const):
                return body
            # the last panel's columns past n are zero
            kz, z = Var("k", INDEX_DTYPE), Var("z", INDEX_DTYPE)
            return seq(body, For(kz, _c(0), kx, "serial", For(
                z, width, _c(nr) - width, "serial", Store(ws, zero, (bf, p, kz, z)))))

        if whole_panels:
            return seq(*lets, copy(_c(nr)))
        partial = copy(min_(nr, n - n0))
        if isinstance(n, int) and n < nr:  # one partial panel
            return seq(*lets, partial)
        # whole panels copy `nr` columns (a constant extent the backend vectorizes)
        return seq(*lets, IfThenElse(compare("ge", n - n0, _c(nr)), copy(_c(nr)), partial))

    pack = parallel_when(lambda: parallel_tiles((bb, panels), panel_copy),
                         dim_product((bb, panels, k, nr)), "element", isa=isa)

    def read(oidx: tuple[PrimExpr, ...], p: PrimExpr, kk: PrimExpr, v: PrimExpr) -> PrimExpr:
        flat: PrimExpr = _c(0)
        for i, d in zip(broadcast_index(oidx, b_batch), b_batch):
            if not isinstance(d, int) or d > 1:
                flat = flat * d + as_expr(i, INDEX_DTYPE)
        return ws[flat, p, kk, v]

    return [Allocate(ws), pack], read
