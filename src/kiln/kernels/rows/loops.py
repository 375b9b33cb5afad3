"""The loops of the row kernels: over one row's elements in vector chunks (`RowLoops`,
with its stack accumulators) and over the rows (`Rows`), plus the small statement
helpers the kernels share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.ir.attrs import ATTR_PARALLEL_DECIDED, ATTR_ROW_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
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
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import parallel_when
from kiln.ops import te
from kiln.target.isa import ISA

#: The dtype every row kernel computes in.
F32 = "float32"

#: Rows of a symbolic row count's innermost row dim in one chunk of its parallel loop:
#: the divisions recovering a chunk's index are paid once per this many rows.
ROW_CHUNK = 8

#: The row's element j (an index expression), as a kernel reads it.
Reader = Callable[[PrimExpr], PrimExpr]


def tree(values: Sequence[PrimExpr], combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
         ) -> PrimExpr:
    """`values` combined pairwise (a balanced tree: shallow, and sums stay accurate)."""
    items = list(values)
    while len(items) > 1:
        items = [combine(items[k], items[k + 1]) if k + 1 < len(items) else items[k]
                 for k in range(0, len(items), 2)]
    return items[0]


def add(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`a + b` (a combiner of `tree`)."""
    return a + b


def bind_zero(var: Var, body: Stmt) -> Stmt:
    """`body` with `var` bound to 0 (a loop of one iteration left out)."""
    return seq(LetStmt(var, _c(0)), body)


def let(name: str, value: PrimExpr) -> tuple[Var, Stmt]:
    """A new variable `name` and the statement binding it to `value`."""
    v = Var(name, value.dtype)
    return v, LetStmt(v, value)


@dataclass(frozen=True)
class RowLoops:
    """Loops over one row of `n` elements in chunks of `lanes` (vectorized) plus a tail;
    `n` may be symbolic (a dim scalar of the kernel): then so are the loop extents."""

    n: int | PrimExpr
    lanes: int

    def each(self, body: Callable[[PrimExpr, PrimExpr], Stmt]) -> Stmt:
        """`body(j, lane)` for every element j of the row, lane = j's accumulator."""
        if not isinstance(self.n, int):
            n = as_expr(self.n, INDEX_DTYPE)
            c, lane, t = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE), Var("t", INDEX_DTYPE)
            count, let_count = let("chunks", n // self.lanes)
            vector = For(lane, _c(0), _c(self.lanes), "vectorized",
                         body(c * self.lanes + lane, lane))
            # the tail has fewer than `lanes` elements: the bound says so to `parallelize`
            rest = For(t, _c(0), min_(self.lanes - 1, n - count * self.lanes), "serial",
                       body(t + count * self.lanes, t))
            return seq(let_count, For(c, _c(0), count, "serial", vector), rest)
        chunks, tail = divmod(self.n, self.lanes)
        parts: list[Stmt] = []
        if chunks:
            c, lane = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE)
            inner = For(lane, _c(0), _c(self.lanes), "vectorized",
                        body(c * self.lanes + lane, lane))
            parts.append(For(c, _c(0), _c(chunks), "serial", inner) if chunks > 1 else
                         bind_zero(c, inner))
        if tail:
            lane = Var("t", INDEX_DTYPE)
            parts.append(For(lane, _c(0), _c(tail), "serial",
                             body(lane + chunks * self.lanes, lane)))
        return seq(*parts)

    def accumulators(self, name: str, init: PrimExpr) -> tuple[Buffer, list[Stmt]]:
        """A stack array of one accumulator per lane, and the statements setting it."""
        acc = Buffer(name, (self.lanes,), init.dtype, "local")
        lane = Var("l", INDEX_DTYPE)
        return acc, [Allocate(acc), For(lane, _c(0), _c(self.lanes), "vectorized",
                                        Store(acc, init, (lane,)))]

    def combined(self, acc: Buffer, combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
                 ) -> PrimExpr:
        return tree([acc[_c(k)] for k in range(self.lanes)], combine)

    def folded_sum(self, acc: Buffer) -> PrimExpr:
        """The lanes' sum in the order of onnxruntime's MLAS softmax kernels, so equal lane
        sums give its row sum bit for bit: AVX-512 (16 lanes) adds the upper half of the
        vector onto the lower half, then neighbours pairwise (its `vhaddps`); AVX2 (8
        lanes, MlasComputeSumExpF32KernelFma3) neighbours pairwise from the start (two
        `vhaddps`, then the two 128-bit halves)."""
        lanes: list[PrimExpr] = [acc[_c(k)] for k in range(self.lanes)]
        if self.lanes > 8:
            half = self.lanes // 2
            lanes = [lanes[k] + lanes[k + half] for k in range(half)]
        return tree(lanes, add)


def halving_sum(acc: Buffer, lanes: int) -> PrimExpr:
    """The lanes' sum as a vector register is reduced: the upper half added onto the lower
    until one lane is left (`(a0 + a2) + (a1 + a3)` for 4 lanes)."""
    items: list[PrimExpr] = [acc[_c(k)] for k in range(lanes)]
    while len(items) > 1:
        half = len(items) // 2
        items = [items[k] + items[k + half] for k in range(half)]
    return items[0]


def row_index(flat: PrimExpr, outer: Sequence[int]) -> tuple[PrimExpr, ...]:
    """The index of row `flat` (< the row count) over the static dims `outer`: like
    te.unflatten_index, without the remainder for the outermost dim of more than one
    row (a BERT's (1, 128) rows are (0, flat), a plain stride the loads vectorize on)."""
    index = list(te.unflatten_index(flat, outer))
    lead = next((k for k, d in enumerate(outer) if d > 1), None)
    if lead is not None:
        index[lead] = flat // math.prod(outer[lead + 1:]) if lead + 1 < len(outer) else flat
    return tuple(index)


@dataclass(frozen=True)
class Rows:
    """The loop nest over the rows (`outer`, the dims before the reduced ones), loops of
    extent 1 left out. Static loops are `serial`; each row writes its own slice of the
    output, so the `parallelize` pass splits them over threads when the work pays for a
    launch (its `min_work`). Symbolic row counts: see `around`."""

    outer: tuple[int | PrimExpr, ...]
    row_work: int | PrimExpr = 1  # elements of one row (a symbolic row count's loop)

    def around(self, row: Callable[[tuple[PrimExpr, ...]], Stmt], *, isa: ISA) -> Stmt:
        """The loops over every row around `row(index)`, the statements of one row."""
        if all(isinstance(d, int) for d in self.outer):
            index_vars = [Var(f"i{k}", INDEX_DTYPE) for k in range(len(self.outer))]
            body = row(tuple(v if _loops(d) else _c(0)
                             for v, d in zip(index_vars, self.outer)))
            for v, d in reversed(list(zip(index_vars, self.outer))):
                if _loops(d):
                    body = For(v, _c(0), as_expr(d, INDEX_DTYPE), "serial", body)
            return body
        # Symbolic row counts: one parallel loop over chunks of ROW_CHUNK rows of the
        # innermost row dim, across the outer ones (the outermost, which threads would
        # split, may be 1 at run time: a batch of one), and in each chunk a plain loop
        # over its rows. The divisions that recover the chunk's index run once a chunk,
        # not once a row (two or three `idiv` a row cost a BERT's softmax over 128-long
        # rows a fifth of its time). Rows are independent; `parallelize` cannot see it
        # through those divisions, so the loop is marked here, and taken only when the
        # rows hold enough work (`parallel_when`).
        count = dim_product(self.outer)
        return parallel_when(lambda: self._chunked(row), count * self.row_work, "element",
                             isa=isa)

    def _chunked(self, row: Callable[[tuple[PrimExpr, ...]], Stmt]) -> For:
        """The parallel loop over row chunks (see `around`)."""
        *lead, last = self.outer
        size = min(ROW_CHUNK, last) if isinstance(last, int) else ROW_CHUNK
        chunks = (as_expr(last, INDEX_DTYPE) + (size - 1)) // size
        p, i = Var("chunk", INDEX_DTYPE), Var(f"i{len(lead)}", INDEX_DTYPE)
        lets: list[Stmt] = []
        index: list[PrimExpr] = []
        c, let_c = let("c0", p % chunks if lead else p)
        outer = p // chunks
        for k, (e, d) in enumerate(zip(te.unflatten_index(outer, lead), lead)):
            v = Var(f"i{k}", INDEX_DTYPE)
            if _loops(d):
                lets.append(LetStmt(v, e))
            index.append(v if _loops(d) else _c(0))
        first = c * size
        inner = For(i, first, min_(as_expr(size, INDEX_DTYPE), last - first), "serial",
                    row((*index, i)))
        return For(p, _c(0), as_expr(dim_product(lead), INDEX_DTYPE) * chunks, "parallel",
                   seq(let_c, *lets, inner))


def row_kernel_attrs(op: str, outer: Sequence[int | PrimExpr]) -> dict[str, object]:
    """The attributes of the row kernel of `op` over rows `outer`: with a symbolic row
    count, its builder chose the parallel loop by the work at run time (`Rows.around`,
    `parallel_when`), so the parallelize pass leaves it: else it would split the serial
    copy meant for a few rows (a parallel launch per chunk of 8 rows)."""
    if all(isinstance(d, int) for d in outer):
        return {ATTR_ROW_KERNEL: op}
    return {ATTR_ROW_KERNEL: op, ATTR_PARALLEL_DECIDED: True}


def _loops(d: int | PrimExpr) -> bool:
    """Whether a row dim needs a loop: more than one row, or a symbolic count (a dim
    scalar of the kernel)."""
    return not isinstance(d, int) or d > 1
