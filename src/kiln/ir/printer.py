"""Print an IRModule (or one function) as kiln.script DSL text.

The text parses back (`kiln.script.from_source`) to a structurally equal
module: every dtype, loop kind, buffer scope, attribute, extern dependency and
constant is written out. Literals are typed (`T.float32(1.5)`) except int64
ones where a plain Python int reads back as int64; names are made unique and
valid from the nodes' hints.

It is also the IR's only printer for messages: `print_function` records the
lines each statement and binding occupies (the verifier quotes the lines around
a fault, `Printed.excerpt`), and `NodeText` gives one line for any node
(structural-equality diffs, interpreter errors). It lives in `kiln.ir` so the
IR needs nothing above it; `kiln.script` re-exports `print_module` / `print_func`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.literals import (
    array_literal,
    literal,
    literal_is_exact,
    quote,
    special_float_name,
)
from kiln.ir.metadata import ScriptText, format_section
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.names import Namer, is_plain_name, sanitize
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ir.visitor import check_nesting

METADATA_MODES = ("auto", "inline", "reference")
DEFAULT_INLINE_LIMIT = 16
INDENT = "    "
# Signatures longer than this put one parameter per line.
_LINE_LIMIT = 100

# Binding strength, as in Python's grammar (higher binds tighter).
_ATOM, _POW, _UNARY, _MUL, _ADD, _SHIFT, _BAND, _BXOR, _BOR, _CMP = (
    100, 90, 80, 70, 60, 50, 40, 30, 20, 10)
_INFIX: dict[str, tuple[str, int]] = {
    "add": ("+", _ADD), "sub": ("-", _ADD), "mul": ("*", _MUL), "floordiv": ("//", _MUL),
    "floormod": ("%", _MUL), "pow": ("**", _POW), "and": ("&", _BAND), "or": ("|", _BOR),
    "xor": ("^", _BXOR), "shl": ("<<", _SHIFT), "shr": (">>", _SHIFT),
}
_FUNC_BINARY = {"min": "T.min", "max": "T.max", "mod": "T.truncmod"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


# --------------------------------------------------------------------------- API


def print_module(
    mod: IRModule, *, metadata: str = "auto", name: str = "Module",
    inline_limit: int = DEFAULT_INLINE_LIMIT,
) -> ScriptText:
    """The module as DSL text: an `@ir_module` class with one method per function.

    metadata: where constants with more than `inline_limit` elements go:
      "auto"      -> `meta["key"]` references plus a `meta = {...}` section at the
                     end of the text (self-contained);
      "reference" -> `meta["key"]` references only; the arrays are in the
                     returned text's `.metadata` (pass it to `from_source`, or
                     `.save_metadata(path)` as a .npz side file);
      "inline"    -> every constant inline as nested lists.
    Constants with at most `inline_limit` elements print inline, except float
    data holding a NaN with a payload or sign (no literal spells those bits),
    which always goes by reference (in "inline" mode through a section).
    """
    if not isinstance(mod, IRModule):
        raise IRError(f"print_module expects an IRModule, got {type(mod).__name__}")
    if not name.isidentifier():
        raise IRError(f"module class name {name!r} is not a Python identifier")
    printer = _ModulePrinter(metadata, inline_limit)
    lines = ["from kiln.script import G, I, T, ir_module", "", "", "@ir_module",
             f"class {name}:"]
    body: list[str] = []
    if mod.attrs:
        body.append(f"{INDENT}I.module_attrs({literal(dict(mod.attrs))})")
    for fname, fn in mod.items():
        if body:
            body.append("")
        body.extend(printer.function(fname, fn, INDENT))
    lines.extend(body or [f"{INDENT}pass"])
    return printer.finish("\n".join(lines) + "\n")


def print_func(
    func: BaseFunc, name: str = "main", *, metadata: str = "auto",
    inline_limit: int = DEFAULT_INLINE_LIMIT,
) -> ScriptText:
    """One function as a decorated top-level `def`; `from_source` reads it back
    as a one-function IRModule named `name`."""
    if not isinstance(func, (t.PrimFunc, g.Function)):
        raise IRError(f"print_func expects a PrimFunc or Function, got {type(func).__name__}")
    printer = _ModulePrinter(metadata, inline_limit)
    lines = ["from kiln.script import G, T", "", "", *printer.function(name, func, "")]
    return printer.finish("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- module


class _ModulePrinter:
    """State shared by the functions of one module: the metadata table."""

    def __init__(self, mode: str, inline_limit: int, *, for_messages: bool = False) -> None:
        if mode not in METADATA_MODES:
            raise IRError(f"unknown metadata mode {mode!r}; known: {', '.join(METADATA_MODES)}")
        self.mode = mode
        self.inline_limit = inline_limit
        self.meta: dict[str, np.ndarray] = {}
        self._meta_keys: dict[int, str] = {}
        self._key_namer = Namer(frozenset())
        # Messages quote ill-formed IR too: an attribute no literal spells prints as repr.
        self.for_messages = for_messages

    def literal(self, value: Any) -> str:
        try:
            return literal(value)
        except IRError:
            if not self.for_messages:
                raise
            return repr(value)

    def function(self, name: str, fn: BaseFunc, indent: str) -> list[str]:
        check_nesting(fn, f"cannot print function {name!r}")
        if isinstance(fn, t.PrimFunc):
            return _PrimPrinter(self, indent).function(name, fn)
        if isinstance(fn, g.Function):
            return _GraphPrinter(self, indent).function(name, fn)
        raise IRError(f"cannot print {type(fn).__name__} {name!r}")

    def finish(self, text: str) -> ScriptText:
        # "inline" text still needs a section for data no literal can spell exactly.
        if self.mode in ("auto", "inline") and self.meta:
            return ScriptText(text + "\n\n" + format_section(self.meta))
        return ScriptText(text, self.meta if self.mode == "reference" else None)

    def data_args(self, arr: np.ndarray, hint: str) -> list[str]:
        """Arguments that recreate `arr`: [nested list, dtype] or [meta reference]."""
        try:
            dtype = dt.from_numpy(arr.dtype)
        except IRError:
            dtype = ""
        inline = self.mode == "inline" or arr.size <= self.inline_limit
        if inline and dtype and literal_is_exact(arr):
            args = [array_literal(arr), quote(dtype)]
            if arr.size == 0 and arr.ndim != 1:
                args.append(f"shape={literal(tuple(int(d) for d in arr.shape))}")
            return args
        key = self._meta_keys.get(id(arr))
        if key is None:
            key = self._key_namer.fresh(hint, "const")
            self._meta_keys[id(arr)] = key
            self.meta[key] = arr
        return [f"meta[{quote(key)}]"]


def _decorator(ns: str, kind: str, name: str, indent: str) -> tuple[str, str]:
    """The decorator line and the `def` name for function `name`."""
    if is_plain_name(name):
        return f"{indent}@{ns}.{kind}", name
    return f"{indent}@{ns}.{kind}(name={quote(name)})", sanitize(name, "f") + "_"


def _signature(indent: str, name: str, params: list[str], ret: str) -> list[str]:
    one_line = f"{indent}def {name}({', '.join(params)}){ret}:"
    if len(one_line) <= _LINE_LIMIT or not params:
        return [one_line]
    inner = indent + INDENT
    return [f"{indent}def {name}(", *(f"{inner}{p}," for p in params), f"{indent}){ret}:"]


# --------------------------------------------------------------------------- tensor level


def _is_plain(e: object, ctx: str | None) -> bool:
    """True if Const `e` may print as a bare int: the parser reads it back as int64."""
    return (isinstance(e, t.Const) and e.dtype == INDEX_DTYPE
            and (ctx is None or ctx == INDEX_DTYPE))


class _ExprPrinter:
    """Tensor-level expressions, with Python precedence and typed literals."""

    def __init__(self, namer: Namer) -> None:
        self.namer = namer

    def text(self, e: t.PrimExpr, ctx: str | None = None) -> str:
        return self.expr(e, ctx)[0]

    def var(self, v: t.Var) -> str:
        return self.namer.name(v, v.name)

    def buffer(self, b: t.Buffer) -> str:
        return self.namer.name(b, b.name, "buf")

    def typed_const(self, c: t.Const) -> str:
        if isinstance(c.value, bool):
            value = repr(c.value)
        elif isinstance(c.value, float):
            special = special_float_name(c.value)
            value = quote(special) if special else repr(c.value)
        else:
            value = str(c.value)
        return f"T.{c.dtype}({value})"

    def expr(self, e: t.PrimExpr, ctx: str | None = None) -> tuple[str, int]:
        """(text, binding strength) of `e`; `ctx` is the dtype a bare literal adopts."""
        rule = _EXPR_RULES.get(type(e))
        if rule is None:
            raise IRError(f"cannot print tensor-level expression {type(e).__name__}")
        return rule(self, e, ctx)

    def _const(self, e: t.Const, ctx: str | None) -> tuple[str, int]:
        if _is_plain(e, ctx):
            return str(e.value), (_UNARY if int(e.value) < 0 else _ATOM)
        return self.typed_const(e), _ATOM

    def _var(self, e: t.Var, ctx: str | None) -> tuple[str, int]:
        return self.var(e), _ATOM

    def _binary_op(self, e: t.BinaryOp, ctx: str | None) -> tuple[str, int]:
        return self._binary(e)

    def _compare(self, e: t.Compare, ctx: str | None) -> tuple[str, int]:
        sym = _COMPARE[e.op]
        a, b = self._operands(e.a, e.b)
        # `a ^ b == c` is `(a ^ b) == c` in Python, but few readers know it.
        need_a = _ATOM if _is_bitwise(e.a) else _CMP + 1
        need_b = _ATOM if _is_bitwise(e.b) else _CMP + 1
        return f"{self._wrap(a, need_a)} {sym} {self._wrap(b, need_b)}", _CMP

    def _unary(self, e: t.UnaryOp, ctx: str | None) -> tuple[str, int]:
        sym = "-" if e.op == "neg" else "~"
        operand = self.typed_const(e.a) if isinstance(e.a, t.Const) else None
        if operand is None:
            text, prec = self.expr(e.a)
            operand = text if prec >= _ATOM else f"({text})"
        return f"{sym}{operand}", _UNARY

    def _select(self, e: t.Select, ctx: str | None) -> tuple[str, int]:
        return (f"T.select({self.text(e.cond)}, {self.text(e.true_value, e.false_value.dtype)}"
                f", {self.text(e.false_value, e.true_value.dtype)})"), _ATOM

    def _cast(self, e: t.Cast, ctx: str | None) -> tuple[str, int]:
        return f"T.cast({self.text(e.value)}, {quote(e.dtype)})", _ATOM

    def _reinterpret(self, e: t.Reinterpret, ctx: str | None) -> tuple[str, int]:
        return f"T.reinterpret({self.text(e.value)}, {quote(e.dtype)})", _ATOM

    def _load(self, e: t.Load, ctx: str | None) -> tuple[str, int]:
        return f"{self.buffer(e.buffer)}[{self.indices(e.indices)}]", _ATOM

    def _intrin(self, e: t.Intrin, ctx: str | None) -> tuple[str, int]:
        return f"T.{e.name}({', '.join(self._call_args(e.args))})", _ATOM

    def _extern(self, e: t.CallExtern, ctx: str | None) -> tuple[str, int]:
        return self._call_extern(e), _ATOM

    def indices(self, indices: tuple[t.PrimExpr, ...]) -> str:
        if not indices:
            return "()"
        return ", ".join(self.text(i, INDEX_DTYPE) for i in indices)

    def shape(self, shape: tuple[Any, ...]) -> str:
        dims = []
        for d in shape:
            if isinstance(d, int) and not isinstance(d, bool):
                dims.append(str(d))
            elif isinstance(d, t.Const):
                dims.append(self.typed_const(d))  # a bare int would read back as int
            elif isinstance(d, t.PrimExpr):
                dims.append(self.text(d, INDEX_DTYPE))
            else:
                raise IRError(f"cannot print shape dimension {d!r}")
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"

    @staticmethod
    def _wrap(part: tuple[str, int], need: int) -> str:
        text, prec = part
        return text if prec >= need else f"({text})"

    def _operands(self, a: t.PrimExpr, b: t.PrimExpr) -> tuple[tuple[str, int], tuple[str, int]]:
        # Two bare literals would be folded by the parser (Python arithmetic):
        # print the left one typed so the node survives.
        if _is_plain(a, b.dtype) and _is_plain(b, a.dtype):
            assert isinstance(a, t.Const)
            return (self.typed_const(a), _ATOM), self.expr(b, a.dtype)
        return self.expr(a, b.dtype), self.expr(b, a.dtype)

    def _binary(self, e: t.BinaryOp) -> tuple[str, int]:
        if e.op in _FUNC_BINARY or (e.op == "div" and not dt.is_float(e.dtype)):
            fn = _FUNC_BINARY.get(e.op, "T.truncdiv")
            return f"{fn}({self.text(e.a, e.b.dtype)}, {self.text(e.b, e.a.dtype)})", _ATOM
        sym, prec = ("/", _MUL) if e.op == "div" else _INFIX[e.op]
        a, b = self._operands(e.a, e.b)
        if e.op == "pow":  # right-associative; the exponent may be a unary expression
            return f"{self._wrap(a, _ATOM)} ** {self._wrap(b, _UNARY)}", _POW
        left, right = prec, prec + 1
        if e.op in _BITWISE:
            # Python's precedence among & ^ | << >> surprises readers: parenthesize
            # any other operator inside them.
            left = _ATOM if _mixes_bitwise(e.a, e.op) else left
            right = _ATOM if _mixes_bitwise(e.b, e.op) else right
        return f"{self._wrap(a, left)} {sym} {self._wrap(b, right)}", prec

    def _call_args(self, args: tuple[t.PrimExpr, ...]) -> list[str]:
        out = []
        for k, a in enumerate(args):
            others = [x.dtype for j, x in enumerate(args) if j != k]
            plain = _is_plain(a, None) and all(d == INDEX_DTYPE for d in others)
            out.append(self.text(a) if plain or not isinstance(a, t.Const)
                       else self.typed_const(a))
        return out

    def arg(self, a: t.PrimExpr | t.Buffer) -> str:
        return self.buffer(a) if isinstance(a, t.Buffer) else self.text(a)

    def _call_extern(self, e: t.CallExtern) -> str:
        parts = [quote(e.name), *(self.arg(a) for a in e.args), f"dtype={quote(e.dtype)}"]
        if e.dependency is not None:
            parts.append(f"dependency={extern_dependency_text(e.dependency)}")
        return f"T.call_extern({', '.join(parts)})"


# Dispatch tables: node type -> the method that prints it.
_EXPR_RULES: dict[type, Callable[[_ExprPrinter, Any, str | None], tuple[str, int]]] = {
    t.Const: _ExprPrinter._const, t.Var: _ExprPrinter._var, t.BinaryOp: _ExprPrinter._binary_op,
    t.Compare: _ExprPrinter._compare, t.UnaryOp: _ExprPrinter._unary,
    t.Select: _ExprPrinter._select, t.Cast: _ExprPrinter._cast, t.Load: _ExprPrinter._load,
    t.Reinterpret: _ExprPrinter._reinterpret, t.Intrin: _ExprPrinter._intrin,
    t.CallExtern: _ExprPrinter._extern,
}


_BITWISE = frozenset({"and", "or", "xor", "shl", "shr"})


def _is_bitwise(e: t.PrimExpr) -> bool:
    return isinstance(e, t.BinaryOp) and e.op in _BITWISE


def _mixes_bitwise(child: t.PrimExpr, op: str) -> bool:
    """True if `child` is an infix operation other than `op` (or a comparison)."""
    if isinstance(child, t.Compare):
        return True
    return isinstance(child, t.BinaryOp) and child.op != op and child.op in _INFIX


def extern_dependency_text(dep: t.ExternDependency) -> str:
    """`T.extern_dependency(...)` source that recreates `dep`."""
    parts = [quote(dep.short_name)]
    for key in ("version_spec", "url", "url_type"):
        value = getattr(dep, key)
        if value:
            parts.append(f"{key}={quote(value)}")
    if dep.libs:
        parts.append(f"libs={literal(tuple(dep.libs))}")
    return f"T.extern_dependency({', '.join(parts)})"


class _PrimPrinter:
    """One PrimFunc."""

    def __init__(self, module: _ModulePrinter, indent: str) -> None:
        self.module = module
        self.indent = indent
        self.namer = Namer()
        self.ex = _ExprPrinter(self.namer)
        self.lines: list[str] = []
        # id(statement) -> (first, last) line in `lines`; `keep` holds the nodes so ids stay
        # unique while the spans are used.
        self.spans: dict[int, tuple[int, int]] = {}
        self.keep: list[object] = []

    def function(self, name: str, fn: t.PrimFunc) -> list[str]:
        deco, def_name = _decorator("T", "prim_func", name, self.indent)
        # Name every parameter first: buffer shapes may use later scalar params.
        for p in fn.params:
            if isinstance(p, t.Buffer):
                self.ex.buffer(p)
            else:
                self.ex.var(p)
        params = [self._param(p) for p in fn.params]
        self.lines = [deco, *_signature(self.indent, def_name, params, "")]
        inner = self.indent + INDENT
        if fn.attrs:
            self.lines.append(f"{inner}T.func_attr({self.module.literal(dict(fn.attrs))})")
        self.stmt(fn.body, inner)
        return self.lines

    def _param(self, p: t.Param) -> str:
        if isinstance(p, t.Buffer):
            scope = "" if p.scope == "global" else f", scope={quote(p.scope)}"
            return (f"{self.ex.buffer(p)}: T.Buffer({self.ex.shape(p.shape)}, "
                    f"{quote(p.dtype)}{scope})")
        if isinstance(p, t.Var):
            return f"{self.ex.var(p)}: T.{p.dtype}"
        raise IRError(f"cannot print PrimFunc parameter {p!r}")

    def _emit(self, indent: str, text: str) -> None:
        self.lines.append(indent + text)

    def _block(self, s: t.Stmt, indent: str) -> None:
        self.stmt(s, indent + INDENT)

    def stmt(self, s: t.Stmt, indent: str) -> None:
        handler = self._HANDLERS.get(type(s))
        if handler is None:
            raise IRError(f"cannot print tensor-level statement {type(s).__name__}")
        first = len(self.lines)
        handler(self, s, indent)
        self._span(s, first)

    def _span(self, node: object, first: int) -> None:
        self.spans[id(node)] = (first, len(self.lines) - 1)
        self.keep.append(node)

    def _seq(self, s: t.SeqStmt, indent: str) -> None:
        if not s.body:
            self._emit(indent, "pass")
        for child in s.body:
            self.stmt(child, indent)

    def _store(self, s: t.Store, indent: str) -> None:
        target = f"{self.ex.buffer(s.buffer)}[{self.ex.indices(s.indices)}]"
        self._emit(indent, f"{target} = {self.ex.text(s.value, s.buffer.dtype)}")

    def _for(self, s: t.For, indent: str) -> None:
        var = self.ex.var(s.var)
        start, ext = s.start, s.extent
        if (s.var.dtype == start.dtype == ext.dtype == INDEX_DTYPE
                and isinstance(start, t.Const) and start.value == 0):
            args = self.ex.text(ext, INDEX_DTYPE)
        elif (isinstance(start, t.Const) and isinstance(ext, t.Const)
              and start.dtype == ext.dtype == s.var.dtype and dt.is_int(start.dtype)):
            stop = t.Const(int(start.value) + int(ext.value), start.dtype)
            args = f"{self.ex.text(start, INDEX_DTYPE)}, {self.ex.text(stop, INDEX_DTYPE)}"
        else:
            args = f"{self.ex.text(start, INDEX_DTYPE)}, extent={self.ex.text(ext, INDEX_DTYPE)}"
            if s.var.dtype != start.dtype:
                args += f", dtype={quote(s.var.dtype)}"
        self._emit(indent, f"for {var} in T.{s.kind}({args}):")
        self._block(s.body, indent)

    def _let(self, s: t.LetStmt, indent: str) -> None:
        value = self.ex.text(s.value)
        extra = "" if s.var.dtype == s.value.dtype else f", dtype={quote(s.var.dtype)}"
        self._emit(indent, f"{self.ex.var(s.var)} = T.let({value}{extra})")

    def _if(self, s: t.IfThenElse, indent: str, keyword: str = "if") -> None:
        self._emit(indent, f"{keyword} {self.ex.text(s.cond)}:")
        self._block(s.then_body, indent)
        if isinstance(s.else_body, t.IfThenElse):
            first = len(self.lines)
            self._if(s.else_body, indent, "elif")
            self._span(s.else_body, first)
        elif s.else_body is not None:
            self._emit(indent, "else:")
            self._block(s.else_body, indent)

    def _while(self, s: t.While, indent: str) -> None:
        self._emit(indent, f"while {self.ex.text(s.cond)}:")
        self._block(s.body, indent)

    def _allocate(self, s: t.Allocate, indent: str) -> None:
        b = s.buffer
        # A declaration: the buffer is in scope for the rest of the block.
        self._emit(indent, f"{self.ex.buffer(b)} = T.allocate({self.ex.shape(b.shape)}, "
                           f"{quote(b.dtype)}, scope={quote(b.scope)})")

    def _alloc_const(self, s: t.AllocConst, indent: str) -> None:
        b = s.buffer
        # The key follows the printed name, which is stable from one round trip to the next.
        args = self.module.data_args(s.data, self.ex.buffer(b))
        data_shape = tuple(int(d) for d in s.data.shape)
        if b.shape != data_shape:
            args.append(f"buffer_shape={self.ex.shape(b.shape)}")
        try:
            data_dtype = dt.from_numpy(s.data.dtype)
        except IRError:
            data_dtype = ""
        if b.dtype != data_dtype:
            args.append(f"buffer_dtype={quote(b.dtype)}")
        if b.scope != "global":
            args.append(f"scope={quote(b.scope)}")
        self._emit(indent, f"{self.ex.buffer(b)} = T.alloc_const({', '.join(args)})")

    def _decl_buffer(self, s: t.DeclBuffer, indent: str) -> None:
        b = s.buffer
        scope = "" if b.scope == "global" else f", scope={quote(b.scope)}"
        self._emit(indent, f"{self.ex.buffer(b)} = T.decl_buffer({self.ex.shape(b.shape)}, "
                           f"{quote(b.dtype)}, source={self.ex.buffer(s.source)}, "
                           f"byte_offset={self._offset(s.byte_offset)}{scope})")

    def _offset(self, offset: int | t.PrimExpr) -> str:
        return str(offset) if isinstance(offset, int) else self.ex.expr(offset, "int64")[0]

    def _evaluate(self, s: t.Evaluate, indent: str) -> None:
        self._emit(indent, f"T.evaluate({self.ex.text(s.value)})")

    def _call_func(self, s: t.CallFunc, indent: str) -> None:
        args = ", ".join(self.ex.arg(a) for a in s.args)
        self._emit(indent, f"T.call_func({quote(s.func)}, [{args}])")

    _HANDLERS: dict[type, Callable[[Any, Any, str], None]] = {
        t.SeqStmt: _seq, t.Store: _store, t.For: _for, t.LetStmt: _let, t.IfThenElse: _if,
        t.While: _while,
        t.Allocate: _allocate, t.AllocConst: _alloc_const, t.DeclBuffer: _decl_buffer,
        t.Evaluate: _evaluate, t.CallFunc: _call_func,
    }


# --------------------------------------------------------------------------- graph level


class _GraphPrinter:
    """One graph-level Function."""

    def __init__(self, module: _ModulePrinter, indent: str) -> None:
        self.module = module
        self.indent = indent
        self.namer = Namer()
        self.ex = _ExprPrinter(self.namer)  # symbolic dims of tensor types
        self.spans: dict[int, tuple[int, int]] = {}  # id(binding or result) -> its line
        self.keep: list[object] = []

    def function(self, name: str, fn: g.Function) -> list[str]:
        deco, def_name = _decorator("G", "function", name, self.indent)
        for p in fn.params:
            self.var(p)
        params = [f"{self.var(p)}: {self.type(p.var_type)}" for p in fn.params]
        try:
            ret = f" -> {self.type(fn.ret_type)}"
        except IRError:  # ill-typed result: print the function anyway
            ret = ""
        lines = [deco, *_signature(self.indent, def_name, params, ret)]
        inner = self.indent + INDENT
        if fn.attrs:
            lines.append(f"{inner}G.func_attr({self.module.literal(dict(fn.attrs))})")
        for b in fn.bindings:
            self.spans[id(b)] = (len(lines), len(lines))
            lines.append(f"{inner}{self.binding(b)}")
        self.spans[id(fn.result)] = (len(lines), len(lines))
        self.keep.extend((*fn.bindings, fn.result))
        lines.append(f"{inner}return {self.expr(fn.result)}")
        return lines

    def binding(self, b: g.Binding) -> str:
        value = self.expr(b.value, b.var.var_type)
        return f"{self.var(b.var)}: {self.type(b.var.var_type)} = {value}"

    def var(self, v: g.Var) -> str:
        return self.namer.name(v, v.name)

    def type(self, ty: Type) -> str:
        if isinstance(ty, TensorType):
            return f"G.Tensor({self.ex.shape(ty.shape)}, {quote(ty.dtype)})"
        if isinstance(ty, TupleType):
            return f"G.Tuple({', '.join(self.type(f) for f in ty.fields)})"
        raise IRError(f"cannot print graph type {ty!r}")

    def expr(self, e: g.Expr, binding_type: Type | None = None) -> str:
        """`e` as text; a Call may omit `ret=` when it equals the binding's type."""
        rule = _GRAPH_RULES.get(type(e))
        if rule is None:
            raise IRError(f"cannot print graph-level expression {type(e).__name__}")
        return rule(self, e, binding_type)

    def _var(self, e: g.Var, binding_type: Type | None) -> str:
        return self.var(e)

    def _constant(self, e: g.Constant, binding_type: Type | None) -> str:
        args = self.module.data_args(e.data, e.name or "const")
        if e.name:
            args.append(f"name={quote(e.name)}")
        return f"G.const({', '.join(args)})"

    def _call(self, e: g.Call, binding_type: Type | None) -> str:
        parts = [quote(e.op), *(self.expr(a) for a in e.args)]
        parts.extend(_call_attrs(e.attrs, self.module.literal))
        if binding_type is None or binding_type != e.ret_type:
            parts.append(f"ret={self.type(e.ret_type)}")
        return f"G.op({', '.join(parts)})"

    def _call_tensor(self, e: g.CallTensor, binding_type: Type | None) -> str:
        call_args = ", ".join(self.expr(a) for a in e.args)
        return f"G.call_tensor({quote(e.func)}, [{call_args}], {self.type(e.ret_type)})"

    def _if_expr(self, e: g.If, binding_type: Type | None) -> str:
        args = ", ".join(self.expr(a) for a in e.args)
        text = (f"G.if_then_else({self.expr(e.cond)}, [{args}], "
                f"then_branch={quote(e.then_branch)}, else_branch={quote(e.else_branch)}")
        if binding_type is None or binding_type != e.ret_type:
            text += f", ret={self.type(e.ret_type)}"
        return text + ")"

    def _loop(self, e: g.Loop, binding_type: Type | None) -> str:
        states = ", ".join(self.expr(a) for a in e.states)
        parts = [quote(e.body), f"[{states}]"]
        if e.captures:
            parts.append(f"captures=[{', '.join(self.expr(a) for a in e.captures)}]")
        if e.trip_count is not None:
            parts.append(f"trip_count={self.expr(e.trip_count)}")
        if e.cond is not None:
            parts.append(f"cond={self.expr(e.cond)}")
        if binding_type is None or binding_type != e.ret_type:
            parts.append(f"ret={self.type(e.ret_type)}")
        return f"G.loop({', '.join(parts)})"

    def _tuple(self, e: g.Tuple, binding_type: Type | None) -> str:
        fields = [self.expr(f) for f in e.fields]
        return f"({fields[0]},)" if len(fields) == 1 else f"({', '.join(fields)})"

    def _get_item(self, e: g.TupleGetItem, binding_type: Type | None) -> str:
        return f"{self.expr(e.tuple_value)}[{e.index}]"


_GRAPH_RULES: dict[type, Callable[[_GraphPrinter, Any, Type | None], str]] = {
    g.Var: _GraphPrinter._var, g.Constant: _GraphPrinter._constant, g.Call: _GraphPrinter._call,
    g.CallTensor: _GraphPrinter._call_tensor, g.Tuple: _GraphPrinter._tuple,
    g.TupleGetItem: _GraphPrinter._get_item, g.If: _GraphPrinter._if_expr,
    g.Loop: _GraphPrinter._loop,
}


# Keyword names G.op itself takes; attributes with these names go in attrs={...}.
_OP_KEYWORDS = frozenset({"ret", "attrs"})


def _call_attrs(attrs: Mapping[str, Any], literal: Callable[[Any], str]) -> list[str]:
    if not attrs:
        return []
    if all(is_plain_name(k) and k not in _OP_KEYWORDS for k in attrs):
        return [f"{k}={literal(v)}" for k, v in attrs.items()]
    return [f"attrs={literal(dict(attrs))}"]


# --------------------------------------------------------------------------- messages


class NodeText:
    """One line of DSL text for any node, for messages; names stay consistent across
    calls (and with the function text a `Printed` came from).

    Statements print their first line (`for i in T.serial(4): ...` for one with a
    body). Ill-formed IR is what messages describe, so a node the DSL cannot spell
    prints as `<TypeName>` instead of raising.
    """

    def __init__(self, ex: _ExprPrinter | None = None) -> None:
        module = _ModulePrinter("reference", DEFAULT_INLINE_LIMIT, for_messages=True)
        self._prim = _PrimPrinter(module, "")
        self._graph = _GraphPrinter(module, "")
        if ex is not None:
            self._prim.ex, self._prim.namer = ex, ex.namer
        self._graph.ex, self._graph.namer = self._prim.ex, self._prim.namer

    def node(self, node: object) -> str:
        """`node` as one line."""
        try:
            return self._text(node)
        except Exception:  # a message must not fail on the IR it reports
            return f"<{type(node).__name__}>"

    def _text(self, node: object) -> str:
        if isinstance(node, t.Stmt):
            self._prim.lines = []
            self._prim.stmt(node, "")
            lines = self._prim.lines
            return lines[0] + (" ..." if len(lines) > 1 else "")
        if isinstance(node, t.Buffer):
            return self._prim.ex.buffer(node)
        if isinstance(node, t.PrimExpr):
            return self._prim.ex.text(node)
        if isinstance(node, g.Binding):
            return self._graph.binding(node)
        if isinstance(node, g.Expr):
            return self._graph.expr(node)
        if isinstance(node, (TensorType, TupleType)):
            return self._graph.type(node)
        if isinstance(node, t.PrimFunc):
            return f"<PrimFunc({', '.join(self._prim._param(p) for p in node.params)})>"
        if isinstance(node, g.Function):
            params = ", ".join(f"{self._graph.var(p)}: {self._graph.type(p.var_type)}"
                               for p in node.params)
            return f"<Function({params})>"
        if isinstance(node, np.ndarray):
            return f"<{node.dtype} array {tuple(node.shape)}>"
        return repr(node)


@dataclass
class Printed:
    """A function's DSL text with the lines of each statement and binding."""

    lines: list[str]
    # id(node) -> (first line, last line), 0-based, inclusive.
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    # One-line text of nodes, named as in `lines`.
    nodes: NodeText = field(default_factory=NodeText)
    keep: list[object] = field(default_factory=list)  # the spanned nodes, so ids stay valid

    def text(self) -> str:
        return "\n".join(self.lines)

    def excerpt(self, node: object, context: int = 3) -> str:
        """Numbered lines around `node`, its line(s) marked `>`; the start of the
        function if `node` has no line of its own."""
        lines = self.lines
        span = self.spans.get(id(node))
        width = len(str(len(lines)))
        if span is None:
            lo, hi, mark = 0, min(len(lines), 2 * context + 4) - 1, (-1, -1)
        else:
            first, last = span
            # A statement with a body is marked by its header line only.
            if last > first and not isinstance(node, (t.Store, t.Evaluate, t.CallFunc)):
                last = first
            lo, hi = max(0, first - context), min(len(lines) - 1, last + context)
            mark = (first, last)
        out = []
        if lo > 0:
            out.append(" " * (width + 5) + "...")
        for i in range(lo, hi + 1):
            arrow = ">" if mark[0] <= i <= mark[1] else " "
            out.append(f"  {arrow} {i + 1:>{width}} | {lines[i]}")
        if hi < len(lines) - 1:
            out.append(" " * (width + 5) + "...")
        return "\n".join(out)


def print_function(name: str, fn: BaseFunc) -> Printed:
    """`fn` as DSL text with line spans, for messages: constants above the inline
    limit print as `meta[...]` references (the text has no metadata section)."""
    module = _ModulePrinter("reference", DEFAULT_INLINE_LIMIT, for_messages=True)
    if isinstance(fn, t.PrimFunc):
        prim = _PrimPrinter(module, "")
        lines = prim.function(name, fn)
        return Printed(lines, prim.spans, NodeText(prim.ex), prim.keep)
    if isinstance(fn, g.Function):
        graph = _GraphPrinter(module, "")
        lines = graph.function(name, fn)
        return Printed(lines, graph.spans, NodeText(graph.ex), graph.keep)
    raise IRError(f"cannot print {type(fn).__name__} {name!r}")
