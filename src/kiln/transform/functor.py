"""Rewriting helpers for passes: a tensor-level mutator and graph-level use analysis.

The walking itself lives in `kiln.ir.visitor` (one generic walker for the IR);
this module adds what passes share on top of it:

- `StmtExprMutator`: the `kiln.ir.visitor.StmtExprMutator` with per-class
  hooks spelled `visit_<NodeClass>` (e.g. `visit_BinaryOp`). An unchanged
  subtree keeps its identity (passes can cheaply tell "nothing happened").
- `iter_stmts`, `graph_vars_used`, `iter_graph_exprs`, `function_exprs`,
  `var_use_counts` and `called_functions`: the small analyses the passes share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir import visitor


class StmtExprMutator(visitor.StmtExprMutator):
    """Identity-preserving rewriter of tensor-level statements and expressions.

    Override `visit_<NodeClass>` (e.g. `visit_BinaryOp`) to rewrite one kind of
    node; call `self.generic_expr(e)` / `self.generic_stmt(s)` in it to rewrite
    the children first. `expr(e)` / `stmt(s)` dispatch a node; every child is
    dispatched through them too, so overriding `stmt` sees every statement.
    """

    # ------------------------------------------------------------------ dispatch

    def expr(self, e: t.PrimExpr) -> t.PrimExpr:
        method = getattr(self, f"visit_{type(e).__name__}", None)
        return method(e) if method is not None else self.generic_expr(e)

    def stmt(self, s: t.Stmt) -> t.Stmt:
        method = getattr(self, f"visit_{type(s).__name__}", None)
        return method(s) if method is not None else self.generic_stmt(s)

    def generic_expr(self, e: t.PrimExpr) -> t.PrimExpr:
        """`e` with its children rewritten (`e` itself if none changed)."""
        return super().visit_expr(e)

    def generic_stmt(self, s: t.Stmt) -> t.Stmt:
        """`s` with its children rewritten (`s` itself if none changed)."""
        return super().visit_stmt(s)

    # The base class recurses through these: route children back to the hooks.
    def visit_expr(self, e: t.PrimExpr) -> t.PrimExpr:
        return self.expr(e)

    def visit_stmt(self, s: t.Stmt) -> t.Stmt:
        return self.stmt(s)


def iter_stmts(stmt: t.Stmt) -> Iterator[t.Stmt]:
    """Every statement inside `stmt` (itself included), in program order."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, t.SeqStmt):
            stack.extend(reversed(s.body))
        elif isinstance(s, (t.For, t.LetStmt)):
            stack.append(s.body)
        elif isinstance(s, t.IfThenElse):
            if s.else_body is not None:
                stack.append(s.else_body)
            stack.append(s.then_body)


# --------------------------------------------------------------------------- graph level


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
    """Names of module functions `fn` calls (CallTensor / CallFunc targets)."""
    if isinstance(fn, g.Function):
        return {e.func for e in function_exprs(fn) if isinstance(e, g.CallTensor)}
    return {s.func for s in iter_stmts(fn.body) if isinstance(s, t.CallFunc)}
