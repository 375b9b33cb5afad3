"""Rewrites the graph passes share: `rewrite_calls`, and `SharedPacking` for the passes
that pack weights at compile time.

The analyses they share (`graph_vars_used`, `var_use_counts`, ...) live in
`kiln.ir.analysis.graph_uses`; the walking itself in `kiln.ir.visitor`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir import graph as g


def rewrite_calls(fn: g.Function, rewrite: Callable[[g.Call], g.Expr | None]) -> g.Function:
    """`fn` with each binding whose value is an operator call replaced by `rewrite(call)`
    when that is not None (the same object when nothing changed)."""
    bindings: list[g.Binding] = []
    changed = False
    for b in fn.bindings:
        new = rewrite(b.value) if isinstance(b.value, g.Call) else None
        if new is None:
            bindings.append(b)
        else:
            bindings.append(g.Binding(b.var, new))
            changed = True
    if not changed:
        return fn
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))


class SharedPacking:
    """A packing pass's `rewrite` (a call -> its kernel's call on weights packed at compile
    time) whose calls of one weight share one packed copy.

    Packing is per call, so calls that read the same constant (the steps of an unrolled
    recurrent op all read its R) would each get their own copy: the library would hold
    one per call, and each call would stream its own from memory instead of finding the
    one the previous call left in cache. A packed constant is replaced by the first one
    made at the same argument position of the same op from the same source constants,
    when the two hold the same values (so whatever else the packing read, the values
    decide).
    """

    def __init__(self, rewrite: Callable[[g.Call], g.Expr | None]) -> None:
        self._rewrite = rewrite
        self._first: dict[tuple[object, ...], g.Constant] = {}
        self._sources: list[g.Call] = []  # keeps the sources' ids theirs while in use

    def __call__(self, call: g.Call) -> g.Expr | None:
        new = self._rewrite(call)
        sources = tuple(id(a) for a in call.args if isinstance(a, g.Constant))
        if not isinstance(new, g.Call) or not sources:
            return new
        self._sources.append(call)
        args = list(new.args)
        for i, arg in enumerate(args):
            if not isinstance(arg, g.Constant) or any(arg is a for a in call.args):
                continue
            first = self._first.setdefault((new.op, i, sources), arg)
            if first is not arg and first.data.dtype == arg.data.dtype \
                    and np.array_equal(first.data, arg.data):
                args[i] = first
        if all(a is b for a, b in zip(args, new.args, strict=True)):
            return new
        return g.Call(new.op, tuple(args), new.attrs, new.ret_type)
