"""One row of softmax or log_softmax, in three passes over the row (kiln.kernels.rows).

softmax: pass 1 the row max; pass 2 `e = exp(x - max)` stored into the output while
summing; pass 3, over the output only (in cache), `e * (1/sum)`. One `exp` per element
(an online max/sum in two passes would need three: two while rescaling the running
sum, one to normalize). Its lane sums are added up as onnxruntime's MLAS kernels add
theirs (`RowLoops.folded_sum`), its `exp` being MLAS's softmax exp too on CPU targets
(kiln.kernels.math.softmax_exp_f32: `x - max` clamped at -88.38, one `2^n`).

log_softmax: pass 1 the max; pass 2 the sum of `exp(x - max)`; pass 3
`x - max - log(sum)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.ir.tensor import Const, LetStmt, PrimExpr, Stmt, Store, Var, as_expr, intrin, seq
from kiln.kernels.math import CPU_KINDS, softmax_exp_f32
from kiln.kernels.rows.loops import F32, Reader, RowLoops, let
from kiln.ops import nan_order, te
from kiln.target.isa import ISA


def _row_max(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """max(a, b) that skips a NaN `b` (one `maxps`, against three instructions for the
    NaN-propagating `max`): a row with a NaN still gives NaN everywhere, through
    `exp(NaN - max)` in its sum."""
    return nan_order.max_keep_first(a, b)


def _softmax_exp(x: PrimExpr, lets: list[Stmt], *, isa: ISA) -> PrimExpr:
    """`exp(x)` of softmax's `x - max`: on a CPU target (`isa.kind`), float32, as
    onnxruntime's softmax computes it (kiln.kernels.math.softmax_exp_f32, its
    intermediate values let variables appended to `lets`); elsewhere the `exp` intrinsic."""

    if isa.kind not in CPU_KINDS or x.dtype != F32:
        return intrin("exp", x)

    def bind(e: PrimExpr) -> PrimExpr:
        if isinstance(e, (Var, Const)):
            return e
        v = Var(f"x{len(lets)}", e.dtype)
        lets.append(LetStmt(v, e))
        return v

    return softmax_exp_f32(x, fused=isa.fma, bind=bind)


def softmax_row(loops: RowLoops, read: Reader, out_at: Callable[[PrimExpr], Any],
                store: Callable[[PrimExpr, PrimExpr], Stmt], log: bool, *, isa: ISA) -> Stmt:
    """One row of softmax (or log_softmax): `read(j)` is the input element j,
    `store(j, v)` writes result element j (applying any epilogue), `out_at(j)` reads
    back what pass 2 stored (softmax only)."""
    if log:
        find_max, mx = _max_pass(loops, read)
        s, init_s = loops.accumulators("row_sum", as_expr(0.0, F32))
        pass2 = loops.each(lambda j, lane: Store(
            s, s[lane] + intrin("exp", read(j) - mx), (lane,)))
        log_sum, let_shift = let("log_sum", intrin("log", loops.folded_sum(s)))
        # (x - max) first: max + log_sum would round away the low bits of large inputs
        pass3 = loops.each(lambda j, lane: store(j, (read(j) - mx) - log_sum))
        return seq(find_max, *init_s, pass2, let_shift, pass3)

    def scale(inv: PrimExpr) -> Stmt:
        def scaled(j: PrimExpr, lane: PrimExpr) -> Stmt:
            buf, idx = out_at(j)
            return store(j, buf[idx] * inv)

        return loops.each(scaled)

    return softmax_exp_row(loops, read, out_at, scale, isa=isa)


def softmax_exp_row(loops: RowLoops, read: Reader, out_at: Callable[[PrimExpr], Any],
                    then: Callable[[PrimExpr], Stmt], *, isa: ISA) -> Stmt:
    """Softmax's first two passes over one row: `exp(x - max)` of each element `read(j)`
    stored at `out_at(j)`, then `then(inv)` with `inv` the reciprocal of their sum. The
    softmax is each stored value times `inv`: `then` scales them in place (softmax_row)
    or leaves that to whoever reads the row next."""
    find_max, mx = _max_pass(loops, read)
    s, init_s = loops.accumulators("row_sum", as_expr(0.0, F32))

    def exp_and_sum(j: PrimExpr, lane: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        e, let_e = let("e", _softmax_exp(read(j) - mx, lets, isa=isa))
        buf, idx = out_at(j)
        return seq(*lets, let_e, Store(buf, e, idx), Store(s, s[lane] + e, (lane,)))

    pass2 = loops.each(exp_and_sum)
    inv, let_inv = let("inv", as_expr(1.0, F32) / loops.folded_sum(s))
    return seq(find_max, *init_s, pass2, let_inv, then(inv))


def _max_pass(loops: RowLoops, read: Reader) -> tuple[Stmt, PrimExpr]:
    """The statements finding the row's max (bound to a let) and that let."""
    m, init_m = loops.accumulators("row_max", te.lowest_value(F32))
    pass1 = loops.each(lambda j, lane: Store(m, _row_max(m[lane], read(j)), (lane,)))
    mx, let_mx = let("mx", loops.combined(m, _row_max))
    return seq(*init_m, pass1, let_mx), mx
