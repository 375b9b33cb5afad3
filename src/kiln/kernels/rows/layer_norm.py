"""One row of layer_norm in three passes, its statistics in several vectors of
accumulators (kiln.kernels.rows).

Pass 1 the mean, shifted (`k + sum(x - k) / n`, `k` the row's first element; a row
whose sum overflows sums `x / n` again), pass 2 the sum of squared deviations from it
(two passes: float32 keeps its accuracy when the mean is large against the spread, and
rows whose squares overflow get onnxruntime's 0, not inf - inf), pass 3
`(x - mean) * rsqrt(var + eps) * scale + bias`; the sums in several vectors of
accumulators (independent add chains, `stat_loops`). The layer norms computed as
onnxruntime computes them are kiln.kernels.rows.layer_norm_onnxruntime's.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    IfThenElse,
    PrimExpr,
    Stmt,
    Store,
    as_expr,
    intrin,
    seq,
)
from kiln.kernels.rows.loops import F32, Reader, RowLoops, add, halving_sum, let
from kiln.kernels.tiles import const as _c

FLT_MAX = float.fromhex("0x1.fffffep+127")
#: Independent vector accumulators of a row's sums (latency: see stat_loops).
STAT_CHAINS = 4


def layer_norm_row(loops: RowLoops, read: Reader, store: Callable[[PrimExpr, PrimExpr], Stmt],
                   affine: Callable[[PrimExpr, PrimExpr], PrimExpr], eps: float,
                   fused: bool = False, stats: RowLoops | None = None) -> Stmt:
    """One row of layer_norm in three passes, like onnxruntime's kernel: the mean, the sum
    of squared deviations from it, then `affine(j, (x - mean) * rstd)` (scale and bias of
    normalized element j). `stats`: the loops of the two sums (more lanes than `loops`:
    independent add chains); `fused`: multiply-adds.

    The mean is `k + sum(x - k) / n`, `k` the row's first element (float32 keeps its
    digits when the mean is far from zero against the spread); a row whose sum
    overflows (+-3e38) sums `x / n` again instead (`_scaled_mean`). The variance is the
    sum over `n`, infinite when the squares overflow: then every normalized value is 0,
    as onnxruntime's. A row holding inf or NaN gives NaN."""
    stats = stats or loops
    n = as_expr(float(loops.n), F32) if isinstance(loops.n, int) else Cast(F32, loops.n)
    k, let_k = let("k", read(_c(0)))
    s1, init1 = stats.accumulators("sum", as_expr(0.0, F32))
    s2, init2 = stats.accumulators("sum_sq", as_expr(0.0, F32))
    pass1 = stats.each(lambda j, lane: Store(s1, s1[lane] + (read(j) - k), (lane,)))
    mean_at = Buffer("mean", (1,), F32, "local")
    total, let_total = let("total", _lane_sum(stats, s1))
    # only finite rows overflow to +-inf here (inf or NaN in the row makes the sum NaN)
    overflow = intrin("abs", total) > as_expr(FLT_MAX, F32)
    shifted = seq(Allocate(mean_at), Store(mean_at, k + total / n, (_c(0),)),
                  IfThenElse(overflow, _scaled_mean(stats, read, n, mean_at, fused)))
    mean, let_mean = let("m", mean_at[_c(0)])

    def add_square(j: PrimExpr, lane: PrimExpr) -> Stmt:
        d, let_d = let("d", read(j) - mean)
        return seq(let_d, Store(s2, _mul_add(d, d, s2[lane], fused), (lane,)))

    var = _lane_sum(stats, s2) / n
    rstd, let_rstd = let("rstd", intrin("rsqrt", var + as_expr(eps, F32)))
    pass3 = loops.each(lambda j, lane: store(j, affine(j, (read(j) - mean) * rstd)))
    return seq(let_k, *init1, pass1, let_total, shifted, let_mean, *init2,
               stats.each(add_square), let_rstd, pass3)


def _scaled_mean(stats: RowLoops, read: Reader, n: PrimExpr, mean_at: Buffer,
                 fused: bool) -> Stmt:
    """`mean_at[0] = sum(x / n)`: a row's mean where the sum of `x` overflows."""
    inv_n, let_inv_n = let("inv_n", as_expr(1.0, F32) / n)
    acc, init = stats.accumulators("sum_scaled", as_expr(0.0, F32))
    step = stats.each(lambda j, lane: Store(acc, _mul_add(read(j), inv_n, acc[lane], fused),
                                            (lane,)))
    return seq(let_inv_n, *init, step, Store(mean_at, _lane_sum(stats, acc), (_c(0),)))


def _lane_sum(loops: RowLoops, acc: Buffer) -> PrimExpr:
    """The sum of `loops`' accumulators: a power of two of them upper half onto lower, as
    vector registers add (one vector add per level), others pairwise."""
    if loops.lanes & (loops.lanes - 1) == 0:
        return halving_sum(acc, loops.lanes)
    return loops.combined(acc, add)


def _mul_add(a: PrimExpr, b: PrimExpr, c: PrimExpr, fused: bool) -> PrimExpr:
    return intrin("fma", a, b, c) if fused else a * b + c


def stat_loops(n: int | PrimExpr, lanes: int) -> RowLoops:
    """The loops of a row's sums: `STAT_CHAINS` vectors of `lanes` accumulators where the
    row holds them without a longer scalar tail, so that many independent add chains
    hide the adds' latency (one chain of `lanes` makes each sum latency-bound)."""
    if not isinstance(n, int):
        return RowLoops(n, lanes)
    chains = next(k for k in (STAT_CHAINS, 2, 1) if k == 1 or (
        n >= k * lanes and n % (k * lanes) < lanes))
    return RowLoops(n, lanes * chains)

