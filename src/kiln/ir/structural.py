"""Structural equality of IR: same shape of tree, up to renaming of bound variables.

`structural_equal(a, b)` works on IRModules, PrimFuncs, graph Functions,
statements, expressions, buffers and types.

- Bound variables are matched by their position of definition, through a
  bijective map (TVM-style): loop and let variables, function parameters,
  buffers of parameters / Allocate / AllocConst / DeclBuffer, graph Vars of
  parameters and bindings. Their name hints are ignored; their declarations
  (dtype; buffer shape, dtype and scope; graph type) must agree.
- Free variables (used but not defined inside the compared nodes) are equal
  only if they are the same object, unless `map_free_vars=True`, which maps
  them on first use like bound ones.
- Constant data (Const values, AllocConst and graph Constant arrays) compare by
  dtype, shape and exact bytes, so NaN equals the same NaN and 0.0 != -0.0.
- Attributes (function attrs, operator attrs, module attrs) compare by value.

`assert_structural_equal(a, b)` raises `AssertionError` (like TVM and like a
failed `assert`: a test helper) whose message gives the path to the first
difference, e.g. `add_one.body.body.value.b`, both sides printed at that point
and the enclosing statement of each side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.printer import NodeText
from kiln.ir.types import TensorType, TupleType
from kiln.ir.visitor import check_nesting

__all__ = ["assert_structural_equal", "structural_equal"]


class _Mismatch(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def structural_equal(a: object, b: object, *, map_free_vars: bool = False) -> bool:
    """True if `a` and `b` are the same IR up to renaming of bound variables."""
    _check_depth("structural_equal", a, b)
    try:
        _Comparer(map_free_vars).root(a, b)
    except _Mismatch:
        return False
    return True


def assert_structural_equal(a: object, b: object, *, map_free_vars: bool = False) -> None:
    """Raise AssertionError naming the path to the first difference, with both sides."""
    _check_depth("assert_structural_equal", a, b)
    cmp = _Comparer(map_free_vars)
    try:
        cmp.root(a, b)
    except _Mismatch as exc:
        message = cmp.describe(exc.reason)
    else:
        return
    raise AssertionError(message)


def _check_depth(what: str, a: object, b: object) -> None:
    # The comparison recurses over expressions: refuse hand-built IR too deep for it.
    check_nesting(a, f"{what} (first argument)")
    check_nesting(b, f"{what} (second argument)")


def _same_float(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def values_equal(x: Any, y: Any) -> bool:
    """Equality of attribute values: exact types, NaN-safe floats, arrays by bytes."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and _arrays_equal(x, y)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(values_equal(p, q) for p, q in zip(x, y))
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        return set(x) == set(y) and all(values_equal(x[k], y[k]) for k in x)
    if type(x) is not type(y):
        return False
    if isinstance(x, float):
        return _same_float(x, y)
    try:
        return bool(x == y)
    except Exception:  # values whose == is not a bool
        return x is y


def _arrays_equal(x: np.ndarray, y: np.ndarray) -> bool:
    return (x.dtype == y.dtype and x.shape == y.shape
            and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes())


class _Comparer:
    def __init__(self, map_free_vars: bool) -> None:
        self.map_free_vars = map_free_vars
        self.l2r: dict[int, object] = {}
        self.r2l: dict[int, object] = {}
        self._keep: list[object] = []  # keeps mapped nodes alive so ids stay unique
        self.path: list[str] = []
        self.nodes: list[tuple[object, object]] = []
        self.lp = NodeText()
        self.rp = NodeText()

    # ------------------------------------------------------------------ reporting

    def describe(self, reason: str) -> str:
        path = "".join(self.path).lstrip(".") or "<root>"
        lines = [f"structural mismatch at {path}: {reason}"]
        if self.nodes:
            lhs, rhs = self.nodes[-1]
            lines.append(f"  lhs: {self.lp.node(lhs)}")
            lines.append(f"  rhs: {self.rp.node(rhs)}")
            for outer_l, outer_r in reversed(self.nodes[:-1]):
                if isinstance(outer_l, (t.Stmt, g.Binding)):
                    lines.append(f"  in lhs: {self.lp.node(outer_l)}")
                    lines.append(f"  in rhs: {self.rp.node(outer_r)}")
                    break
        return "\n".join(lines)

    def fail(self, reason: str) -> None:
        raise _Mismatch(reason)

    def at(self, name: str, check: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Run `check(*args)` with `name` appended to the path (kept there if it fails)."""
        self.path.append(name)
        check(*args, **kwargs)
        self.path.pop()

    def field(self, name: str, a: object, b: object) -> None:
        self.at(name, self.node, a, b)

    def fields(self, name: str, xs: tuple[Any, ...], ys: tuple[Any, ...]) -> None:
        if len(xs) != len(ys):
            self.fail(f"{name.lstrip('.')} has {len(xs)} items on the lhs, {len(ys)} on the rhs")
        for i, (x, y) in enumerate(zip(xs, ys)):
            self.field(f"{name}[{i}]", x, y)

    def check(self, what: str, x: Any, y: Any) -> None:
        if not values_equal(x, y):
            self.fail(f"{what} differ: {x!r} vs {y!r}")

    # ------------------------------------------------------------------ variables

    def define(self, a: object, b: object, *, bind_dims: bool = False) -> None:
        """Bind `a` (lhs) to `b` (rhs) at a definition site, after checking declarations.

        With `bind_dims` (function parameters, graph bindings) a symbolic dimension
        that is a not-yet-bound Var is itself a definition (a shape variable).
        """
        self.decl(a, b, bind_dims)
        ka, kb = id(a), id(b)
        mapped = self.l2r.get(ka)
        if mapped is not None and mapped is not b:
            self.fail(f"{self._what(a)} is defined again, bound to a different rhs variable")
        back = self.r2l.get(kb)
        if back is not None and back is not a:
            self.fail(f"rhs {self._what(b)} is already bound to a different lhs variable")
        self.l2r[ka], self.r2l[kb] = b, a
        self._keep += [a, b]

    def use(self, a: object, b: object) -> None:
        """A use of a variable or buffer: bound ones must map; free ones must be identical."""
        mapped = self.l2r.get(id(a))
        if mapped is not None:
            if mapped is not b:
                self.fail(f"{self._what(a)} refers to a different binding on each side")
            return
        if id(b) in self.r2l:
            self.fail(f"rhs {self._what(b)} is bound but lhs {self._what(a)} is free")
        if self.map_free_vars:
            self.define(a, b)
        elif a is not b:
            self.fail(f"free {self._what(a)} is a different object on each side "
                      "(pass map_free_vars=True to map free variables)")

    def _what(self, node: object) -> str:
        if isinstance(node, t.Buffer):
            return f"buffer '{node.name}'"
        if isinstance(node, (t.Var, g.Var)):
            return f"variable '{node.name}'"
        return type(node).__name__

    def decl(self, a: object, b: object, bind_dims: bool = False) -> None:
        if type(a) is not type(b):
            self.fail(f"node types differ: {type(a).__name__} vs {type(b).__name__}")
        if isinstance(a, t.Var):
            assert isinstance(b, t.Var)
            self.check("variable dtypes", a.dtype, b.dtype)
        elif isinstance(a, t.Buffer):
            assert isinstance(b, t.Buffer)
            self.dims(".shape", a.shape, b.shape, bind_dims)
            self.check("buffer dtypes", a.dtype, b.dtype)
            self.check("buffer scopes", a.scope, b.scope)
        elif isinstance(a, g.Var):
            assert isinstance(b, g.Var)
            self.at(".var_type", self.type, a.var_type, b.var_type, bind_dims)

    def dims(self, name: str, xs: tuple[Any, ...], ys: tuple[Any, ...],
             bind_dims: bool = False) -> None:
        if len(xs) != len(ys):
            self.fail(f"ranks differ: {tuple(xs)} vs {tuple(ys)}")
        for i, (x, y) in enumerate(zip(xs, ys)):
            if (bind_dims and isinstance(x, t.Var) and isinstance(y, t.Var)
                    and id(x) not in self.l2r and id(y) not in self.r2l):
                self.at(f"{name}[{i}]", self.define, x, y)
            elif isinstance(x, t.PrimExpr) and isinstance(y, t.PrimExpr):
                self.field(f"{name}[{i}]", x, y)
            elif not values_equal(x, y):
                self.at(f"{name}[{i}]", self.fail, f"shapes differ: {tuple(xs)} vs {tuple(ys)}")

    def type(self, a: object, b: object, bind_dims: bool = False) -> None:
        if type(a) is not type(b):
            self.fail(f"types differ: {a} vs {b}")
        if isinstance(a, TensorType):
            assert isinstance(b, TensorType)
            self.dims(".shape", a.shape, b.shape, bind_dims)
            self.check("tensor dtypes", a.dtype, b.dtype)
        elif isinstance(a, TupleType):
            assert isinstance(b, TupleType)
            if len(a.fields) != len(b.fields):
                self.fail(f"tuple types differ: {a} vs {b}")
            for i, (x, y) in enumerate(zip(a.fields, b.fields)):
                self.at(f".fields[{i}]", self.type, x, y, bind_dims)
        else:
            self.check("types", a, b)

    def attrs(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
        self.path.append(".attrs")
        missing = sorted(set(a) ^ set(b))
        if missing:
            self.fail(f"attribute keys differ: {sorted(a)} vs {sorted(b)}")
        for k in a:
            if not values_equal(a[k], b[k]):
                self.path.append(f"[{k!r}]")
                self.fail(f"attribute {k!r} differs: {a[k]!r} vs {b[k]!r}")
        self.path.pop()

    def data(self, x: np.ndarray, y: np.ndarray) -> None:
        if x.dtype != y.dtype:
            self.fail(f"constant dtypes differ: {x.dtype} vs {y.dtype}")
        if x.shape != y.shape:
            self.fail(f"constant shapes differ: {x.shape} vs {y.shape}")
        if not _arrays_equal(x, y):
            diff = np.flatnonzero(np.ascontiguousarray(x).view(np.uint8).reshape(-1)
                                  != np.ascontiguousarray(y).view(np.uint8).reshape(-1))
            first = int(diff[0]) // max(1, x.itemsize) if diff.size else 0
            fx, fy = x.reshape(-1)[first], y.reshape(-1)[first]
            self.fail(f"constant data differ (first at flat index {first}: {fx!r} vs {fy!r})")

    # ------------------------------------------------------------------ dispatch

    def root(self, a: object, b: object) -> None:
        if isinstance(a, IRModule) and isinstance(b, IRModule):
            self.module(a, b)
            return
        if not isinstance(a, IRModule):
            self.path.append(type(a).__name__)
        self.node(a, b)

    def module(self, a: IRModule, b: IRModule) -> None:
        if list(a.functions) != list(b.functions) and set(a.functions) != set(b.functions):
            only_l = sorted(set(a.functions) - set(b.functions))
            only_r = sorted(set(b.functions) - set(a.functions))
            self.fail(f"function names differ: only in lhs {only_l}, only in rhs {only_r}")
        self.attrs(a.attrs, b.attrs)
        for name in a.functions:
            # What a function binds is its own: the variables and symbolic dimensions of
            # one function are not those of another (an If branch whose types name its
            # caller's dimension objects compares like one that has its own).
            l2r, r2l = dict(self.l2r), dict(self.r2l)
            self.field(name, a.functions[name], b.functions[name])
            self.l2r, self.r2l = l2r, r2l

    def node(self, a: object, b: object) -> None:
        self.nodes.append((a, b))
        if type(a) is not type(b):
            self.fail(f"node types differ: {type(a).__name__} vs {type(b).__name__}")
        method = _DISPATCH.get(type(a))
        if method is not None:
            method(self, a, b)
        elif isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray)
            self.data(a, b)
        elif isinstance(a, (TensorType, TupleType)):
            self.type(a, b)
        else:
            self.check("values", a, b)
        self.nodes.pop()

    # ------------------------------------------------------------------ functions

    def params(self, xs: tuple[Any, ...], ys: tuple[Any, ...]) -> None:
        if len(xs) != len(ys):
            self.fail(f"parameter counts differ: {len(xs)} vs {len(ys)}")
        for i, (p, q) in enumerate(zip(xs, ys)):
            self.at(f".params[{i}]", self.define, p, q, bind_dims=True)

    def prim_func(self, a: t.PrimFunc, b: t.PrimFunc) -> None:
        self.params(a.params, b.params)
        self.attrs(a.attrs, b.attrs)
        self.field(".body", a.body, b.body)

    def function(self, a: g.Function, b: g.Function) -> None:
        self.params(a.params, b.params)
        self.attrs(a.attrs, b.attrs)
        if len(a.bindings) != len(b.bindings):
            self.fail(f"binding counts differ: {len(a.bindings)} vs {len(b.bindings)}")
        for i, (x, y) in enumerate(zip(a.bindings, b.bindings)):
            self.field(f".bindings[{i}]", x, y)
        self.field(".result", a.result, b.result)

    def binding(self, a: g.Binding, b: g.Binding) -> None:
        self.field(".value", a.value, b.value)
        self.at(".var", self.define, a.var, b.var, bind_dims=True)

    # ------------------------------------------------------------------ statements

    def seq(self, a: t.SeqStmt, b: t.SeqStmt) -> None:
        self.fields(".body", a.body, b.body)

    def store(self, a: t.Store, b: t.Store) -> None:
        self.at(".buffer", self.use, a.buffer, b.buffer)
        self.fields(".indices", a.indices, b.indices)
        self.field(".value", a.value, b.value)

    def for_(self, a: t.For, b: t.For) -> None:
        self.field(".start", a.start, b.start)
        self.field(".extent", a.extent, b.extent)
        if a.kind != b.kind:
            self.at(".kind", self.fail, f"loop kinds differ: {a.kind!r} vs {b.kind!r}")
        self.at(".var", self.define, a.var, b.var)
        self.field(".body", a.body, b.body)

    def let(self, a: t.LetStmt, b: t.LetStmt) -> None:
        self.field(".value", a.value, b.value)
        self.at(".var", self.define, a.var, b.var)

    def if_(self, a: t.IfThenElse, b: t.IfThenElse) -> None:
        self.field(".cond", a.cond, b.cond)
        self.field(".then_body", a.then_body, b.then_body)
        if (a.else_body is None) != (b.else_body is None):
            self.at(".else_body", self.fail, "one side has an else branch, the other does not")
        if a.else_body is not None:
            self.field(".else_body", a.else_body, b.else_body)

    def while_(self, a: t.While, b: t.While) -> None:
        self.field(".cond", a.cond, b.cond)
        self.field(".body", a.body, b.body)

    def allocate(self, a: t.Allocate, b: t.Allocate) -> None:
        self.at(".buffer", self.define, a.buffer, b.buffer)

    def alloc_const(self, a: t.AllocConst, b: t.AllocConst) -> None:
        self.at(".data", self.data, a.data, b.data)
        self.at(".buffer", self.define, a.buffer, b.buffer)

    def decl_buffer(self, a: t.DeclBuffer, b: t.DeclBuffer) -> None:
        self.at(".source", self.use, a.source, b.source)
        if isinstance(a.byte_offset, int) or isinstance(b.byte_offset, int):
            self.at(".byte_offset", self.check, "byte offsets", a.byte_offset, b.byte_offset)
        else:
            self.field(".byte_offset", a.byte_offset, b.byte_offset)
        self.at(".buffer", self.define, a.buffer, b.buffer)

    def evaluate(self, a: t.Evaluate, b: t.Evaluate) -> None:
        self.field(".value", a.value, b.value)

    def call_func(self, a: t.CallFunc, b: t.CallFunc) -> None:
        self.at(".func", self.check, "callees", a.func, b.func)
        self.fields(".args", a.args, b.args)

    # ------------------------------------------------------------------ expressions

    def buffer(self, a: t.Buffer, b: t.Buffer) -> None:
        self.use(a, b)

    def var(self, a: t.Var, b: t.Var) -> None:
        self.use(a, b)

    def const(self, a: t.Const, b: t.Const) -> None:
        self.check("constant dtypes", a.dtype, b.dtype)
        if not values_equal(a.value, b.value):
            self.fail(f"constant values differ: {a.value!r} vs {b.value!r}")

    def binary(self, a: t.BinaryOp | t.Compare, b: t.BinaryOp | t.Compare) -> None:
        if a.op != b.op:
            self.fail(f"operators differ: {a.op!r} vs {b.op!r}")
        self.field(".a", a.a, b.a)
        self.field(".b", a.b, b.b)

    def unary(self, a: t.UnaryOp, b: t.UnaryOp) -> None:
        if a.op != b.op:
            self.fail(f"operators differ: {a.op!r} vs {b.op!r}")
        self.field(".a", a.a, b.a)

    def select(self, a: t.Select, b: t.Select) -> None:
        self.field(".cond", a.cond, b.cond)
        self.field(".true_value", a.true_value, b.true_value)
        self.field(".false_value", a.false_value, b.false_value)

    def cast(self, a: t.Cast | t.Reinterpret, b: t.Cast | t.Reinterpret) -> None:
        self.check("cast dtypes", a.dtype, b.dtype)
        self.field(".value", a.value, b.value)

    def load(self, a: t.Load, b: t.Load) -> None:
        self.at(".buffer", self.use, a.buffer, b.buffer)
        self.fields(".indices", a.indices, b.indices)

    def intrin(self, a: t.Intrin, b: t.Intrin) -> None:
        if a.name != b.name:
            self.fail(f"intrinsics differ: {a.name!r} vs {b.name!r}")
        self.fields(".args", a.args, b.args)

    def call_extern(self, a: t.CallExtern, b: t.CallExtern) -> None:
        if a.name != b.name:
            self.fail(f"extern functions differ: {a.name!r} vs {b.name!r}")
        self.check("return dtypes", a.dtype, b.dtype)
        self.at(".dependency", self.check, "extern dependencies", a.dependency, b.dependency)
        self.fields(".args", a.args, b.args)

    # ------------------------------------------------------------------ graph expressions

    def gvar(self, a: g.Var, b: g.Var) -> None:
        self.use(a, b)

    def constant(self, a: g.Constant, b: g.Constant) -> None:
        self.at(".data", self.data, a.data, b.data)

    def call(self, a: g.Call, b: g.Call) -> None:
        if a.op != b.op:
            self.fail(f"operators differ: {a.op!r} vs {b.op!r}")
        self.fields(".args", a.args, b.args)
        self.attrs(a.attrs, b.attrs)
        self.at(".ret_type", self.type, a.ret_type, b.ret_type)

    def call_tensor(self, a: g.CallTensor, b: g.CallTensor) -> None:
        if a.func != b.func:
            self.at(".func", self.fail, f"callees differ: {a.func!r} vs {b.func!r}")
        self.fields(".args", a.args, b.args)
        self.at(".ret_type", self.type, a.ret_type, b.ret_type)

    def if_expr(self, a: g.If, b: g.If) -> None:
        for name in ("then_branch", "else_branch"):
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                self.at(f".{name}", self.fail, f"branches differ: {x!r} vs {y!r}")
        self.field(".cond", a.cond, b.cond)
        self.fields(".args", a.args, b.args)
        self.at(".ret_type", self.type, a.ret_type, b.ret_type)

    def loop(self, a: g.Loop, b: g.Loop) -> None:
        if a.body != b.body:
            self.at(".body", self.fail, f"loop bodies differ: {a.body!r} vs {b.body!r}")
        for name in ("trip_count", "cond"):
            x, y = getattr(a, name), getattr(b, name)
            if (x is None) != (y is None):
                self.at(f".{name}", self.fail, "given on one side only")
            if x is not None:
                self.field(f".{name}", x, y)
        self.fields(".states", a.states, b.states)
        self.fields(".captures", a.captures, b.captures)
        self.at(".ret_type", self.type, a.ret_type, b.ret_type)

    def tuple_(self, a: g.Tuple, b: g.Tuple) -> None:
        self.fields(".fields", a.fields, b.fields)

    def get_item(self, a: g.TupleGetItem, b: g.TupleGetItem) -> None:
        if a.index != b.index:
            self.at(".index", self.fail, f"tuple indices differ: {a.index} vs {b.index}")
        self.field(".tuple_value", a.tuple_value, b.tuple_value)

    def tensor_type(self, a: TensorType, b: TensorType) -> None:
        self.type(a, b)


_DISPATCH: dict[type, Any] = {
    t.PrimFunc: _Comparer.prim_func,
    g.Function: _Comparer.function,
    g.Binding: _Comparer.binding,
    t.SeqStmt: _Comparer.seq,
    t.Store: _Comparer.store,
    t.For: _Comparer.for_,
    t.LetStmt: _Comparer.let,
    t.IfThenElse: _Comparer.if_,
    t.While: _Comparer.while_,
    t.Allocate: _Comparer.allocate,
    t.AllocConst: _Comparer.alloc_const,
    t.DeclBuffer: _Comparer.decl_buffer,
    t.Evaluate: _Comparer.evaluate,
    t.CallFunc: _Comparer.call_func,
    t.Buffer: _Comparer.buffer,
    t.Var: _Comparer.var,
    t.Const: _Comparer.const,
    t.BinaryOp: _Comparer.binary,
    t.Compare: _Comparer.binary,
    t.UnaryOp: _Comparer.unary,
    t.Select: _Comparer.select,
    t.Cast: _Comparer.cast,
    t.Reinterpret: _Comparer.cast,
    t.Load: _Comparer.load,
    t.Intrin: _Comparer.intrin,
    t.CallExtern: _Comparer.call_extern,
    g.Var: _Comparer.gvar,
    g.Constant: _Comparer.constant,
    g.Call: _Comparer.call,
    g.CallTensor: _Comparer.call_tensor,
    g.Tuple: _Comparer.tuple_,
    g.If: _Comparer.if_expr,
    g.Loop: _Comparer.loop,
    g.TupleGetItem: _Comparer.get_item,
    TensorType: _Comparer.tensor_type,
    TupleType: _Comparer.tensor_type,
}
