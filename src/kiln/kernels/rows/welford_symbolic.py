"""layer_norm of a residual sum over a symbolic row count (batch x seq) in onnxruntime's
SkipLayerNormalization arithmetic (`layer_norm_welford_rows`), as a pinned build
computes it: a quantized BERT exported with its axes dynamic then feeds its next
DynamicQuantizeLinear onnxruntime's values bit for bit, as its pinned build does (with
another layer norm's rounding, some of those values round to the next integer step:
2e-2 from onnxruntime at the output, docs/performance.md).

The rows run in groups of `lanes` (`vector x WELFORD_VECTORS`) over the threads, the
last partial group on a narrower class of lanes (one or two vectors) when it fits, its
surplus lanes reading the last row and not storing. A group's input rows are held in a
buffer of its own for the statistics (no division per element; the output, written
once per element, stays vector code); a row's index over the symbolic dims is divided
out once per row.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
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
from kiln.kernels.rows.layer_norm_onnxruntime import WELFORD_VECTORS, layer_norm_welford_rows
from kiln.kernels.rows.loops import F32, RowLoops
from kiln.kernels.tiles import bound, parallel_when
from kiln.kernels.tiles import const as _c
from kiln.ops import te
from kiln.target.isa import ISA

Index = tuple[PrimExpr, ...]
#: Narrower lane classes (in vectors) the last partial group runs on when its rows fit:
#: a batch-1 sequence of 16 rows then runs 16 Welford chains (a division a step), not 64.
TAIL_VECTORS = (1, 2)


def symbolic_welford_groups(outer: tuple[int | PrimExpr, ...], n: int, vector: int,
                            eps: float, load_x: Callable[[Index], PrimExpr],
                            value: Callable[[Index, PrimExpr], PrimExpr], out: Buffer, *,
                            isa: ISA) -> Stmt:
    """The layer_norm rows of `out` (`[*outer, n]`, `outer` symbolic): `load_x(index)` is
    the input at an output index, `value(index, y)` the value stored for the normalized
    `y` there (the affine and any fused consumer)."""
    lets: list[Stmt] = []
    total = bound("rows", dim_product(outer), lets)
    lanes = vector * WELFORD_VECTORS
    groups = bound("groups", as_expr(total, INDEX_DTYPE) // lanes, lets)
    rest = bound("rest", as_expr(total, INDEX_DTYPE) - as_expr(groups, INDEX_DTYPE) * lanes,
                 lets)
    loops = RowLoops(n, min(vector, max(n, 1)))

    def group(base: PrimExpr, count: int, rows: int | PrimExpr, last: bool) -> Stmt:
        # the group's inputs in a buffer of its own: the statistics read it `n` apart
        # with no division, and it aliases nothing (the output stays vector code)
        held = Buffer("ln_rows", (count, n), F32, "global")

        def row_lets(row: PrimExpr, body: Callable[[Index], Stmt]) -> Stmt:
            # the row's index over the symbolic dims, divided out once for its elements
            names = [Var(f"o{k}", INDEX_DTYPE) for k in range(len(outer))]
            index = te.unflatten_index(base + row, tuple(outer))
            return seq(*(LetStmt(v, e) for v, e in zip(names, index)), body(tuple(names)))

        r = Var("r", INDEX_DTYPE)
        inputs = For(r, _c(0), as_expr(rows, INDEX_DTYPE), "serial", row_lets(
            r, lambda o: loops.each(lambda j, lane: Store(held, load_x((*o, j)), (r, j)))))

        def read(row: PrimExpr, k: PrimExpr) -> PrimExpr:
            # a surplus lane of the last group reads its last row
            return held[min_(row, as_expr(rows, INDEX_DTYPE) - 1) if last else row, k]

        def normalize(row: PrimExpr, mean: PrimExpr, std: PrimExpr) -> Stmt:
            return row_lets(row, lambda o: loops.each(lambda j, lane: Store(
                out, value((*o, j), (held[row, j] - mean) / std), (*o, j))))

        return seq(Allocate(held), inputs,
                   layer_norm_welford_rows(count, read, n, eps, normalize, rows))

    g = Var("g", INDEX_DTYPE)
    full = parallel_when(lambda: For(g, _c(0), as_expr(groups, INDEX_DTYPE), "parallel",
                                     group(g * lanes, lanes, lanes, False)),
                         as_expr(total, INDEX_DTYPE) * n, "element", isa=isa)
    base = as_expr(groups, INDEX_DTYPE) * lanes
    tail = group(base, lanes, rest, True)
    for k in reversed(TAIL_VECTORS):
        tail = IfThenElse(compare("le", as_expr(rest, INDEX_DTYPE), vector * k),
                          group(base, vector * k, rest, True), tail)
    return seq(*lets, full,
               IfThenElse(compare("gt", as_expr(rest, INDEX_DTYPE), 0), tail))
