"""Generic traversal and rewriting of IR, so passes do not re-implement walking.

The children of a node are derived once per node class from its dataclass
fields (`child_fields`): a field holding statements, expressions or buffers
(or a tuple of them) is a child; a field typed `Var` binds a variable; the
buffer fields listed in `BUFFER_DEFINITIONS` bind a buffer. Every walker below
runs on that description, so a new node class needs no walking code.

Tensor level (`kiln.ir.tensor`):
- `StmtVisitor` / `StmtMutator`: statements only (expressions are not entered).
- `StmtExprVisitor` / `StmtExprMutator`: statements and expressions.
  Override `visit_<node>` methods (e.g. `visit_for`, `visit_load`) and call the
  base method to recurse. Mutators rebuild bottom-up; a node whose children did
  not change is returned as is, so "nothing changed" is `new is old`.
- `expr_children`, `stmt_children`, `operands`, `definitions`, `iter_stmts`,
  `iter_exprs`, `iter_nodes`, `pre_order_visit` (with pruning), `post_order_visit`,
  `substitute` for quick jobs.

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

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule

_N = TypeVar("_N")

# --------------------------------------------------------------------------- child fields

# Buffer fields that bind a new buffer for the statements after them (the other
# buffer fields use one). Variables need no table: a field typed `Var` (rather
# than `PrimExpr`) binds its variable.
BUFFER_DEFINITIONS: Mapping[type, tuple[str, ...]] = {
    t.Allocate: ("buffer",),
    t.AllocConst: ("buffer",),
    t.DeclBuffer: ("buffer",),
}

# Roles of a field, in the order a walk visits them: uses before definitions,
# definitions before the statements they scope.
EXPR, BUFFER, VAR_DEF, BUFFER_DEF, STMT = "expr", "buffer", "var_def", "buffer_def", "stmt"
_RANK = {EXPR: 0, BUFFER: 0, VAR_DEF: 1, BUFFER_DEF: 1, STMT: 2}


@dataclass(frozen=True)
class ChildFields:
    """What the fields of one node class hold.

    `walk` lists `(field, role)` in visiting order; `names` all dataclass fields
    in constructor order (a rebuilt node passes them positionally).
    An `expr` field holds an expression, or a tuple of expressions and buffers
    (call arguments); a `stmt` field a statement, None, or a tuple of statements.
    """

    walk: tuple[tuple[str, str], ...]
    names: tuple[str, ...]
    # of()'s answers: every walk asks the same few role sets, per node, many times
    _of: dict[tuple[str, ...], tuple[str, ...]] = field(
        default_factory=dict, compare=False, repr=False)
    # The role sets the walkers below ask of every node, looked up once per class.
    exprs: tuple[str, ...] = field(init=False, compare=False, repr=False)
    stmts: tuple[str, ...] = field(init=False, compare=False, repr=False)
    nodes: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exprs", self.of(EXPR))
        object.__setattr__(self, "stmts", self.of(STMT))
        object.__setattr__(self, "nodes", self.of(EXPR, STMT))

    def of(self, *roles: str) -> tuple[str, ...]:
        """The fields of `walk` whose role is one of `roles`, in walking order."""
        found = self._of.get(roles)
        if found is None:
            found = self._of[roles] = tuple(name for name, r in self.walk if r in roles)
        return found


def _leaf_types(hint: Any) -> tuple[set[type], bool]:
    """The classes an annotation admits (None dropped) and whether it is a tuple of them."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        inner, _ = _leaf_types(typing.get_args(hint)[0])
        return inner, True
    if origin in (typing.Union, types.UnionType):
        out: set[type] = set()
        for arg in typing.get_args(hint):
            if arg is not type(None):
                out |= _leaf_types(arg)[0]
        return out, False
    return ({hint} if isinstance(hint, type) else {object}), False


def _role(cls: type, name: str, hint: Any) -> str | None:
    leaves, is_tuple = _leaf_types(hint)
    if not leaves:
        return None
    if all(issubclass(c, t.Stmt) for c in leaves):
        return STMT
    if leaves == {t.Var} and not is_tuple:
        return VAR_DEF
    if leaves == {t.Buffer} and not is_tuple:
        return BUFFER_DEF if name in BUFFER_DEFINITIONS.get(cls, ()) else BUFFER
    # `int | PrimExpr` (a DeclBuffer's byte offset): walked when it is an expression.
    exprs = leaves - {int}
    if exprs and all(issubclass(c, (t.PrimExpr, t.Buffer, g.Expr)) for c in exprs):
        return EXPR
    return None


_FIELDS: dict[type, ChildFields] = {}


def child_fields(cls: type) -> ChildFields:
    """The child fields of node class `cls`, derived from its annotations (cached)."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _derive_fields(cls)
    return found


def _derive_fields(cls: type) -> ChildFields:
    found = ChildFields((), ())
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in dataclasses.fields(cls))
        roles = [(n, _role(cls, n, hints[n])) for n in names]
        walk = sorted(((n, r) for n, r in roles if r is not None),
                      key=lambda nr: _RANK[nr[1]])
        found = ChildFields(tuple(walk), names)
    _FIELDS[cls] = found
    return found


def _values(node: object, names: tuple[str, ...]) -> list[Any]:
    """The values held in fields `names`, tuples flattened and None dropped."""
    out: list[Any] = []
    for name in names:
        value = getattr(node, name)
        if isinstance(value, tuple):
            out.extend(value)
        elif value is not None and not isinstance(value, int):  # an int offset: no node
            out.append(value)
    return out


def _kinds_in(node: object, names: tuple[str, ...], kinds: type | tuple[type, ...]) -> list[Any]:
    """The values of fields `names` (tuples flattened) that are instances of `kinds`:
    `_values` filtered, in one pass, for the walks that run once per node."""
    out: list[Any] = []
    for name in names:
        value = getattr(node, name)
        if isinstance(value, tuple):
            out += [x for x in value if isinstance(x, kinds)]
        elif isinstance(value, kinds):
            out.append(value)
    return out


def _rebuild(node: _N, new: dict[str, Any]) -> _N:
    """`node` with the fields in `new` replaced (itself when none changed)."""
    for name, value in new.items():
        old = getattr(node, name)
        if value is not old and not (isinstance(value, tuple) and _same(value, old)):
            break
    else:
        return node
    return type(node)(*(new.get(n, getattr(node, n)) for n in _fields_of(node).names))


def _method_name(cls: type) -> str:
    return "visit_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


_HANDLERS: dict[tuple[type, type], Callable[[Any, Any], Any] | None] = {}


def _handler(walker: type, node: type) -> Callable[[Any, Any], Any] | None:
    key = (walker, node)
    if key not in _HANDLERS:
        _HANDLERS[key] = None
        # Walk the MRO so a subclass of a node type reaches its parent's method.
        for cls in node.__mro__:
            method = getattr(walker, _method_name(cls), None)
            if method is not None and cls not in (object, t.PrimExpr, t.Stmt, g.Expr):
                _HANDLERS[key] = method
                break
    return _HANDLERS[key]


def _dispatch(obj: object, node: object, kind: str) -> Any:
    # the cache first: this runs once per node of every walk
    method = _HANDLERS.get((type(obj), type(node))) or _handler(type(obj), type(node))
    if method is None:
        raise IRError(f"{type(obj).__name__}: no visit method for {kind} {type(node).__name__}")
    return method(obj, node)


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


# --------------------------------------------------------------------------- tensor level


def _fields_of(node: object) -> ChildFields:
    # child_fields without its call: this runs once per node of every walk
    return _FIELDS.get(type(node)) or _derive_fields(type(node))


def expr_children(node: t.PrimExpr | t.Stmt) -> tuple[t.PrimExpr | t.Buffer, ...]:
    """Expression operands of an expression or statement (Load indices, call arguments,
    a Store's value and indices, loop bounds...); call arguments may be buffers."""
    return tuple(_values(node, _fields_of(node).exprs))


def stmt_children(s: t.Stmt) -> tuple[t.Stmt, ...]:
    """The statements directly inside `s` (a loop's body, a sequence's items...)."""
    return tuple(_values(s, _fields_of(s).stmts))


def operands(node: t.PrimExpr | t.Stmt) -> tuple[t.PrimExpr | t.Buffer, ...]:
    """The expressions and buffers `node` uses directly, in evaluation order (a Load's
    buffer before its indices, a Store's buffer, a view's source, call arguments)."""
    return tuple(_values(node, child_fields(type(node)).of(EXPR, BUFFER)))


def definitions(s: t.Stmt) -> tuple[t.Var | t.Buffer, ...]:
    """The variables and buffers statement `s` binds (a loop's variable, an allocation)."""
    return tuple(_values(s, child_fields(type(s)).of(VAR_DEF, BUFFER_DEF)))


def iter_stmts(stmt: t.Stmt) -> Iterator[t.Stmt]:
    """Every statement inside `stmt` (itself included), in program order."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        stack.extend(reversed(stmt_children(s)))


def iter_exprs(*exprs: t.PrimExpr) -> Iterator[t.PrimExpr]:
    """Every expression inside `exprs` (themselves included), parents first."""
    stack = list(reversed(exprs))
    while stack:
        e = stack.pop()
        yield e
        kids = _kinds_in(e, _fields_of(e).exprs, t.PrimExpr)
        kids.reverse()
        stack += kids


_NODE_KINDS = (t.PrimExpr, t.Stmt)


def _node_children(node: object) -> list[t.Stmt | t.PrimExpr]:
    return _kinds_in(node, _fields_of(node).nodes, _NODE_KINDS)


def iter_nodes(root: t.Stmt | t.PrimExpr) -> Iterator[t.Stmt | t.PrimExpr]:
    """Every statement and expression under `root` (included), parents first, in
    program order. Bound variables and buffers are not nodes of their own."""
    stack = [root]
    while stack:
        x = stack.pop()
        yield x
        kids = _node_children(x)
        kids.reverse()
        stack += kids


def pre_order_visit(node: t.Stmt | t.PrimExpr | t.PrimFunc,
                    fn: Callable[[Any], bool | None]) -> None:
    """Call `fn` on every statement and expression under `node`, parents first, in
    program order; when `fn` returns False the node's children are skipped."""
    stack: list[t.Stmt | t.PrimExpr] = [node.body if isinstance(node, t.PrimFunc) else node]
    while stack:
        x = stack.pop()
        if fn(x) is not False:
            stack.extend(reversed(_node_children(x)))


# How deep a statement or expression tree may nest for the recursive walkers
# (verify, structural_equal, the printer, the interpreter). The deepest of them
# spends about five Python frames per level, so 150 levels stay well inside
# Python's default limit of 1,000 frames with room for the caller's own stack.
# Generated IR never comes near it: statement lists are flat (a let or a
# declaration is a statement beside the next, not around it) and FuseOps caps the
# operators fused into one expression. The frame limit itself is never raised.
MAX_NESTING = 150


def _depth_children(x: object) -> list[object]:
    if isinstance(x, _NODE_KINDS):  # the common case first
        return list(_node_children(x))
    if isinstance(x, g.Function):
        return [*(b.value for b in x.bindings), x.result]
    if isinstance(x, g.Expr):
        return list(graph_children(x))
    if isinstance(x, t.PrimFunc):
        return [x.body]
    return []


def nesting_depth(node: object) -> int:
    """The largest number of nested statements and expressions on one path from
    `node` down (a leaf is 1); walks a PrimFunc, graph Function, IRModule, statement
    or expression without recursion. A PrimFunc or Function adds no level."""
    roots: list[object]
    if isinstance(node, IRModule):
        roots = list(node.functions.values())
    else:
        roots = [node]
    # level by level: the depth is the number of levels (no depth kept per node)
    level = [c for root in roots
             for c in (_depth_children(root) if isinstance(root, (t.PrimFunc, g.Function))
                       else (root,))]
    deepest = 0
    while level:
        deepest += 1
        below: list[object] = []
        for x in level:
            # `_node_children` inlined for tensor nodes, the most of every level
            fields = _FIELDS.get(type(x))
            if fields is None or not isinstance(x, _NODE_KINDS):
                below += _depth_children(x)
                continue
            for name in fields.nodes:
                value = getattr(x, name)
                if isinstance(value, tuple):
                    below += [c for c in value if isinstance(c, _NODE_KINDS)]
                elif isinstance(value, _NODE_KINDS):
                    below.append(value)
        level = below
    return deepest


def check_nesting(node: object, what: str, limit: int = MAX_NESTING) -> None:
    """Raise IRError naming `what` if `node` nests deeper than `limit` levels
    (`nesting_depth`), before a recursive walker would run out of Python frames."""
    depth = nesting_depth(node)
    if depth > limit:
        raise IRError(f"{what}: nested too deeply (depth {depth} > limit {limit}): an "
                      "expression or nested statements this deep are hand-built; split "
                      "long expressions with let bindings")


class StmtVisitor:
    """Read-only walk over the statements of tensor-level IR in program order;
    expressions are not entered. Override `visit_<statement>` and call the base
    method to recurse."""

    def visit_func(self, fn: t.PrimFunc) -> None:
        self.visit_stmt(fn.body)

    def visit_stmt(self, s: t.Stmt) -> None:
        _dispatch(self, s, "statement")

    def generic_visit(self, node: t.Stmt | t.PrimExpr) -> None:
        """Visit the children of `node` (the default of every `visit_<node>`)."""
        for sub in stmt_children(node) if isinstance(node, t.Stmt) else ():
            self.visit_stmt(sub)

    def visit_seq_stmt(self, s: t.SeqStmt) -> None:
        for sub in s.body:
            self.visit_stmt(sub)

    def visit_store(self, s: t.Store) -> None: self.generic_visit(s)
    def visit_for(self, s: t.For) -> None: self.generic_visit(s)
    def visit_let_stmt(self, s: t.LetStmt) -> None: self.generic_visit(s)
    def visit_if_then_else(self, s: t.IfThenElse) -> None: self.generic_visit(s)
    def visit_while(self, s: t.While) -> None: self.generic_visit(s)
    def visit_allocate(self, s: t.Allocate) -> None: self.generic_visit(s)
    def visit_alloc_const(self, s: t.AllocConst) -> None: self.generic_visit(s)
    def visit_decl_buffer(self, s: t.DeclBuffer) -> None: self.generic_visit(s)
    def visit_evaluate(self, s: t.Evaluate) -> None: self.generic_visit(s)
    def visit_call_func(self, s: t.CallFunc) -> None: self.generic_visit(s)


class StmtExprVisitor(StmtVisitor):
    """Read-only walk over statements and expressions of tensor-level IR in program
    order, with hooks for the definitions and uses of variables and buffers."""

    def visit_func(self, fn: t.PrimFunc) -> None:
        for p in fn.params:
            if isinstance(p, t.Buffer):
                self.visit_buffer_def(p)
            else:
                self.visit_var_def(p)
        self.visit_stmt(fn.body)

    def visit_expr(self, e: t.PrimExpr) -> None:
        _dispatch(self, e, "expression")

    # Definitions and uses of variables and buffers: hooks for scope-aware passes.
    def visit_var_def(self, v: t.Var) -> None:
        pass

    def visit_buffer_def(self, b: t.Buffer) -> None:
        pass

    def visit_buffer_use(self, b: t.Buffer) -> None:
        pass

    def generic_visit(self, node: t.Stmt | t.PrimExpr) -> None:
        for name, role in _fields_of(node).walk:
            value = getattr(node, name)
            for x in value if isinstance(value, tuple) else (value,):
                if x is None or isinstance(x, int):  # an int byte offset: no node
                    continue
                if role == STMT:
                    self.visit_stmt(x)
                elif role == VAR_DEF:
                    self.visit_var_def(x)
                elif role == BUFFER_DEF:
                    self.visit_buffer_def(x)
                elif isinstance(x, t.Buffer):
                    self.visit_buffer_use(x)
                else:
                    self.visit_expr(x)

    # leaves: no child to visit (what generic_visit would find)
    def visit_var(self, e: t.Var) -> None: pass
    def visit_const(self, e: t.Const) -> None: pass
    def visit_binary_op(self, e: t.BinaryOp) -> None: self.generic_visit(e)
    def visit_compare(self, e: t.Compare) -> None: self.generic_visit(e)
    def visit_unary_op(self, e: t.UnaryOp) -> None: self.generic_visit(e)
    def visit_select(self, e: t.Select) -> None: self.generic_visit(e)
    def visit_cast(self, e: t.Cast) -> None: self.generic_visit(e)
    def visit_reinterpret(self, e: t.Reinterpret) -> None: self.generic_visit(e)
    def visit_load(self, e: t.Load) -> None: self.generic_visit(e)
    def visit_intrin(self, e: t.Intrin) -> None: self.generic_visit(e)
    def visit_call_extern(self, e: t.CallExtern) -> None: self.generic_visit(e)


class StmtMutator:
    """Rebuilds the statements of tensor-level IR bottom-up; expressions are kept as
    they are. Unchanged subtrees keep their identity."""

    def visit_func(self, fn: t.PrimFunc) -> t.PrimFunc:
        body = self.visit_stmt(fn.body)
        return fn if body is fn.body else fn.with_body(body)

    def visit_stmt(self, s: t.Stmt) -> t.Stmt:
        result: t.Stmt = _dispatch(self, s, "statement")
        return result

    def generic_visit(self, node: _N) -> _N:
        """`node` with its children rewritten (the default of every `visit_<node>`)."""
        return self._rewrite_fields(node, (EXPR, BUFFER, VAR_DEF, BUFFER_DEF))

    def _rewrite_fields(self, node: _N, keep: tuple[str, ...]) -> _N:
        """`node` with its fields rewritten but those of the roles in `keep` (itself
        when none changed: `_rewrite` returns an unchanged value as it is)."""
        fields = _fields_of(node)
        new: dict[str, Any] = {}
        for name, role in fields.walk:
            if role not in keep:
                old = getattr(node, name)
                value = self._rewrite(old, role)
                if value is not old:
                    new[name] = value
        if not new:
            return node
        return type(node)(*(new.get(n, getattr(node, n)) for n in fields.names))

    def _rewrite(self, value: Any, role: str) -> Any:
        if isinstance(value, tuple):  # the same tuple when no item changed
            items = tuple([self._rewrite(x, role) for x in value])
            return value if _same(items, value) else items
        if value is None:
            return None
        return self.visit_stmt(value)

    def visit_seq_stmt(self, s: t.SeqStmt) -> t.Stmt:
        body = tuple(self.visit_stmt(x) for x in s.body)
        return s if _same(body, s.body) else t.seq(*body)

    def visit_store(self, s: t.Store) -> t.Stmt: return self.generic_visit(s)
    def visit_for(self, s: t.For) -> t.Stmt: return self.generic_visit(s)
    def visit_let_stmt(self, s: t.LetStmt) -> t.Stmt: return self.generic_visit(s)
    def visit_if_then_else(self, s: t.IfThenElse) -> t.Stmt: return self.generic_visit(s)
    def visit_while(self, s: t.While) -> t.Stmt: return self.generic_visit(s)
    def visit_allocate(self, s: t.Allocate) -> t.Stmt: return self.generic_visit(s)
    def visit_alloc_const(self, s: t.AllocConst) -> t.Stmt: return self.generic_visit(s)
    def visit_decl_buffer(self, s: t.DeclBuffer) -> t.Stmt: return self.generic_visit(s)
    def visit_evaluate(self, s: t.Evaluate) -> t.Stmt: return self.generic_visit(s)
    def visit_call_func(self, s: t.CallFunc) -> t.Stmt: return self.generic_visit(s)


class StmtExprMutator(StmtMutator):
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

    def visit_expr(self, e: t.PrimExpr) -> t.PrimExpr:
        result: t.PrimExpr = _dispatch(self, e, "expression")
        return result

    def visit_buffer(self, b: t.Buffer) -> t.Buffer:
        return b

    def generic_visit(self, node: _N) -> _N:
        return self._rewrite_fields(node, (VAR_DEF,))

    def _rewrite(self, value: Any, role: str) -> Any:
        if isinstance(value, t.PrimExpr):  # the most common child first
            return self.visit_expr(value)
        if isinstance(value, tuple):  # the same tuple when no item changed
            items = tuple([self._rewrite(x, role) for x in value])
            return value if _same(items, value) else items
        if value is None or isinstance(value, int):
            return value
        if isinstance(value, t.Buffer):
            return self.visit_buffer(value)
        return self.visit_stmt(value) if role == STMT else self.visit_expr(value)

    # leaves: no child to rewrite (what generic_visit would find)
    def visit_var(self, e: t.Var) -> t.PrimExpr: return e
    def visit_const(self, e: t.Const) -> t.PrimExpr: return e
    def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr: return self.generic_visit(e)
    def visit_compare(self, e: t.Compare) -> t.PrimExpr: return self.generic_visit(e)
    def visit_unary_op(self, e: t.UnaryOp) -> t.PrimExpr: return self.generic_visit(e)
    def visit_select(self, e: t.Select) -> t.PrimExpr: return self.generic_visit(e)
    def visit_cast(self, e: t.Cast) -> t.PrimExpr: return self.generic_visit(e)
    def visit_reinterpret(self, e: t.Reinterpret) -> t.PrimExpr: return self.generic_visit(e)
    def visit_load(self, e: t.Load) -> t.PrimExpr: return self.generic_visit(e)
    def visit_intrin(self, e: t.Intrin) -> t.PrimExpr: return self.generic_visit(e)
    def visit_call_extern(self, e: t.CallExtern) -> t.PrimExpr: return self.generic_visit(e)


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
    def __init__(self, vmap: Mapping[t.Var, t.PrimExpr],
                 buffers: Mapping[t.Buffer, t.Buffer]) -> None:
        self.vmap, self.buffers = vmap, buffers

    def visit_var(self, e: t.Var) -> t.PrimExpr:
        return self.vmap.get(e, e)

    def visit_buffer(self, b: t.Buffer) -> t.Buffer:
        return self.buffers.get(b, b)


def substitute(node: _N, vmap: Mapping[t.Var, t.PrimExpr],
               buffers: Mapping[t.Buffer, t.Buffer] | None = None) -> _N:
    """Replace uses of variables, and of `buffers` where given (both by identity), in a
    statement, expression or PrimFunc."""
    m = _Substitute(vmap, buffers or {})
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


class _FreshCopy(StmtExprMutator):
    def __init__(self) -> None:
        self.vars: dict[t.Var, t.Var] = {}
        self.buffers: dict[t.Buffer, t.Buffer] = {}

    def visit_stmt(self, s: t.Stmt) -> t.Stmt:
        for d in definitions(s):
            if isinstance(d, t.Var):
                self.vars.setdefault(d, t.Var(d.name, d.dtype))
            elif d not in self.buffers:
                shape = tuple(x if isinstance(x, int) else self.visit_expr(x) for x in d.shape)
                self.buffers[d] = t.Buffer(d.name, shape, d.dtype, d.scope)
        return super().visit_stmt(s)

    def generic_visit(self, node: _N) -> _N:
        new: dict[str, object] = {}
        for name, role in _fields_of(node).walk:
            value = getattr(node, name)
            new[name] = (self.vars.get(value, value) if role == VAR_DEF
                         else self._rewrite(value, role))
        return dataclasses.replace(node, **new)  # type: ignore[type-var]

    def visit_var(self, e: t.Var) -> t.PrimExpr:
        return self.vars.get(e, e)

    def visit_buffer(self, b: t.Buffer) -> t.Buffer:
        return self.buffers.get(b, b)


def fresh_copy(s: t.Stmt) -> t.Stmt:
    """A copy of `s` binding fresh variables and buffers of the same names: a statement
    emitted twice, each copy binding its own (a variable is bound once per function)."""
    return _FreshCopy().visit_stmt(s)


# --------------------------------------------------------------------------- graph level


def graph_children(e: g.Expr) -> tuple[g.Expr, ...]:
    """Direct operands of a graph expression."""
    return tuple(_values(e, _fields_of(e).exprs))


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

    def generic_visit(self, e: g.Expr) -> None:
        """Visit the operands of `e` (the default of every `visit_<node>`)."""
        for x in graph_children(e):
            self.visit_expr(x)

    def visit_var(self, e: g.Var) -> None: self.generic_visit(e)
    def visit_constant(self, e: g.Constant) -> None: self.generic_visit(e)
    def visit_call(self, e: g.Call) -> None: self.generic_visit(e)
    def visit_call_tensor(self, e: g.CallTensor) -> None: self.generic_visit(e)
    def visit_tuple(self, e: g.Tuple) -> None: self.generic_visit(e)
    def visit_if(self, e: g.If) -> None: self.generic_visit(e)
    def visit_loop(self, e: g.Loop) -> None: self.generic_visit(e)
    def visit_tuple_get_item(self, e: g.TupleGetItem) -> None: self.generic_visit(e)


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

    def generic_visit(self, e: g.Expr) -> g.Expr:
        """`e` with its operands rewritten (itself when none changed)."""
        new: dict[str, Any] = {}
        for name in _fields_of(e).exprs:
            value = getattr(e, name)
            if value is None:  # an absent optional operand (a Loop's trip count)
                continue
            new[name] = (tuple(self.visit_expr(x) for x in value) if isinstance(value, tuple)
                         else self.visit_expr(value))
        return _rebuild(e, new)

    def visit_var(self, e: g.Var) -> g.Expr: return self.generic_visit(e)
    def visit_constant(self, e: g.Constant) -> g.Expr: return self.generic_visit(e)
    def visit_call(self, e: g.Call) -> g.Expr: return self.generic_visit(e)
    def visit_call_tensor(self, e: g.CallTensor) -> g.Expr: return self.generic_visit(e)
    def visit_tuple(self, e: g.Tuple) -> g.Expr: return self.generic_visit(e)
    def visit_if(self, e: g.If) -> g.Expr: return self.generic_visit(e)
    def visit_loop(self, e: g.Loop) -> g.Expr: return self.generic_visit(e)
    def visit_tuple_get_item(self, e: g.TupleGetItem) -> g.Expr: return self.generic_visit(e)
