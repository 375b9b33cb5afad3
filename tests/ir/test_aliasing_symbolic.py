"""`noalias` for kernels called on views of one workspace at symbolic offsets
(kiln.ir.aliasing): views the planner lays apart keep it, overlapping ones lose it."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.aliasing import AliasInfo, analyze
from kiln.ir.builder import IRBuilder
from kiln.ir.tensor import PrimExpr, Select, Var, as_expr


def _copy(hi_offset: Callable[[Var], PrimExpr | int]) -> AliasInfo:
    """What `analyze` says when `caller` hands `copy` two views of its workspace: `lo`
    (n x 8 floats at byte 0) and `hi` (n x 8 floats at byte `hi_offset(n)`)."""
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
        with ib.decl_buffer("lo", (n, 8), "float32", w, 0) as lo, \
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
