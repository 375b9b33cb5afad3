"""Generic traversal and rewriting of IR, so passes do not re-implement walking.

Tensor level (`kiln.ir.tensor`):
- `StmtExprVisitor`: walks statements and expressions; override `visit_<node>`
  methods (e.g. `visit_for`, `visit_load`) and call the base method to recurse.
- `StmtExprMutator`: rebuilds the tree bottom-up; a node whose children did
  not change is returned as is (identity preserved), so "nothing changed" is
  `new is old`.
- `expr_children`, `post_order_visit`, `substitute` for quick jobs.

Graph level (`kiln.ir.graph`):
- `GraphVisitor` / `GraphMutator` over `Function` bindings and expressions;
  `graph_children` lists an expression's operands.

Method names are `visit_` + the node class name in snake case: `visit_binary_op`,
`visit_if_then_else`, `visit_call_extern`, `visit_call_tensor`, ...

    class CountLoads(StmtExprVisitor):
        def __init__(self) -> None:
            self.n = 0
        def visit_load(self, e: Load) -> None:
            self.n += 1
            super().visit_load(e)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir import tensor as t

_N = TypeVar("_N")


@functools.cache
def _method_name(cls: type) -> str:
    return "visit_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def _dispatch(obj: object, node: object, kind: str) -> Any:
    # Walk the MRO so a subclass of a node type reaches its parent's method.
    for cls in type(node).__mro__:
        method = getattr(obj, _method_name(cls), None)
        if method is not None and cls not in (object, t.PrimExpr, t.Stmt, g.Expr):
            return method(node)
    raise IRError(f"{type(obj).__name__}: no visit method for {kind} {type(node).__name__}")


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# --------------------------------------------------------------------------- tensor level


def expr_children(e: t.PrimExpr) -> tuple[t.PrimExpr | t.Buffer, ...]:
    """Direct operands of an expression (Load indices, call arguments, ...)."""
    if isinstance(e, (t.BinaryOp, t.Compare)):
        return (e.a, e.b)
    if isinstance(e, t.UnaryOp):
        return (e.a,)
    if isinstance(e, t.Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, t.Cast):
        return (e.value,)
    if isinstance(e, t.Load):
        return e.indices
    if isinstance(e, (t.Intrin, t.CallExtern)):
        return e.args
    return ()


class StmtExprVisitor:
    """Read-only walk over tensor-level IR in program order."""

    def visit_func(self, fn: t.PrimFunc) -> None:
        for p in fn.params:
            if isinstance(p, t.Buffer):
                self.visit_buffer_def(p)
            else:
                self.visit_var_def(p)
        self.visit_stmt(fn.body)

    def visit_stmt(self, s: t.Stmt) -> None:
        _dispatch(self, s, "statement")

    def visit_expr(self, e: t.PrimExpr) -> None:
        _dispatch(self, e, "expression")

    # Definitions and uses of variables and buffers: hooks for scope-aware passes.
    def visit_var_def(self, v: t.Var) -> None:
        pass

    def visit_buffer_def(self, b: t.Buffer) -> None:
        pass

    def visit_buffer_use(self, b: t.Buffer) -> None:
        pass

    def _arg(self, a: t.PrimExpr | t.Buffer) -> None:
        if isinstance(a, t.Buffer):
            self.visit_buffer_use(a)
        else:
            self.visit_expr(a)

    # statements
    def visit_seq_stmt(self, s: t.SeqStmt) -> None:
        for sub in s.body:
            self.visit_stmt(sub)

    def visit_store(self, s: t.Store) -> None:
        self.visit_buffer_use(s.buffer)
        for i in s.indices:
            self.visit_expr(i)
        self.visit_expr(s.value)

    def visit_for(self, s: t.For) -> None:
        self.visit_expr(s.start)
        self.visit_expr(s.extent)
        self.visit_var_def(s.var)
        self.visit_stmt(s.body)

    def visit_let_stmt(self, s: t.LetStmt) -> None:
        self.visit_expr(s.value)
        self.visit_var_def(s.var)
        self.visit_stmt(s.body)

    def visit_if_then_else(self, s: t.IfThenElse) -> None:
        self.visit_expr(s.cond)
        self.visit_stmt(s.then_body)
        if s.else_body is not None:
            self.visit_stmt(s.else_body)

    # Declarations have no body: their scope is the rest of the enclosing block.
    def visit_allocate(self, s: t.Allocate) -> None:
        self.visit_buffer_def(s.buffer)

    def visit_alloc_const(self, s: t.AllocConst) -> None:
        self.visit_buffer_def(s.buffer)

    def visit_decl_buffer(self, s: t.DeclBuffer) -> None:
        self.visit_buffer_use(s.source)
        self.visit_buffer_def(s.buffer)

    def visit_evaluate(self, s: t.Evaluate) -> None:
        self.visit_expr(s.value)

    def visit_call_func(self, s: t.CallFunc) -> None:
        for a in s.args:
            self._arg(a)

    # expressions
    def visit_var(self, e: t.Var) -> None:
        pass

    def visit_const(self, e: t.Const) -> None:
        pass

    def visit_binary_op(self, e: t.BinaryOp) -> None:
        self.visit_expr(e.a)
        self.visit_expr(e.b)

    def visit_compare(self, e: t.Compare) -> None:
        self.visit_expr(e.a)
        self.visit_expr(e.b)

    def visit_unary_op(self, e: t.UnaryOp) -> None:
        self.visit_expr(e.a)

    def visit_select(self, e: t.Select) -> None:
        self.visit_expr(e.cond)
        self.visit_expr(e.true_value)
        self.visit_expr(e.false_value)

    def visit_cast(self, e: t.Cast) -> None:
        self.visit_expr(e.value)

    def visit_load(self, e: t.Load) -> None:
        self.visit_buffer_use(e.buffer)
        for i in e.indices:
            self.visit_expr(i)

    def visit_intrin(self, e: t.Intrin) -> None:
        for a in e.args:
            self.visit_expr(a)

    def visit_call_extern(self, e: t.CallExtern) -> None:
        for a in e.args:
            self._arg(a)


class StmtExprMutator:
    """Rebuilds tensor-level IR bottom-up; unchanged subtrees keep their identity.

    `visit_buffer` is applied to every buffer reference (definitions and uses),
    so remapping buffers is one override. Loop and let variables are kept.
    """

    def visit_func(self, fn: t.PrimFunc) -> t.PrimFunc:
        params = tuple(self.visit_buffer(p) if isinstance(p, t.Buffer) else p
                       for p in fn.params)
        body = self.visit_stmt(fn.body)
        if body is fn.body and _same(params, fn.params):
            return fn
        return t.PrimFunc(params, body, dict(fn.attrs))

    def visit_stmt(self, s: t.Stmt) -> t.Stmt:
        result: t.Stmt = _dispatch(self, s, "statement")
        return result

    def visit_expr(self, e: t.PrimExpr) -> t.PrimExpr:
        result: t.PrimExpr = _dispatch(self, e, "expression")
        return result

    def visit_buffer(self, b: t.Buffer) -> t.Buffer:
        return b

    def _arg(self, a: t.PrimExpr | t.Buffer) -> t.PrimExpr | t.Buffer:
        return self.visit_buffer(a) if isinstance(a, t.Buffer) else self.visit_expr(a)

    def _exprs(self, es: tuple[t.PrimExpr, ...]) -> tuple[t.PrimExpr, ...]:
        return tuple(self.visit_expr(e) for e in es)

    # statements
    def visit_seq_stmt(self, s: t.SeqStmt) -> t.Stmt:
        body = tuple(self.visit_stmt(x) for x in s.body)
        return s if _same(body, s.body) else t.seq(*body)

    def visit_store(self, s: t.Store) -> t.Stmt:
        buf, value, idx = self.visit_buffer(s.buffer), self.visit_expr(s.value), \
            self._exprs(s.indices)
        if buf is s.buffer and value is s.value and _same(idx, s.indices):
            return s
        return t.Store(buf, value, idx)

    def visit_for(self, s: t.For) -> t.Stmt:
        start, extent, body = self.visit_expr(s.start), self.visit_expr(s.extent), \
            self.visit_stmt(s.body)
        if start is s.start and extent is s.extent and body is s.body:
            return s
        return t.For(s.var, start, extent, s.kind, body)

    def visit_let_stmt(self, s: t.LetStmt) -> t.Stmt:
        value, body = self.visit_expr(s.value), self.visit_stmt(s.body)
        if value is s.value and body is s.body:
            return s
        return t.LetStmt(s.var, value, body)

    def visit_if_then_else(self, s: t.IfThenElse) -> t.Stmt:
        cond, then = self.visit_expr(s.cond), self.visit_stmt(s.then_body)
        other = self.visit_stmt(s.else_body) if s.else_body is not None else None
        if cond is s.cond and then is s.then_body and other is s.else_body:
            return s
        return t.IfThenElse(cond, then, other)

    def visit_allocate(self, s: t.Allocate) -> t.Stmt:
        buf = self.visit_buffer(s.buffer)
        return s if buf is s.buffer else t.Allocate(buf)

    def visit_alloc_const(self, s: t.AllocConst) -> t.Stmt:
        buf = self.visit_buffer(s.buffer)
        return s if buf is s.buffer else t.AllocConst(buf, s.data)

    def visit_decl_buffer(self, s: t.DeclBuffer) -> t.Stmt:
        buf, src = self.visit_buffer(s.buffer), self.visit_buffer(s.source)
        return s if buf is s.buffer and src is s.source else t.DeclBuffer(buf, src, s.byte_offset)

    def visit_evaluate(self, s: t.Evaluate) -> t.Stmt:
        value = self.visit_expr(s.value)
        return s if value is s.value else t.Evaluate(value)

    def visit_call_func(self, s: t.CallFunc) -> t.Stmt:
        args = tuple(self._arg(a) for a in s.args)
        return s if _same(args, s.args) else t.CallFunc(s.func, args)

    # expressions
    def visit_var(self, e: t.Var) -> t.PrimExpr:
        return e

    def visit_const(self, e: t.Const) -> t.PrimExpr:
        return e

    def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr:
        a, b = self.visit_expr(e.a), self.visit_expr(e.b)
        return e if a is e.a and b is e.b else t.BinaryOp(e.op, a, b)

    def visit_compare(self, e: t.Compare) -> t.PrimExpr:
        a, b = self.visit_expr(e.a), self.visit_expr(e.b)
        return e if a is e.a and b is e.b else t.Compare(e.op, a, b)

    def visit_unary_op(self, e: t.UnaryOp) -> t.PrimExpr:
        a = self.visit_expr(e.a)
        return e if a is e.a else t.UnaryOp(e.op, a)

    def visit_select(self, e: t.Select) -> t.PrimExpr:
        c, x, y = (self.visit_expr(e.cond), self.visit_expr(e.true_value),
                   self.visit_expr(e.false_value))
        if c is e.cond and x is e.true_value and y is e.false_value:
            return e
        return t.Select(c, x, y)

    def visit_cast(self, e: t.Cast) -> t.PrimExpr:
        v = self.visit_expr(e.value)
        return e if v is e.value else t.Cast(e.dtype, v)

    def visit_load(self, e: t.Load) -> t.PrimExpr:
        buf, idx = self.visit_buffer(e.buffer), self._exprs(e.indices)
        return e if buf is e.buffer and _same(idx, e.indices) else t.Load(buf, idx)

    def visit_intrin(self, e: t.Intrin) -> t.PrimExpr:
        args = self._exprs(e.args)
        return e if _same(args, e.args) else t.Intrin(e.name, args)

    def visit_call_extern(self, e: t.CallExtern) -> t.PrimExpr:
        args = tuple(self._arg(a) for a in e.args)
        return e if _same(args, e.args) else t.CallExtern(e.name, args, e.dtype, e.dependency)


class _PostOrder(StmtExprVisitor):
    def __init__(self, fn: Callable[[object], None]) -> None:
        self.fn = fn

    def visit_stmt(self, s: t.Stmt) -> None:
        super().visit_stmt(s)
        self.fn(s)

    def visit_expr(self, e: t.PrimExpr) -> None:
        super().visit_expr(e)
        self.fn(e)


def post_order_visit(node: t.Stmt | t.PrimExpr | t.PrimFunc,
                     fn: Callable[[object], None]) -> None:
    """Call `fn` on every statement and expression under `node`, children first."""
    v = _PostOrder(fn)
    if isinstance(node, t.PrimFunc):
        v.visit_func(node)
    elif isinstance(node, t.Stmt):
        v.visit_stmt(node)
    else:
        v.visit_expr(node)


class _Substitute(StmtExprMutator):
    def __init__(self, vmap: Mapping[t.Var, t.PrimExpr]) -> None:
        self.vmap = vmap

    def visit_var(self, e: t.Var) -> t.PrimExpr:
        return self.vmap.get(e, e)


def substitute(node: _N, vmap: Mapping[t.Var, t.PrimExpr]) -> _N:
    """Replace uses of variables (by identity) in a statement, expression or PrimFunc."""
    m = _Substitute(vmap)
    out: Any
    if isinstance(node, t.PrimFunc):
        out = m.visit_func(node)
    elif isinstance(node, t.Stmt):
        out = m.visit_stmt(node)
    elif isinstance(node, t.PrimExpr):
        out = m.visit_expr(node)
    else:
        raise IRError(f"substitute: expected a PrimFunc, Stmt or PrimExpr, got {type(node)}")
    return out


# --------------------------------------------------------------------------- graph level


def graph_children(e: g.Expr) -> tuple[g.Expr, ...]:
    """Direct operands of a graph expression."""
    if isinstance(e, (g.Call, g.CallTensor)):
        return e.args
    if isinstance(e, g.Tuple):
        return e.fields
    if isinstance(e, g.TupleGetItem):
        return (e.tuple_value,)
    return ()


class GraphVisitor:
    """Read-only walk over a graph Function: params, bindings in order, result."""

    def visit_function(self, fn: g.Function) -> None:
        for p in fn.params:
            self.visit_var_def(p)
        for b in fn.bindings:
            self.visit_binding(b)
        self.visit_expr(fn.result)

    def visit_binding(self, b: g.Binding) -> None:
        self.visit_expr(b.value)
        self.visit_var_def(b.var)

    def visit_var_def(self, v: g.Var) -> None:
        pass

    def visit_expr(self, e: g.Expr) -> None:
        _dispatch(self, e, "graph expression")

    def visit_var(self, e: g.Var) -> None:
        pass

    def visit_constant(self, e: g.Constant) -> None:
        pass

    def visit_call(self, e: g.Call) -> None:
        for a in e.args:
            self.visit_expr(a)

    def visit_call_tensor(self, e: g.CallTensor) -> None:
        for a in e.args:
            self.visit_expr(a)

    def visit_tuple(self, e: g.Tuple) -> None:
        for f in e.fields:
            self.visit_expr(f)

    def visit_tuple_get_item(self, e: g.TupleGetItem) -> None:
        self.visit_expr(e.tuple_value)


class GraphMutator:
    """Rebuilds a graph Function; unchanged expressions keep their identity.

    `visit_binding` may return None to drop a binding, or a list of bindings
    to replace it with several.
    """

    def visit_function(self, fn: g.Function) -> g.Function:
        bindings: list[g.Binding] = []
        for b in fn.bindings:
            out = self.visit_binding(b)
            if out is None:
                continue
            bindings.extend(out if isinstance(out, list) else [out])
        result = self.visit_expr(fn.result)
        if result is fn.result and _same(bindings, fn.bindings):
            return fn
        return g.Function(fn.params, tuple(bindings), result, dict(fn.attrs))

    def visit_binding(self, b: g.Binding) -> g.Binding | list[g.Binding] | None:
        value = self.visit_expr(b.value)
        return b if value is b.value else g.Binding(b.var, value)

    def visit_expr(self, e: g.Expr) -> g.Expr:
        result: g.Expr = _dispatch(self, e, "graph expression")
        return result

    def _exprs(self, es: tuple[g.Expr, ...]) -> tuple[g.Expr, ...]:
        return tuple(self.visit_expr(e) for e in es)

    def visit_var(self, e: g.Var) -> g.Expr:
        return e

    def visit_constant(self, e: g.Constant) -> g.Expr:
        return e

    def visit_call(self, e: g.Call) -> g.Expr:
        args = self._exprs(e.args)
        return e if _same(args, e.args) else g.Call(e.op, args, dict(e.attrs), e.ret_type)

    def visit_call_tensor(self, e: g.CallTensor) -> g.Expr:
        args = self._exprs(e.args)
        return e if _same(args, e.args) else g.CallTensor(e.func, args, e.ret_type)

    def visit_tuple(self, e: g.Tuple) -> g.Expr:
        fields = self._exprs(e.fields)
        return e if _same(fields, e.fields) else g.Tuple(fields)

    def visit_tuple_get_item(self, e: g.TupleGetItem) -> g.Expr:
        v = self.visit_expr(e.tuple_value)
        return e if v is e.tuple_value else g.TupleGetItem(v, e.index)
