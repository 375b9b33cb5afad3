"""The GEMM micro-kernel (float32): register tiles over packed B panels.

`C = A @ B` is cut into register tiles of `mr` rows x `nr` columns (`GemmTiling`,
`choose_gemm_tiling`). B is read as panels `[ceil(N / nr)][K][nr]`
(kiln.ops.gemm.pack_b, zero-padded past N): for each `k` one tile step
(`register_tile`) loads one contiguous `nr`-wide row of the panel and broadcasts one
A value per row (A is read in place, row-major), then issues `mr * nr` multiply-adds
into an accumulator array read and written at constant indices only, so LLVM keeps
it in vector registers (onnxruntime's MLAS SGEMM kernels, IREE's mmt4d micro-kernels
and oneDNN's brgemm all hold such a tile). A constant B is packed at compile time
(kiln.transform.matmul_blocking); a B that is an activation (attention's Q @ K^T and
P @ V) is packed into a workspace at run time (kiln.kernels.gemm.run_time_pack).

Remainders need no second tile: the last row tile's surplus rows read the last
row of A and store nothing, the last panel's surplus columns multiply B's zero
padding and are not stored. Each output value passes through
`epilogue(value, index)` as it is stored (bias, activation, residual add: the
elementwise ops FuseOps grouped after the product). The tiles of all products
(batch x panel x row tile, panel-major so that a thread's consecutive tiles
reuse one B panel from L2; batch x row tile x panel when B's panels fit L2,
kiln.kernels.gemm.schedule.rows_first) form one `parallel` loop, split evenly over
threads (kiln.kernels.gemm.loop_nest).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from kiln.errors import IRError
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Const,
    For,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    seq,
)
from kiln.kernels.gemm.knobs import GemmTiling, k_unroll
from kiln.kernels.tiles import lanes_loop, madd

# A tile's accumulators: enough independent chains to hide the FMA latency of two
# pipes; more only grows the unrolled IR (compile time).
MIN_ACCUMULATORS = 8
MAX_ACCUMULATORS = 16


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


def unflatten(flat: PrimExpr, dims: Sequence[int], name: str,
              lets: list[Stmt]) -> tuple[PrimExpr, ...]:
    """The index into `dims` of the row-major flat index `flat` (bound once in `lets`).
    Among symbolic dims, leading dims of 1 take index 0 without a division (a recurrent
    step's rows `[1, batch]`: the row itself, not its remainder by `batch`)."""
    if len(dims) <= 1:
        return (flat,) if dims else ()
    units = 0
    while units < len(dims) - 1 and isinstance(dims[units], int) and dims[units] == 1:
        units += 1
    if units and not all(isinstance(d, int) for d in dims):
        return (*(_c(0),) * units, *unflatten(flat, dims[units:], name, lets))
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
                  k0: PrimExpr | int = 0,
                  also: Callable[[PrimExpr], Sequence[Stmt]] | None = None
                  ) -> tuple[Buffer, list[Stmt]]:
    """The micro-kernel: `acc[r, v] = init(r, v) + sum over k0 <= kk < k0 + k of
    a_rows[r](kk) * b_row(kk, v)` (`init` zero when None); `also(kk)`: statements each
    step runs after its multiply-adds (prefetches).

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

        return seq(*lets, lanes_loop("v", nr, lane), *(also(kk) if also else ()))

    stmts.append(reduction_loop("k", k0, k, k_unroll(), step))
    return acc, stmts


#: K's interleaved partial sums in a one-row tile (`row_tile`): a tile of one row has
#: one multiply-add chain per vector, bound by the FMA latency; four chains cover it.
ROW_SPLITS = 4


def row_splits(rows: int) -> int:
    """The partial sums `row_tile` deals K to for a tile of `rows` rows: `ROW_SPLITS`
    chains per vector over the rows (4 for one row, 2 for two, none past that)."""
    return max(1, ROW_SPLITS // rows)


def row_tile(nr: int, k: int, a_rows: Sequence[Callable[[PrimExpr], PrimExpr]],
             b_row: Callable[[PrimExpr, PrimExpr], PrimExpr], dtype: str, fused: bool,
             splits: int = ROW_SPLITS) -> tuple[Buffer, list[Stmt]]:
    """`register_tile` of a few rows (`acc[len(a_rows)][nr]`), K's steps dealt
    round-robin to `splits` partial sums per row added at the end (the rows of a
    symbolic M left after the full tiles, kiln.kernels.gemm.loop_nest: batch 1's one
    row, batch 2's two). The sums are rounded in another order than
    `register_tile`'s, as any other tile's are."""
    mr = len(a_rows)
    parts = Buffer("parts", (splits * mr, nr), dtype, "local")
    acc = Buffer("acc", (mr, nr), dtype, "local")
    zero = as_expr(0.0, dtype)
    stmts: list[Stmt] = [Allocate(parts), Allocate(acc), lanes_loop("v", nr, lambda v: seq(
        *(Store(parts, zero, (_c(p), v)) for p in range(splits * mr))))]

    def step(k0: PrimExpr, count: int) -> Stmt:
        xs = [[Var(f"a{r}_{s}", dtype) for s in range(count)] for r in range(mr)]
        lets: list[Stmt] = [LetStmt(xs[r][s], a_rows[r](k0 + s))
                            for r in range(mr) for s in range(count)]
        return seq(*lets, lanes_loop("v", nr, lambda v: seq(*(
            Store(parts, madd(parts[_c(s * mr + r), v], xs[r][s], b_row(k0 + s, v), fused),
                  (_c(s * mr + r), v))
            for s in range(count) for r in range(mr)))))

    whole, rest = divmod(k, splits)
    ko = Var("ko", INDEX_DTYPE)
    stmts.append(For(ko, _c(0), _c(whole), "serial", step(ko * splits, splits)))
    if rest:
        stmts.append(step(_c(whole * splits), rest))

    def total(v: PrimExpr) -> Stmt:
        out: list[Stmt] = []
        for r in range(mr):
            sums: list[PrimExpr] = [parts[_c(s * mr + r), v] for s in range(splits)]
            while len(sums) > 1:  # pairwise: (p0 + p1) + (p2 + p3)
                sums = [sums[i] + sums[i + 1] if i + 1 < len(sums) else sums[i]
                        for i in range(0, len(sums), 2)]
            out.append(Store(acc, sums[0], (_c(r), v)))
        return seq(*out)

    stmts.append(lanes_loop("v", nr, total))
    return acc, stmts


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
