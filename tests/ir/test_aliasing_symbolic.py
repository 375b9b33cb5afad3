"""`noalias` for kernels called on views of one workspace at symbolic offsets
(kiln.ir.aliasing): views the planner lays apart keep it, overlapping ones lose it."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.aliasing import AliasInfo, analyze
from kiln.ir.builder import IRBuilder
from kiln.ir.tensor import PrimExpr, Select, Var, as_expr, compare


def _copy(hi_offset: Callable[[Var], PrimExpr | int],
          lo_offset: Callable[[Var], PrimExpr | int] = lambda n: 0) -> AliasInfo:
    """What `analyze` says when `caller` hands `copy` two views of its workspace: `lo`
    (n x 8 floats at byte `lo_offset(n)`, 0) and `hi` (n x 8 floats at byte
    `hi_offset(n)`)."""
    n = Var("n", "int64")
    ib = IRBuilder()
    with ib.prim_func("copy"):
        a = ib.arg("A", (n, 8), "float32")
        b = ib.arg("B", (n, 8), "float32")
        ib.scalar_arg("n", var=n)
        with ib.for_range(n, name="i") as i, ib.for_range(8, name="j") as j:
            ib.store(b, [i, j], a[i, j])
    with ib.prim_func("caller"):
        w = ib.arg("W", (n * 64,), "float32")
        ib.scalar_arg("n", var=n)
        with ib.decl_buffer("lo", (n, 8), "float32", w, lo_offset(n)) as lo, \
                ib.decl_buffer("hi", (n, 8), "float32", w, hi_offset(n)) as hi:
            ib.call_func("copy", [lo, hi, n])
    return analyze(dict(ib.get().prim_funcs()))


def test_views_apart_at_symbolic_offsets_keep_noalias() -> None:
    # lo is n*32 bytes: hi at n*32 (adjacent) and at n*64 + 4 are both past it
    for offset in (lambda n: n * 32, lambda n: n * 64 + 4):
        assert _copy(offset).noalias["copy"] == frozenset({1})


def test_views_that_may_overlap_at_symbolic_offsets_lose_noalias() -> None:
    # hi starts inside lo for some n > 0: at n*16, at 16 bytes, at n*32 - 4; or at an
    # offset that is no dim expression (a loop's double-buffered slot): unknown
    for offset in (lambda n: n * 16, lambda n: 16, lambda n: n * 32 - 4,
                   lambda n: Select(n % 2 == 0, n * 32, as_expr(0, "int64"))):
        assert _copy(offset).noalias["copy"] == frozenset()


def _even(n: Var) -> PrimExpr:
    return compare("eq", n % 2, 0)


def test_double_buffered_slots_apart_keep_noalias() -> None:
    # a loop's state slot (either of two places past lo), and the current and next
    # slots of one state (the same condition, arms swapped): apart whichever holds
    cur = lambda n: Select(_even(n), n * 32, n * 64)  # noqa: E731
    nxt = lambda n: Select(_even(n), n * 64, n * 32)  # noqa: E731
    assert _copy(cur).noalias["copy"] == frozenset({1})
    assert _copy(nxt, lo_offset=cur).noalias["copy"] == frozenset({1})
    assert _copy(lambda n: n * 32 + Select(_even(n), n * 32, n * 64)).noalias["copy"] \
        == frozenset({1})


def test_double_buffered_slots_that_may_meet_lose_noalias() -> None:
    # the same slot both ways, or swapped arms under different conditions
    cur = lambda n: Select(_even(n), n * 32, n * 64)  # noqa: E731
    other = lambda n: Select(compare("eq", n % 3, 0), n * 64, n * 32)  # noqa: E731
    assert _copy(cur, lo_offset=cur).noalias["copy"] == frozenset()
    assert _copy(other, lo_offset=cur).noalias["copy"] == frozenset()
