"""Use analyses of graph-level functions the passes share: `graph_vars_used`,
`iter_graph_exprs`, `function_exprs`, `var_use_counts` and `called_functions`.

The walking itself (visitors, mutators, statement and expression iterators)
lives in `kiln.ir.visitor`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir import visitor


def iter_graph_exprs(expr: g.Expr) -> Iterator[g.Expr]:
    """`expr` and every expression nested in it (pre-order)."""
    yield expr
    for child in visitor.graph_children(expr):
        yield from iter_graph_exprs(child)


def graph_vars_used(expr: g.Expr) -> Iterator[g.Var]:
    """The graph variables an expression reads, once per occurrence."""
    return (e for e in iter_graph_exprs(expr) if isinstance(e, g.Var))


def function_exprs(fn: g.Function) -> Iterator[g.Expr]:
    """Every expression of a graph function: binding values, the result, and all nested in them."""
    for b in fn.bindings:
        yield from iter_graph_exprs(b.value)
    yield from iter_graph_exprs(fn.result)


def var_use_counts(fn: g.Function) -> Counter[g.Var]:
    """How many times each variable is read (binding values and the result)."""
    return Counter(e for e in function_exprs(fn) if isinstance(e, g.Var))


def called_functions(fn: g.Function | t.PrimFunc) -> set[str]:
    """Names of module functions `fn` calls (CallTensor / CallFunc targets, If branches
    and Loop bodies)."""
    if isinstance(fn, g.Function):
        out: set[str] = set()
        for e in function_exprs(fn):
            if isinstance(e, g.CallTensor):
                out.add(e.func)
            elif isinstance(e, g.If):
                out.update((e.then_branch, e.else_branch))
            elif isinstance(e, g.Loop):
                out.add(e.body)
        return out
    return {s.func for s in visitor.iter_stmts(fn.body) if isinstance(s, t.CallFunc)}


__all__ = ["called_functions", "function_exprs", "graph_vars_used", "iter_graph_exprs",
           "var_use_counts"]
