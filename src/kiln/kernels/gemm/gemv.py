"""The matrix-vector kernel (float32): `out[n] = sum over k of a[k] * B[n, k]`, B read in place.

A dense layer at batch 1 (ONNX `Gemm(transB=1)` with one row of A) reads its
weight `B [N][K]` exactly as stored: nothing is packed at compile time, so the
weights stay the importer's arrays (kiln.codegen.constants then writes them out
without a copy). Each tile takes `GEMV_ROWS` rows of B and walks K in vector-wide
steps: one A vector per step, one B vector and one multiply-add per row into
`GEMV_ROWS x GEMV_VECTORS` vector accumulators (read and written at constant rows
only, so they stay registers), then sums each row's lanes and K's remainder and
stores the row through the epilogue. Rows stream B once, contiguously, like the
packed GEMM kernel's panels; the tiles form one `parallel` loop.
"""

from __future__ import annotations

from kiln.errors import IRError
from kiln.ir.dtype import INDEX_DTYPE
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
    min_,
    seq,
)
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import Epilogue, lanes_loop, madd, parallel_tiles
from kiln.target.isa import ISA

# Rows of B per tile and vectors per row: 4 x 2 = 8 independent accumulator chains
# keep both FMA pipes busy; with the A vectors and a B load they fit 16 registers.
GEMV_ROWS = 4
GEMV_VECTORS = 2


def _c(v: int) -> Const:
    return Const(v, INDEX_DTYPE)


def lane_sums(stage: Buffer, rows: int, width: int) -> list[Stmt]:
    """Sum each row of `stage` (`rows x width`) into its lane 0 by halving: every step
    adds the upper half of the live lanes onto the lower as one vector operation, so a
    row takes log2(width) dependent adds instead of `width` (the rows' sums are
    independent chains)."""
    out: list[Stmt] = []
    live = width
    while live > 1:
        half = live // 2
        if live % 2:  # the odd last lane first, onto lane 0
            out.append(seq(*(Store(stage, stage[_c(r), _c(0)] + stage[_c(r), _c(live - 1)],
                                   (_c(r), _c(0))) for r in range(rows))))

        def fold(v: PrimExpr, h: int = half) -> Stmt:
            return seq(*(Store(stage, stage[_c(r), v] + stage[_c(r), v + h], (_c(r), v))
                         for r in range(rows)))
        out.append(lanes_loop("v", half, fold))
        live = half
    return out


def gemv_body(k: int, n: int, a: Buffer, b: Buffer, out: Buffer, epilogue: Epilogue,
              lanes: int, fused: bool = True, *, isa: ISA) -> Stmt:
    """The loop nest of `out = epilogue(a @ B^T)`: `a` is `[1, ..., 1, k]`, `b` is
    `[n, k]` (row-major, read in place), `out` is `[1, ..., 1, n]`."""
    if k < 1 or n < 1:
        raise IRError(f"gemv kernel: empty product of {k} x {n}")
    width = min(GEMV_VECTORS * lanes, k)  # K's step: the lanes of one accumulator row
    steps, rest = divmod(k, width)
    rows = min(GEMV_ROWS, n)
    tiles = -(-n // rows)
    last_rows = n - (tiles - 1) * rows
    dtype = a.dtype
    a_lead = (_c(0),) * (a.ndim - 1)
    out_lead = (_c(0),) * (out.ndim - 1)

    def tile(t: PrimExpr) -> Stmt:
        head: list[Stmt] = []
        row_vars = []
        for r in range(rows):
            row: PrimExpr = t * rows + r if tiles > 1 else _c(r)
            if r >= last_rows:  # the last tile's surplus rows reread B's last row
                row = min_(row, n - 1)
            rv = Var(f"n{r}", INDEX_DTYPE)
            head.append(LetStmt(rv, row))
            row_vars.append(rv)
        acc = Buffer("acc", (rows, width), dtype, "local")
        zero = as_expr(0.0, dtype)
        body: list[Stmt] = [Allocate(acc), lanes_loop("v", width, lambda v: seq(*(
            Store(acc, zero, (_c(r), v)) for r in range(rows))))]

        step = Var("s", INDEX_DTYPE)
        k0 = Var("k0", INDEX_DTYPE)

        def lane(v: PrimExpr) -> Stmt:
            av = Var("a", dtype)
            return seq(LetStmt(av, a[(*a_lead, k0 + v)]), *(
                Store(acc, madd(acc[_c(r), v], b[row_vars[r], k0 + v], av, fused), (_c(r), v))
                for r in range(rows)))

        body.append(For(step, _c(0), _c(steps), "serial",
                        seq(LetStmt(k0, step * width), lanes_loop("v", width, lane))))
        # Copied out at constant rows as whole vectors, the accumulators stay registers
        # (a narrower access would spill them); K's remainder and the lane sums work on
        # the copy.
        stage = Buffer("stage", (rows, width), dtype, "local")
        body += [Allocate(stage), lanes_loop("v", width, lambda v: seq(*(
            Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(rows))))]
        if rest:  # one step over the first `rest` lanes
            def tail(v: PrimExpr) -> Stmt:
                kk = steps * width + v
                return seq(*(Store(stage, madd(stage[_c(r), v], b[row_vars[r], kk],
                                               a[(*a_lead, kk)], fused), (_c(r), v))
                             for r in range(rows)))
            body.append(lanes_loop("v", rest, tail))
        body += lane_sums(stage, rows, width)
        j = Var("r", INDEX_DTYPE)
        first: PrimExpr = t * rows if tiles > 1 else _c(0)
        here: PrimExpr = _c(rows) if last_rows == rows else min_(rows, n - first)
        idx = (*out_lead, first + j)
        body.append(For(j, _c(0), here, "serial",
                        Store(out, epilogue(stage[j, _c(0)], idx), idx)))
        return seq(*head, *body)

    loop = parallel_tiles((tiles,), tile)
    # each weight is read once: the product streams B (n x k values) from cache
    if not worth_parallel(n * k, "stream", isa=isa) and isinstance(loop, For):
        loop = For(loop.var, loop.start, loop.extent, "serial", loop.body)
    return loop
