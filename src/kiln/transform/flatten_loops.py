"""FlattenLoops: collapse a perfect nest of elementwise loops into one loop.

An elementwise kernel lowered from a tensor expression keeps one loop per dimension,
so on an NCHW tensor of [1, 64, 7, 7] the loop LLVM vectorizes runs 7 times: a
partial vector or a scalar remainder per row. When the innermost loops of a perfect
nest walk every buffer they touch row-major and contiguously, they are one loop over
the product of their extents, reading and writing flattened views of the same memory
(`DeclBuffer`s with the trailing dimensions merged).

The trailing `k` loops of a perfect nest collapse when they are `serial`, start at 0
(the outermost of them: at any constant) and have constant extents, the nest's body is
stores and lets only, and every buffer access in it either has the `k` loop variables,
in order, as its last `k` indices over dimensions of the same sizes (and none of them
among its leading indices), or uses none of them (a broadcast operand, e.g. a
per-channel bias [1, C, 1, 1]). The outermost of the `k` may also be indexed `i + c`
or `i - c` over a dimension of any size: one piece of a concatenation (PartitionLoops)
writes channels [c, c + n) of the output, a contiguous run at a constant offset. A loop
variable anywhere else (inside an index expression, in a value, a condition) leaves
the nest alone, as do symbolic extents, buffers passed to externs and products of
extents the loop variable's type cannot hold. The largest
qualifying `k` is taken (often the whole tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np

from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import StmtExprMutator, StmtExprVisitor, StmtMutator
from kiln.transform.partition_loops import index_offset
from kiln.transform.pass_base import FunctionPass


@dataclass(frozen=True)
class FlattenLoops(FunctionPass):
    """Collapse perfect nests of contiguous elementwise loops (see the module)."""

    name = "flatten-loops"
    level = "tensor"

    def run_on_function(self, func: t.PrimFunc, name: str, mod: IRModule) -> t.PrimFunc:
        body = _Flattener().visit_stmt(func.body)
        return func if body is func.body else func.with_body(body)


def _nest(s: t.For) -> tuple[list[t.For], t.Stmt]:
    """The loops of the perfect nest rooted at `s`, outermost first, and its body."""
    loops = [s]
    body = s.body
    while True:
        if isinstance(body, t.SeqStmt) and len(body.body) == 1:
            body = body.body[0]
        if not isinstance(body, t.For):
            return loops, body
        loops.append(body)
        body = body.body


def _plain_body(s: t.Stmt) -> bool:
    """Whether `s` is stores and lets only."""
    if isinstance(s, t.SeqStmt):
        return all(_plain_body(x) for x in s.body)
    return isinstance(s, (t.Store, t.LetStmt))


def _const_extent(loop: t.For, *, outer: bool = False) -> int | None:
    """The extent of a serial loop of constant bounds starting at 0 (`outer`: at any
    constant), else None."""
    if (loop.kind == "serial" and isinstance(loop.start, t.Const)
            and isinstance(loop.start.value, int) and (outer or loop.start.value == 0)
            and isinstance(loop.extent, t.Const) and isinstance(loop.extent.value, int)):
        return int(loop.extent.value)
    return None


class _Accesses(StmtExprVisitor):
    """Whether every use of `loop_vars` in a body is a contiguous trailing access."""

    def __init__(self, loop_vars: tuple[t.Var, ...], extents: tuple[int, ...]) -> None:
        self.vars, self.extents = loop_vars, extents
        self.ok = True
        self.flat: set[t.Buffer] = set()  # accessed through the loop variables
        self.plain: set[t.Buffer] = set()  # accessed otherwise

    def _access(self, buf: t.Buffer, indices: tuple[t.PrimExpr, ...]) -> None:
        k = len(self.vars)
        tail = indices[len(indices) - k:] if len(indices) >= k else ()
        if len(tail) == k and index_offset(tail[0], self.vars[0]) is not None \
                and all(a is v for a, v in zip(tail[1:], self.vars[1:])) \
                and isinstance(buf.shape[len(buf.shape) - k], int) \
                and tuple(buf.shape[len(buf.shape) - k + 1:]) == self.extents[1:]:
            self.flat.add(buf)
            lead = indices[:len(indices) - k]
        else:
            self.plain.add(buf)
            lead = indices
        for e in lead:
            self.visit_expr(e)

    def visit_load(self, e: t.Load) -> None:
        self._access(e.buffer, e.indices)

    def visit_store(self, s: t.Store) -> None:
        self._access(s.buffer, s.indices)
        self.visit_expr(s.value)

    def visit_var(self, e: t.Var) -> None:
        if any(e is v for v in self.vars):
            self.ok = False

    def visit_buffer_use(self, b: t.Buffer) -> None:
        self.plain.add(b)


class _Rewrite(StmtExprMutator):
    """Accesses of the flattened buffers through their views at index `var` (plus the
    outermost merged loop's start and offset times the rows under it)."""

    def __init__(self, views: dict[t.Buffer, t.Buffer], loops: list[t.For], var: t.Var,
                 inner: int) -> None:
        self.views, self.k, self.var, self.inner = views, len(loops), var, inner
        self.outer = loops[0]

    def _indices(self, indices: tuple[t.PrimExpr, ...]) -> tuple[t.PrimExpr, ...]:
        lead = tuple(self.visit_expr(e) for e in indices[:len(indices) - self.k])
        offset = index_offset(indices[len(indices) - self.k], self.outer.var)
        assert offset is not None and isinstance(self.outer.start, t.Const)
        rows = (offset + int(self.outer.start.value)) * self.inner
        if rows == 0:
            return (*lead, self.var)
        return (*lead, t.BinaryOp("add", self.var, t.Const(rows, self.var.dtype)))

    def visit_load(self, e: t.Load) -> t.PrimExpr:
        view = self.views.get(e.buffer)
        if view is None:
            return self.generic_visit(e)
        return t.Load(view, self._indices(e.indices))

    def visit_store(self, s: t.Store) -> t.Stmt:
        view = self.views.get(s.buffer)
        if view is None:
            return self.generic_visit(s)
        return t.Store(view, self.visit_expr(s.value), self._indices(s.indices))


def _collapse(loops: list[t.For], body: t.Stmt) -> t.Stmt | None:
    """The nest with its longest collapsible run of trailing loops merged, or None."""
    for first in range(len(loops) - 1):
        inner = loops[first:]
        extents = tuple(_const_extent(lp, outer=j == 0) for j, lp in enumerate(inner))
        if any(e is None for e in extents):
            continue
        sizes = tuple(int(e) for e in extents if e is not None)
        loop_vars = tuple(lp.var for lp in inner)
        acc = _Accesses(loop_vars, sizes)
        acc.visit_stmt(body)
        if not acc.ok or acc.flat & acc.plain or not acc.flat:
            continue
        k, total, rows = len(inner), prod(sizes), prod(sizes[1:])
        # each view spans the buffer's whole outermost merged dimension (a loop may
        # cover part of it: a concat's input piece writes its own channels)
        spans = {b: int(b.shape[b.ndim - k]) * rows for b in acc.flat}
        if max(spans.values()) > np.iinfo(inner[0].var.dtype).max:  # would overflow
            continue
        var = t.Var(inner[0].var.name, inner[0].var.dtype)
        views = {b: t.Buffer(b.name + "_flat", (*b.shape[:b.ndim - k], spans[b]), b.dtype,
                             b.scope)
                 for b in sorted(acc.flat, key=lambda b: b.name)}
        stmt: t.Stmt = t.For(var, t.Const(0, var.dtype), t.Const(total, var.dtype), "serial",
                             _Rewrite(views, inner, var, rows).visit_stmt(body))
        for lp in reversed(loops[:first]):
            stmt = replace(lp, body=stmt)
        decls = [t.DeclBuffer(view, b, 0) for b, view in views.items()]
        return t.SeqStmt((*decls, stmt))
    return None


class _Flattener(StmtMutator):  # loops only: expressions are not entered
    def visit_for(self, s: t.For) -> t.Stmt:
        loops, body = _nest(s)
        if len(loops) > 1 and _plain_body(body):
            flat = _collapse(loops, body)
            if flat is not None:
                return flat
        return self.generic_visit(s)


__all__ = ["FlattenLoops"]
