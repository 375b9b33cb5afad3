"""PartitionLoops: split a loop at the constants its own index is compared with.

A concatenation lowers to one loop over the output whose body picks its input with
a chain of `Select(i >= start_k, x_k[...], ...)`; since both sides of a `Select` may
be evaluated (docs/ir.md), every element then loads every input (a DenseNet concat
of 24 inputs: 24 loads per element) and the selects stay in the fused elementwise
tail after it. Split at those starts, the loop becomes one loop per input, each
reading its input only: in each piece every comparison of the index with a
constant has one value, and Simplify drops the selects it decided. A clamp of the
index (`min`/`max` of `i`, `i + c` or `i - c` with a constant) that the piece's
range decides goes too, so the piece's accesses are plain offsets of its index
(which FlattenLoops then merges with the loops under it).

A `serial` or `parallel` loop of constant bounds is split when its body compares
the loop's own variable (bare, `i >= c`, `c < i`, ...) with integer constants strictly
inside its range, into at most MAX_PIECES pieces, and only while the copies stay
under MAX_GROWTH expression nodes per function (each piece is a copy of the body).
Comparisons of other forms (`i + k >= 1`, padding) are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import (
    StmtExprMutator,
    StmtExprVisitor,
    StmtMutator,
    fresh_copy,
    iter_nodes,
    substitute,
)
from kiln.transform.pass_base import FunctionPass
from kiln.transform.simplify import simplify_stmt

#: Most pieces one loop is split into.
MAX_PIECES = 64
#: Most expression nodes the copies may add to one function.
MAX_GROWTH = 200_000
#: The comparisons with a constant on the right: where each splits the range
#: (the first value for which it changes) given the constant.
_CUTS = {"ge": 0, "lt": 0, "gt": 1, "le": 1}
_MIRROR = {"ge": "le", "le": "ge", "gt": "lt", "lt": "gt", "eq": "eq", "ne": "ne"}


@dataclass(frozen=True)
class PartitionLoops(FunctionPass):
    """Split loops at the constants their index is compared with (see the module)."""

    name = "partition-loops"
    level = "tensor"

    def run_on_function(self, func: t.PrimFunc, name: str, mod: IRModule) -> t.PrimFunc:
        if not _compares_with_constant(func.body):  # no loop of it has a cut
            return func
        body = _Partitioner().visit_stmt(func.body)
        return func if body is func.body else func.with_body(body)


def _compares_with_constant(body: t.Stmt) -> bool:
    """Whether some comparison in `body` has a variable on one side and an integer
    constant on the other: the only kind that cuts a loop. One walk that stops at the
    first, where the partitioner rewrites every node and walks each loop's body again
    (most kernels have none: ResNet-50's convolutions)."""
    for e in iter_nodes(body):
        if isinstance(e, t.Compare) and (
                (isinstance(e.a, t.Var) and _int_const(e.b) is not None)
                or (isinstance(e.b, t.Var) and _int_const(e.a) is not None)):
            return True
    return False


def _int_const(e: t.PrimExpr) -> int | None:
    if isinstance(e, t.Const) and dt.is_int(e.dtype):
        return int(e.value)
    return None


def _against(e: t.Compare, var: t.Var) -> tuple[str, int] | None:
    """`(op, c)` when `e` is `var op c` (mirrored when the constant is on the left)."""
    if e.a is var and (c := _int_const(e.b)) is not None:
        return e.op, c
    if e.b is var and (c := _int_const(e.a)) is not None:
        return _MIRROR[e.op], c
    return None


class _Cuts(StmtExprVisitor):
    """The cut points of comparisons of `var` with constants, and the body's size."""

    def __init__(self, var: t.Var) -> None:
        self.var = var
        self.cuts: set[int] = set()
        self.nodes = 0

    def visit_expr(self, e: t.PrimExpr) -> None:
        self.nodes += 1
        super().visit_expr(e)

    def visit_compare(self, e: t.Compare) -> None:
        found = _against(e, self.var)
        if found is not None and found[0] in _CUTS:
            self.cuts.add(found[1] + _CUTS[found[0]])
        self.generic_visit(e)


class _Decide(StmtExprMutator):
    """Comparisons of `var` with constants replaced by their value over [lo, hi)."""

    def __init__(self, var: t.Var, lo: int, hi: int) -> None:
        self.var, self.lo, self.hi = var, lo, hi

    def visit_compare(self, e: t.Compare) -> t.PrimExpr:
        found = _against(e, self.var)
        if found is not None:
            op, c = found
            first, last = (_holds(op, v, c) for v in (self.lo, self.hi - 1))
            if first == last and all(_holds(op, v, c) == first for v in _edges(op, c)
                                     if self.lo <= v < self.hi):
                return t.Const(first, "bool")
        return self.generic_visit(e)

    def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr:
        # A clamp of the index the range decides (a concat input's `clamp_index`):
        # `max(i + c, k)` is `i + c` when i + c >= k over the whole range, ...
        e2 = self.generic_visit(e)
        if not (isinstance(e2, t.BinaryOp) and e2.op in ("min", "max")):
            return e2
        for x, k in ((e2.a, e2.b), (e2.b, e2.a)):
            c, bound = index_offset(x, self.var), _int_const(k)
            if c is None or bound is None:
                continue
            low, high = self.lo + c, self.hi - 1 + c
            if (low >= bound) if e2.op == "max" else (high <= bound):
                return x
            if (high <= bound) if e2.op == "max" else (low >= bound):
                return k
        return e2


def index_offset(e: t.PrimExpr, var: t.Var) -> int | None:
    """`c` when `e` is `var`, `var + c`, `c + var` or `var - c` (an integer constant `c`),
    else None."""
    if e is var:
        return 0
    if isinstance(e, t.BinaryOp) and e.op in ("add", "sub"):
        if e.a is var and (c := _int_const(e.b)) is not None:
            return c if e.op == "add" else -c
        if e.op == "add" and e.b is var and (c := _int_const(e.a)) is not None:
            return c
    return None


def _holds(op: str, v: int, c: int) -> bool:
    return {"ge": v >= c, "gt": v > c, "lt": v < c, "le": v <= c, "eq": v == c,
            "ne": v != c}[op]


def _edges(op: str, c: int) -> tuple[int, ...]:
    """Values where `v op c` can differ from its value at the range's ends."""
    return (c,) if op in ("eq", "ne") else ()


class _Partitioner(StmtMutator):  # loops only: expressions are not entered
    def __init__(self) -> None:
        self.budget = MAX_GROWTH

    def visit_for(self, s: t.For) -> t.Stmt:
        s2 = self.generic_visit(s)
        assert isinstance(s2, t.For)
        start, extent = _int_const(s2.start), _int_const(s2.extent)
        if s2.kind not in ("serial", "parallel") or start is None or extent is None:
            return s2
        cuts = _Cuts(s2.var)
        cuts.visit_stmt(s2.body)
        inside = sorted(c for c in cuts.cuts if start < c < start + extent)
        growth = len(inside) * cuts.nodes
        if not inside or len(inside) + 1 > MAX_PIECES or growth > self.budget:
            return s2
        self.budget -= growth
        bounds = [start, *inside, start + extent]
        pieces: list[t.Stmt] = []
        for lo, hi in pairwise(bounds):
            var = t.Var(s2.var.name, s2.var.dtype)
            body = _Decide(s2.var, lo, hi).visit_stmt(s2.body)
            # each piece binds its own loop variables and buffers
            body = fresh_copy(simplify_stmt(substitute(body, {s2.var: var})))
            pieces.append(t.For(var, t.Const(lo, s2.var.dtype), t.Const(hi - lo, s2.var.dtype),
                                s2.kind, body))
        return t.SeqStmt(tuple(pieces))


__all__ = ["MAX_GROWTH", "MAX_PIECES", "PartitionLoops", "index_offset"]
