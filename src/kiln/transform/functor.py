"""Rewriting helpers for passes: a tensor-level mutator and graph-level use analysis.

`StmtExprMutator` walks a PrimFunc body and rebuilds a node only when one of
its children changed, so an unchanged subtree keeps its identity (passes can
cheaply tell "nothing happened"). Buffers are never rebuilt: loads, stores and
allocations keep referring to the same `Buffer` objects.
"""

from __future__ import annotations

from collections.abc import Iterator

from kiln.errors import CompileError
from kiln.ir import graph as g
from kiln.ir import tensor as t


class StmtExprMutator:
    """Identity-preserving rewriter of tensor-level statements and expressions.

    Override `visit_<NodeClass>` (e.g. `visit_BinaryOp`) to rewrite one kind of
    node; call `self.generic_expr(e)` / `self.generic_stmt(s)` in it to rewrite
    the children first.
    """

    # ------------------------------------------------------------------ dispatch

    def expr(self, e: t.PrimExpr) -> t.PrimExpr:
        method = getattr(self, f"visit_{type(e).__name__}", None)
        return method(e) if method is not None else self.generic_expr(e)

    def stmt(self, s: t.Stmt) -> t.Stmt:
        method = getattr(self, f"visit_{type(s).__name__}", None)
        return method(s) if method is not None else self.generic_stmt(s)

    def _arg(self, a: t.PrimExpr | t.Buffer) -> t.PrimExpr | t.Buffer:
        return a if isinstance(a, t.Buffer) else self.expr(a)

    # ------------------------------------------------------------------ expressions

    def generic_expr(self, e: t.PrimExpr) -> t.PrimExpr:
        if isinstance(e, (t.Var, t.Const)):
            return e
        if isinstance(e, t.BinaryOp):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if a is e.a and b is e.b else t.BinaryOp(e.op, a, b)
        if isinstance(e, t.Compare):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if a is e.a and b is e.b else t.Compare(e.op, a, b)
        if isinstance(e, t.UnaryOp):
            a = self.expr(e.a)
            return e if a is e.a else t.UnaryOp(e.op, a)
        if isinstance(e, t.Select):
            c, x, y = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            if c is e.cond and x is e.true_value and y is e.false_value:
                return e
            return t.Select(c, x, y)
        if isinstance(e, t.Cast):
            v = self.expr(e.value)
            return e if v is e.value else t.Cast(e.dtype, v)
        if isinstance(e, t.Load):
            idx = tuple(self.expr(i) for i in e.indices)
            return e if _same(idx, e.indices) else t.Load(e.buffer, idx)
        if isinstance(e, t.Intrin):
            args = tuple(self.expr(a) for a in e.args)
            return e if _same(args, e.args) else t.Intrin(e.name, args)
        if isinstance(e, t.CallExtern):
            cargs = tuple(self._arg(a) for a in e.args)
            if _same(cargs, e.args):
                return e
            return t.CallExtern(e.name, cargs, e.dtype, e.dependency)
        raise CompileError(f"unknown tensor-level expression {type(e).__name__}: {e!r}")

    # ------------------------------------------------------------------ statements

    def generic_stmt(self, s: t.Stmt) -> t.Stmt:
        if isinstance(s, t.Store):
            v = self.expr(s.value)
            idx = tuple(self.expr(i) for i in s.indices)
            return s if v is s.value and _same(idx, s.indices) else t.Store(s.buffer, v, idx)
        if isinstance(s, t.SeqStmt):
            items = tuple(self.stmt(x) for x in s.body)
            return s if _same(items, s.body) else t.seq(*items)
        if isinstance(s, t.For):
            start, ext, body = self.expr(s.start), self.expr(s.extent), self.stmt(s.body)
            if start is s.start and ext is s.extent and body is s.body:
                return s
            return t.For(s.var, start, ext, s.kind, body)
        if isinstance(s, t.LetStmt):
            v, body = self.expr(s.value), self.stmt(s.body)
            return s if v is s.value and body is s.body else t.LetStmt(s.var, v, body)
        if isinstance(s, t.IfThenElse):
            c = self.expr(s.cond)
            then = self.stmt(s.then_body)
            other = self.stmt(s.else_body) if s.else_body is not None else None
            if c is s.cond and then is s.then_body and other is s.else_body:
                return s
            return t.IfThenElse(c, then, other)
        if isinstance(s, t.Allocate):
            body = self.stmt(s.body)
            return s if body is s.body else t.Allocate(s.buffer, body)
        if isinstance(s, t.AllocConst):
            body = self.stmt(s.body)
            return s if body is s.body else t.AllocConst(s.buffer, s.data, body)
        if isinstance(s, t.DeclBuffer):
            body = self.stmt(s.body)
            return s if body is s.body else t.DeclBuffer(s.buffer, s.source, s.byte_offset, body)
        if isinstance(s, t.Evaluate):
            v = self.expr(s.value)
            return s if v is s.value else t.Evaluate(v)
        if isinstance(s, t.CallFunc):
            args = tuple(self._arg(a) for a in s.args)
            return s if _same(args, s.args) else t.CallFunc(s.func, args)
        raise CompileError(f"unknown tensor-level statement {type(s).__name__}: {s!r}")


def _same(new: tuple[object, ...], old: tuple[object, ...]) -> bool:
    return len(new) == len(old) and all(a is b for a, b in zip(new, old))


def iter_stmts(stmt: t.Stmt) -> Iterator[t.Stmt]:
    """Every statement inside `stmt` (itself included), in program order."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, t.SeqStmt):
            stack.extend(reversed(s.body))
        elif isinstance(s, (t.For, t.LetStmt, t.Allocate, t.AllocConst, t.DeclBuffer)):
            stack.append(s.body)
        elif isinstance(s, t.IfThenElse):
            if s.else_body is not None:
                stack.append(s.else_body)
            stack.append(s.then_body)


# --------------------------------------------------------------------------- graph level


def graph_vars_used(expr: g.Expr) -> Iterator[g.Var]:
    """The graph variables an expression reads directly."""
    if isinstance(expr, g.Var):
        yield expr
    elif isinstance(expr, (g.Call, g.CallTensor)):
        for a in expr.args:
            yield from graph_vars_used(a)
    elif isinstance(expr, g.Tuple):
        for f in expr.fields:
            yield from graph_vars_used(f)
    elif isinstance(expr, g.TupleGetItem):
        yield from graph_vars_used(expr.tuple_value)


def iter_graph_exprs(expr: g.Expr) -> Iterator[g.Expr]:
    """`expr` and every expression nested in it."""
    yield expr
    if isinstance(expr, (g.Call, g.CallTensor)):
        for a in expr.args:
            yield from iter_graph_exprs(a)
    elif isinstance(expr, g.Tuple):
        for f in expr.fields:
            yield from iter_graph_exprs(f)
    elif isinstance(expr, g.TupleGetItem):
        yield from iter_graph_exprs(expr.tuple_value)


def called_functions(fn: g.Function | t.PrimFunc) -> set[str]:
    """Names of module functions `fn` calls (CallTensor / CallFunc targets)."""
    out: set[str] = set()
    if isinstance(fn, g.Function):
        exprs = [b.value for b in fn.bindings] + [fn.result]
        for e in exprs:
            out.update(x.func for x in iter_graph_exprs(e) if isinstance(x, g.CallTensor))
    else:
        out.update(s.func for s in iter_stmts(fn.body) if isinstance(s, t.CallFunc))
    return out
