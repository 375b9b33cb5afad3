"""Index arithmetic that a loop's bounds make plain: `floormod(e, c)` is `e` when every
value of `e` lies in `[0, c)`.

A reshape that splits an axis reads its source at `(i1 * 64 + i3) % 768` (the split
axis' index over the merged one); inside `for i1 in range(12)` LLVM knows the bound and
drops the remainder, and the loop over `i3` becomes a copy of 64 contiguous floats.
When parallelize merges loops of a symbolic extent into one (kiln.transform.parallelize,
`_collapsed`), `i1` becomes `flat // seq % 12`: LLVM no longer sees `i1 < 12`, keeps a
remainder and a select per element, and the copy runs element by element (a BERT's head
split `[batch, seq, 768] -> [batch, 12, seq, 64]` took 50-200x its pinned kernel).
The same happens to any parallel loop once outlined (it runs from the pool's `begin` to
`end`): ViT-B/16's split `[1, 197, 768] -> [1, 12, 197, 64]` kept `% 768` per element
and took 7x its plain copy. `drop_known_mods` gives those bounds back by interval
arithmetic over loop variables, let variables and constants.
"""

from __future__ import annotations

from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir.analysis.loop_dependence import upper_bound
from kiln.ir.visitor import StmtExprMutator

#: (least, greatest) value of an integer expression
Range = tuple[int, int]
#: Bounds beyond this are not tracked (no wrap-around reasoning at int64's edge).
_LIMIT = 1 << 62


def drop_known_mods(s: t.Stmt) -> t.Stmt:
    """`s` with every `floormod(e, c)` (integer `c > 0`) whose `e` provably lies in
    `[0, c)` replaced by `e` (same object when nothing changed). Known: constants,
    variables of loops from a constant start with a constant bound on their extent,
    lets of such expressions, and `+ - * // % min max` of them."""
    return _DropMods().visit_stmt(s)


class _DropMods(StmtExprMutator):
    def __init__(self) -> None:
        self.ranges: dict[t.Var, Range] = {}

    def visit_for(self, s: t.For) -> t.Stmt:
        bound = upper_bound(s.extent)
        if isinstance(s.start, t.Const) and bound is not None and bound > 0:
            # a loop that runs at all runs its body with var in [start, start + bound)
            start = int(s.start.value)
            self.ranges[s.var] = (start, start + bound - 1)
        return self.generic_visit(s)

    def visit_let_stmt(self, s: t.LetStmt) -> t.Stmt:
        value = self.visit_expr(s.value)
        known = self.range(value)
        if known is not None:
            self.ranges[s.var] = known
        return s if value is s.value else t.LetStmt(s.var, value)

    def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr:
        new = self.generic_visit(e)
        divisor = _positive_int(new.b) if isinstance(new, t.BinaryOp) else None
        if isinstance(new, t.BinaryOp) and new.op == "floormod" and divisor is not None:
            known = self.range(new.a)
            if known is not None and known[0] >= 0 and known[1] < divisor:
                return new.a
        return new

    def range(self, e: t.PrimExpr) -> Range | None:
        """The least and greatest value `e` takes, or None when not known."""
        if not dt.is_int(e.dtype):
            return None
        if isinstance(e, t.Const):
            return _checked((int(e.value), int(e.value)))
        if isinstance(e, t.Var):
            return self.ranges.get(e)
        if not isinstance(e, t.BinaryOp):
            return None
        c = _positive_int(e.b)
        if e.op in ("floormod", "floordiv") and c is not None:
            a = self.range(e.a)
            if e.op == "floormod":
                return (0, c - 1)
            return None if a is None else (a[0] // c, a[1] // c)
        a, b = self.range(e.a), self.range(e.b)
        if a is None or b is None:
            return None
        return _checked(_combine(e.op, a, b))


def _combine(op: str, a: Range, b: Range) -> Range | None:
    if op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if op == "mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    return None


def _checked(r: Range | None) -> Range | None:
    return r if r is not None and -_LIMIT < r[0] <= r[1] < _LIMIT else None


def _positive_int(e: t.PrimExpr) -> int | None:
    """`e`'s value when a positive integer constant, else None."""
    if isinstance(e, t.Const) and dt.is_int(e.dtype) and int(e.value) > 0:
        return int(e.value)
    return None
