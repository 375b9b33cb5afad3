"""How an index expression moves with one loop variable.

Vector code generation asks of every memory access inside a loop over `v`: does the
element it touches move by a constant step when `v` grows by one (contiguous: step 1;
lane-invariant: step 0), and by how much does it differ from another access to the same
buffer. These are facts about expressions, answered here without simplifying them.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir import dtype as dt
from kiln.ir.structural import structural_equal
from kiln.ir.tensor import BinaryOp, Buffer, Cast, Const, PrimExpr, Var
from kiln.ir.visitor import expr_children, iter_exprs


def mentions(e: PrimExpr, names: set[Var] | frozenset[Var]) -> bool:
    """True if any variable of `names` occurs in `e`."""
    return any(isinstance(x, Var) and x in names for x in iter_exprs(e))


def mentions_memoized(root: PrimExpr, named: Callable[[Var], bool],
                      memo: dict[int, tuple[PrimExpr, bool]]) -> bool:
    """Whether a variable that `named` accepts occurs in `root`, for walks that ask this
    of every node on their way down: each node's answer is computed once, bottom-up, and
    kept in `memo` (id -> (node, answer); the node is kept so that its id stays its own),
    instead of walking each subtree again (quadratic in the depth). The caller clears
    `memo` when `named` changes its answer for a variable the memo has seen."""
    stack = [root]
    while stack:
        e = stack[-1]
        if id(e) in memo:
            stack.pop()
            continue
        kids = [c for c in expr_children(e) if isinstance(c, PrimExpr)]
        todo = [c for c in kids if id(c) not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        found = named(e) if isinstance(e, Var) else any(memo[id(c)][1] for c in kids)
        memo[id(e)] = (e, found)
    return memo[id(root)][1]


def coefficient(e: PrimExpr, v: Var) -> int | None:
    """`c` such that `e == e[v := 0] + c * v` for every `v`, or None when `e` is not of that
    form with a constant integer `c` (a product of two terms in `v`, a division, a load
    indexed by `v`, ...). Integer expressions only: a float has no index step."""
    if not dt.is_int(e.dtype):
        return None
    c = _affine_coefficient(e, v)
    # what is not of that form still moves by 0 if `v` is not in it: asked only then, so
    # an index is walked once, not once per level
    return 0 if c is None and not mentions(e, {v}) else c


def _affine_coefficient(e: PrimExpr, v: Var) -> int | None:
    """`coefficient` of an integer `e` read off its form alone (None: not of that form)."""
    if isinstance(e, Var):
        return 1 if e is v else 0
    if isinstance(e, Const):
        return 0
    if isinstance(e, BinaryOp) and e.op in ("add", "sub"):
        a, b = coefficient(e.a, v), coefficient(e.b, v)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, BinaryOp) and e.op == "mul":
        for term, factor in ((e.a, e.b), (e.b, e.a)):
            if isinstance(factor, Const):
                c = coefficient(term, v)
                return None if c is None else c * int(factor.value)
        return None
    if isinstance(e, Cast) and dt.is_int(e.value.dtype) and dt.bits(e.dtype) >= dt.bits(
            e.value.dtype) and dt.kind(e.dtype) == dt.kind(e.value.dtype):
        return coefficient(e.value, v)
    return None


def _row_major_strides(buf: Buffer) -> list[int] | None:
    """Element strides of each dimension, or None when a dimension is symbolic."""
    if not all(isinstance(d, int) for d in buf.shape):
        return None
    strides, step = [], 1
    for d in reversed(buf.shape):
        strides.append(step)
        step *= int(d)
    return strides[::-1]


def flat_coefficient(buf: Buffer, indices: tuple[PrimExpr, ...], v: Var) -> int | None:
    """How many elements `buf[indices]` moves (row-major) when `v` grows by one, or None."""
    coefs: list[int] = []
    for i in indices:
        c = coefficient(i, v)
        if c is None:
            return None
        coefs.append(c)
    moving = [k for k, c in enumerate(coefs) if c]
    if not moving:
        return 0
    if moving == [len(indices) - 1]:
        return coefs[-1]
    strides = _row_major_strides(buf)
    if strides is None:
        return None
    return sum(c * s for c, s in zip(coefs, strides))


def constant_offset(buf: Buffer, a: tuple[PrimExpr, ...], b: tuple[PrimExpr, ...]
                    ) -> int | None:
    """The row-major element distance `flat(a) - flat(b)` when it is a compile-time constant
    because, index by index, the two differ by an integer constant (`i*6 + 1` and `i*6`,
    two constants, equal expressions); else None."""
    if len(a) != len(b):
        return None
    strides = _row_major_strides(buf)
    diff = 0
    for k, (x, y) in enumerate(zip(a, b)):
        if x is y:
            continue
        (xb, xc), (yb, yc) = _split_constant(x), _split_constant(y)
        if xb is not yb and (xb is None or yb is None or not _same(xb, yb)):
            return None
        if xc != yc:
            if strides is None and k != len(a) - 1:
                return None
            diff += (xc - yc) * (1 if strides is None else strides[k])
    return diff


def _split_constant(e: PrimExpr) -> tuple[PrimExpr | None, int]:
    """`(base, c)` with `e == base + c` (`base` None for a constant): a constant added to
    or subtracted from the top of an integer index."""
    if isinstance(e, Const) and dt.is_int(e.dtype):
        return None, int(e.value)
    if isinstance(e, BinaryOp) and e.op in ("add", "sub") and isinstance(e.b, Const) \
            and dt.is_int(e.b.dtype):
        return e.a, int(e.b.value) if e.op == "add" else -int(e.b.value)
    return e, 0


def _same(x: PrimExpr, y: PrimExpr) -> bool:
    """Structural identity of two small index expressions (variables by identity)."""
    return structural_equal(x, y, map_free_vars=False)
