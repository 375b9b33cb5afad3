"""Rewrites the graph passes share: `rewrite_calls`.

The analyses they share (`graph_vars_used`, `var_use_counts`, ...) live in
`kiln.ir.analysis.graph_uses`; the walking itself in `kiln.ir.visitor`.
"""

from __future__ import annotations

from collections.abc import Callable

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
