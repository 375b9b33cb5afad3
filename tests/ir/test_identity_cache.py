"""kiln.ir.identity_cache: a result per live IR node, dropped with the node."""

from __future__ import annotations

import gc

from kiln.ir import tensor as t
from kiln.ir.aliasing import analyze
from kiln.ir.identity_cache import IdentityCache


def _copy_kernel() -> t.PrimFunc:
    x, y = t.Buffer("x", (4,), "float32"), t.Buffer("y", (4,), "float32")
    i = t.Var("i")
    return t.PrimFunc((x, y), t.For(i, t.const(0), t.const(4), "serial",
                                    t.Store(y, x[i], (i,))))


def test_computed_once_per_node_and_dropped_with_it() -> None:
    cache: IdentityCache[t.PrimFunc, int] = IdentityCache()
    calls: list[t.PrimFunc] = []

    def compute(fn: t.PrimFunc) -> int:
        calls.append(fn)
        return len(calls)

    a, b = _copy_kernel(), _copy_kernel()
    assert [cache.get_or_compute(n, compute) for n in (a, b, a, b)] == [1, 2, 1, 2]
    assert calls == [a, b]  # equal structure, distinct nodes: one result each
    calls.clear()
    del a, b
    gc.collect()
    assert not cache._entries, "entries outlived their nodes"


def test_aliasing_answers_are_unchanged_when_cached() -> None:
    fn = _copy_kernel()
    first, again = analyze({"copy": fn}), analyze({"copy": fn})
    assert first == again and first.written["copy"] == frozenset({1})


def test_a_result_put_is_the_one_found() -> None:
    cache: IdentityCache[t.PrimFunc, int] = IdentityCache()
    fn = _copy_kernel()
    assert cache.get(fn) is None  # get computes nothing
    cache.put(fn, 7)
    assert cache.get(fn) == 7
    assert cache.get_or_compute(fn, lambda _: 8) == 7
