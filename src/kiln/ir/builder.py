"""IRBuilder: build IR with context-manager scopes.

    ib = IRBuilder()
    with ib.prim_func("add_one"):
        X = ib.arg("X", (4,), "float32")
        Y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(Y, [i], X[i] + 1.0)
    with ib.function("main"):
        x = ib.param("x", TensorType((4,), "float32"))
        y = ib.emit(CallTensor("add_one", (x,), TensorType((4,), "float32")), "y")
        ib.ret(y)
    mod = ib.get()

The DSL parser drives this same builder, so hand-written and parsed IR agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.dtype import INDEX_DTYPE, from_numpy
from kiln.ir.module import BaseFunc, IRModule, check_function_name
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    Buffer,
    CallFunc,
    Const,
    DeclBuffer,
    Evaluate,
    ExprLike,
    For,
    IfThenElse,
    LetStmt,
    Param,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    While,
    as_expr,
    seq,
)
from kiln.ir.types import TensorType, Type


class _Frame:
    def __init__(self) -> None:
        self.stmts: list[Stmt] = []


class _PrimFrame(_Frame):
    def __init__(self, name: str, attrs: Mapping[str, Any]) -> None:
        super().__init__()
        self.name = name
        self.attrs = dict(attrs)
        self.params: list[Param] = []


class _GraphFrame:
    def __init__(self, name: str, attrs: Mapping[str, Any]) -> None:
        self.name = name
        self.attrs = dict(attrs)
        self.params: list[g.Var] = []
        self.bindings: list[g.Binding] = []
        self.result: g.Expr | None = None


def _body(stmts: list[Stmt], where: str) -> Stmt:
    if not stmts:
        raise IRError(f"empty body in {where}: add at least one statement")
    return seq(*stmts)


class IRBuilder:
    """Builds an IRModule function by function; see the module docstring."""

    def __init__(self, module: IRModule | None = None) -> None:
        self._functions: dict[str, BaseFunc] = dict(module.functions) if module else {}
        self._attrs: dict[str, Any] = dict(module.attrs) if module else {}
        self._stack: list[_Frame] = []
        self._graph: _GraphFrame | None = None

    # ------------------------------------------------------------------ module

    def get(self) -> IRModule:
        """The module built so far."""
        if self._stack or self._graph is not None:
            raise IRError("IRBuilder.get() called inside an open function scope")
        return IRModule(self._functions, self._attrs)

    def module_attr(self, key: str, value: Any) -> None:
        """Set a module attribute."""
        self._attrs[key] = value

    def add_function(self, name: str, fn: BaseFunc) -> None:
        """Add an already-built function; IRError if `name` is taken or not a valid name."""
        check_function_name(name)
        if name in self._functions:
            raise IRError(f"function {name!r} is defined twice")
        self._functions[name] = fn

    # ------------------------------------------------------------------ tensor level

    @contextmanager
    def prim_func(self, name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[None]:
        """Open a tensor-level function; `arg`/`scalar_arg` add parameters."""
        if self._stack or self._graph is not None:
            raise IRError(f"prim_func {name!r} opened inside another function")
        frame = _PrimFrame(name, attrs or {})
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
        self.add_function(name, PrimFunc(
            tuple(frame.params), _body(frame.stmts, f"prim_func {name}"), frame.attrs))

    def _prim(self) -> _PrimFrame:
        if not self._stack or not isinstance(self._stack[0], _PrimFrame):
            raise IRError("this call needs an open prim_func scope")
        return self._stack[0]

    def _emit_stmt(self, stmt: Stmt) -> None:
        if not self._stack:
            raise IRError("a statement needs an open prim_func scope")
        self._stack[-1].stmts.append(stmt)

    def arg(self, name: str, shape: Sequence[Any], dtype: str, *,
            buffer: Buffer | None = None) -> Buffer:
        """Add a buffer parameter (`buffer=` adds an existing Buffer object)."""
        buf = buffer if buffer is not None else Buffer(name, tuple(shape), dtype)
        self._prim().params.append(buf)
        return buf

    def scalar_arg(self, name: str, dtype: str = INDEX_DTYPE, *, var: Var | None = None) -> Var:
        """Add a scalar parameter (`var=` adds an existing Var object)."""
        v = var if var is not None else Var(name, dtype)
        self._prim().params.append(v)
        return v

    def func_attr(self, key: str, value: Any) -> None:
        """Set an attribute of the open function."""
        if self._stack:
            self._prim().attrs[key] = value
        elif self._graph is not None:
            self._graph.attrs[key] = value
        else:
            raise IRError("func_attr needs an open function scope")

    @contextmanager
    def _scope(self) -> Iterator[_Frame]:
        frame = _Frame()
        self._stack.append(frame)
        try:
            yield frame
        finally:
            self._stack.pop()

    @contextmanager
    def for_range(
        self, start_or_extent: ExprLike, stop: ExprLike | None = None, *, name: str = "i",
        kind: str = "serial", var: Var | None = None, extent: ExprLike | None = None,
    ) -> Iterator[Var]:
        """`for i in range(stop)` or `range(start, stop)`, like Python's range;
        `for_range(start, extent=n)` gives the extent itself (not folded)."""
        if extent is not None:
            if stop is not None:
                raise IRError("for_range: pass either stop or extent=, not both")
            start = as_expr(start_or_extent, INDEX_DTYPE)
            ext = as_expr(extent, INDEX_DTYPE)
        elif stop is None:
            start, ext = as_expr(0, INDEX_DTYPE), as_expr(start_or_extent, INDEX_DTYPE)
        else:
            start = as_expr(start_or_extent, INDEX_DTYPE)
            end = as_expr(stop, INDEX_DTYPE)
            if isinstance(start, Const) and isinstance(end, Const):
                ext = Const(int(end.value) - int(start.value), start.dtype)
            else:
                ext = end - start
        loop_var = var if var is not None else Var(name, start.dtype)
        with self._scope() as frame:
            yield loop_var
        self._emit_stmt(For(loop_var, start, ext, kind, _body(frame.stmts, f"loop {name}")))

    @contextmanager
    def let(self, name: str, value: ExprLike, *, var: Var | None = None) -> Iterator[Var]:
        """Bind a new variable to `value` for the rest of the block (`declare_let` without
        `with`; `var=` binds an existing Var). The binding is a flat `LetStmt`, so the
        variable stays visible after the `with` too."""
        yield self.declare_let(name, value, var=var)

    def declare_let(self, name: str, value: ExprLike, *, var: Var | None = None) -> Var:
        """Emit a `LetStmt` binding a new variable (or `var`) to `value` and return it."""
        val = as_expr(value)
        v = var if var is not None else Var(name, val.dtype)
        self._emit_stmt(LetStmt(v, val))
        return v

    @contextmanager
    def if_(self, cond: PrimExpr) -> Iterator[None]:
        """The then branch of an IfThenElse; `else_()` right after it adds the else branch."""
        with self._scope() as frame:
            yield
        self._emit_stmt(IfThenElse(cond, _body(frame.stmts, "if"), None))

    @contextmanager
    def while_(self, cond: PrimExpr) -> Iterator[None]:
        """The body of a `While` loop testing `cond` before every iteration."""
        with self._scope() as frame:
            yield
        self._emit_stmt(While(cond, _body(frame.stmts, "while")))

    @contextmanager
    def else_(self) -> Iterator[None]:
        """The else branch of the IfThenElse emitted just before."""
        if not self._stack or not self._stack[-1].stmts:
            raise IRError("else_() must follow an if_() block")
        last = self._stack[-1].stmts[-1]
        if not isinstance(last, IfThenElse) or last.else_body is not None:
            raise IRError("else_() must follow an if_() block without an else")
        with self._scope() as frame:
            yield
        self._stack[-1].stmts[-1] = IfThenElse(last.cond, last.then_body,
                                               _body(frame.stmts, "else"))

    # Declarations are flat statements scoped to the rest of the enclosing block
    # (see `kiln.ir.tensor.Allocate`). The `with` form is kept for readability: it
    # emits the declaration on entry and the statements inside it land in the same
    # block, so the buffer stays visible after the `with` too.

    @contextmanager
    def allocate(
        self, name: str, shape: Sequence[Any], dtype: str, scope: str = "global", *,
        buffer: Buffer | None = None,
    ) -> Iterator[Buffer]:
        """Declare a fresh buffer for the rest of the block (`declare_allocate` without `with`)."""
        yield self.declare_allocate(name, shape, dtype, scope, buffer=buffer)

    def declare_allocate(
        self, name: str, shape: Sequence[Any], dtype: str, scope: str = "global", *,
        buffer: Buffer | None = None,
    ) -> Buffer:
        """Emit an `Allocate` declaration and return its buffer."""
        buf = buffer if buffer is not None else Buffer(name, tuple(shape), dtype, scope)
        self._emit_stmt(Allocate(buf))
        return buf

    @contextmanager
    def alloc_const(
        self, name: str, data: np.ndarray, *, buffer: Buffer | None = None,
    ) -> Iterator[Buffer]:
        """Declare a constant buffer for the rest of the block (`declare_const` without `with`)."""
        yield self.declare_const(name, data, buffer=buffer)

    def declare_const(self, name: str, data: np.ndarray, *, buffer: Buffer | None = None,
                      ) -> Buffer:
        """Emit an `AllocConst` declaration and return its buffer."""
        arr = np.asarray(data)
        buf = buffer if buffer is not None else Buffer(name, arr.shape, from_numpy(arr.dtype))
        self._emit_stmt(AllocConst(buf, arr))
        return buf

    @contextmanager
    def decl_buffer(
        self, name: str, shape: Sequence[Any], dtype: str, source: Buffer,
        byte_offset: int | PrimExpr = 0,
        *, buffer: Buffer | None = None,
    ) -> Iterator[Buffer]:
        """Declare a view for the rest of the block (`declare_view` without `with`)."""
        yield self.declare_view(name, shape, dtype, source, byte_offset, buffer=buffer)

    def declare_view(
        self, name: str, shape: Sequence[Any], dtype: str, source: Buffer,
        byte_offset: int | PrimExpr = 0,
        *, buffer: Buffer | None = None,
    ) -> Buffer:
        """Emit a `DeclBuffer` declaration and return its buffer."""
        buf = buffer if buffer is not None else Buffer(name, tuple(shape), dtype)
        self._emit_stmt(DeclBuffer(buf, source, byte_offset))
        return buf

    def store(self, buffer: Buffer, indices: Sequence[ExprLike], value: ExprLike) -> None:
        """`buffer[indices] = value` (a Python scalar value takes the buffer's dtype)."""
        self._emit_stmt(Store(buffer, as_expr(value, buffer.dtype),
                              tuple(as_expr(i, INDEX_DTYPE) for i in indices)))

    def evaluate(self, value: PrimExpr) -> None:
        """Evaluate `value` for its side effect (e.g. a CallExtern)."""
        self._emit_stmt(Evaluate(value))

    def call_func(self, func: str, args: Sequence[Buffer | ExprLike]) -> None:
        """Call PrimFunc `func` of the module with buffers and scalars."""
        self._emit_stmt(CallFunc(func, tuple(
            a if isinstance(a, Buffer) else as_expr(a) for a in args)))

    def emit_stmt(self, stmt: Stmt) -> None:
        """Append an already-built statement."""
        self._emit_stmt(stmt)

    # ------------------------------------------------------------------ graph level

    @contextmanager
    def function(self, name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[None]:
        """Open a graph-level function; `param`, `emit` and `ret` fill it."""
        if self._stack or self._graph is not None:
            raise IRError(f"function {name!r} opened inside another function")
        frame = _GraphFrame(name, attrs or {})
        self._graph = frame
        try:
            yield
        finally:
            self._graph = None
        if frame.result is None:
            raise IRError(f"graph function {name!r} has no ret(...)")
        self.add_function(name, g.Function(
            tuple(frame.params), tuple(frame.bindings), frame.result, frame.attrs))

    def _gframe(self) -> _GraphFrame:
        if self._graph is None:
            raise IRError("this call needs an open graph function scope")
        return self._graph

    def param(self, name: str, type_or_shape: Type | Sequence[int], dtype: str | None = None,
              ) -> g.Var:
        """Add a graph parameter: `param("x", TensorType(...))` or `param("x", (4,), "float32")`."""
        if isinstance(type_or_shape, (TensorType, g.TupleType)):
            ty: Type = type_or_shape
        else:
            if dtype is None:
                raise IRError("param(name, shape, dtype): dtype is missing")
            ty = TensorType(tuple(type_or_shape), dtype)
        var = g.Var(name, ty)
        self._gframe().params.append(var)
        return var

    def emit(self, value: g.Expr, name: str = "v", *, var: g.Var | None = None) -> g.Var:
        """Bind `value` to a new variable and return it."""
        frame = self._gframe()
        if frame.result is not None:
            raise IRError("emit() after ret()")
        v = var if var is not None else g.Var(name, value.type)
        frame.bindings.append(g.Binding(v, value))
        return v

    def ret(self, value: g.Expr) -> None:
        """Set the result of the open graph function (once)."""
        frame = self._gframe()
        if frame.result is not None:
            raise IRError("ret() called twice")
        frame.result = value
