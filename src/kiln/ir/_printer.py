"""A compact text form of IR nodes, for error messages only.

This is not the DSL (kiln.script prints and parses that); it only has to be
readable and to know which lines each statement occupies, so the verifier can
quote the IR around a fault and mark the faulty line. It looks like the DSL
(`X[i] + T.float32(1)`) so messages read the same whichever printer is used.

Names are hints: distinct nodes that share a hint get suffixes (`i`, `i_1`).
The printer used by the verifier is pluggable (`set_function_printer`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.names import Namer
from kiln.ir.types import TensorType, TupleType, Type

# Python-like binding strength of infix operators (higher binds tighter).
_INFIX: dict[str, tuple[str, int]] = {
    "or": ("|", 2), "xor": ("^", 3), "and": ("&", 4), "shl": ("<<", 5), "shr": (">>", 5),
    "add": ("+", 6), "sub": ("-", 6), "mul": ("*", 7), "floordiv": ("//", 7),
    "floormod": ("%", 7),
}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_PREC_COMPARE = 1
_PREC_UNARY = 8
_PREC_ATOM = 10
_LOOP_KINDS = {"serial": "serial", "parallel": "parallel", "vectorized": "vectorized",
               "unrolled": "unroll"}


def format_const(c: t.Const) -> str:
    if c.dtype == "bool":
        return "True" if c.value else "False"
    if dt.is_float(c.dtype):
        v = float(c.value)
        if math.isnan(v) or math.isinf(v):
            text = f'"{v}"'
        elif v.is_integer() and abs(v) < 1e16:
            text = str(int(v))
        else:
            text = repr(v)
        return f"T.{c.dtype}({text})"
    if c.dtype == INDEX_DTYPE:
        return str(c.value)
    return f"T.{c.dtype}({c.value})"


def format_type(ty: Type) -> str:
    if isinstance(ty, TensorType):
        return f"R.Tensor({_shape(ty.shape)}, \"{ty.dtype}\")"
    if isinstance(ty, TupleType):
        return f"R.Tuple({', '.join(format_type(f) for f in ty.fields)})"
    return repr(ty)


def _shape(shape: tuple[object, ...]) -> str:
    items = [str(d) for d in shape]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def format_array(data: object) -> str:
    shape = getattr(data, "shape", ())
    dtype = getattr(data, "dtype", "?")
    return f"<{dtype} array {_shape(tuple(shape))}>"


class Printer:
    """Prints nodes; one instance shares one Namer so names stay consistent."""

    def __init__(self, namer: Namer | None = None) -> None:
        self.namer = namer or Namer()

    # ------------------------------------------------------------------ tensor level

    def var(self, v: t.Var) -> str:
        return self.namer.name(v, v.name)

    def buffer(self, b: t.Buffer) -> str:
        return self.namer.name(b, b.name)

    def expr(self, e: object) -> str:
        return self._expr(e)[0]

    def _expr(self, e: object) -> tuple[str, int]:
        if isinstance(e, t.Var):
            return self.var(e), _PREC_ATOM
        if isinstance(e, t.Const):
            return format_const(e), _PREC_ATOM
        if isinstance(e, t.Buffer):
            return self.buffer(e), _PREC_ATOM
        if isinstance(e, t.BinaryOp):
            return self._binary(e)
        if isinstance(e, t.Compare):
            sym = _COMPARE.get(e.op, e.op)
            return (f"{self._operand(e.a, _PREC_COMPARE + 1)} {sym} "
                    f"{self._operand(e.b, _PREC_COMPARE + 1)}"), _PREC_COMPARE
        if isinstance(e, t.UnaryOp):
            if e.op == "neg":
                return f"-{self._operand(e.a, _PREC_UNARY)}", _PREC_UNARY
            if e.a.dtype == "bool":
                return f"T.Not({self.expr(e.a)})", _PREC_ATOM
            return f"~{self._operand(e.a, _PREC_UNARY)}", _PREC_UNARY
        if isinstance(e, t.Select):
            return (f"T.Select({self.expr(e.cond)}, {self.expr(e.true_value)}, "
                    f"{self.expr(e.false_value)})"), _PREC_ATOM
        if isinstance(e, t.Cast):
            return f'T.Cast("{e.dtype}", {self.expr(e.value)})', _PREC_ATOM
        if isinstance(e, t.Load):
            idx = ", ".join(self.expr(i) for i in e.indices)
            return f"{self.buffer(e.buffer)}[{idx}]", _PREC_ATOM
        if isinstance(e, t.Intrin):
            return f"T.{e.name}({', '.join(self.expr(a) for a in e.args)})", _PREC_ATOM
        if isinstance(e, t.CallExtern):
            args = "".join(f", {self.expr(a)}" for a in e.args)
            return f'T.call_extern("{e.dtype}", "{e.name}"{args})', _PREC_ATOM
        if isinstance(e, g.Expr):
            return self.graph_expr(e), _PREC_ATOM
        return repr(e), _PREC_ATOM

    def _operand(self, e: object, min_prec: int) -> str:
        text, prec = self._expr(e)
        return f"({text})" if prec < min_prec else text

    def _binary(self, e: t.BinaryOp) -> tuple[str, int]:
        if e.op in _INFIX:
            sym, prec = _INFIX[e.op]
            return (f"{self._operand(e.a, prec)} {sym} "
                    f"{self._operand(e.b, prec + 1)}"), prec
        if e.op == "div" and dt.is_float(e.dtype):
            return f"{self._operand(e.a, 7)} / {self._operand(e.b, 8)}", 7
        name = {"div": "truncdiv", "mod": "truncmod"}.get(e.op, e.op)
        return f"T.{name}({self.expr(e.a)}, {self.expr(e.b)})", _PREC_ATOM

    def buffer_decl(self, b: t.Buffer) -> str:
        scope = "" if b.scope == "global" else f', scope="{b.scope}"'
        return f'T.Buffer({_shape(b.shape)}, "{b.dtype}"{scope})'

    def stmt_header(self, s: t.Stmt) -> str:
        """The first line of a statement (the whole statement if it has no body)."""
        out = Lines(self)
        out.stmt(s, 0)
        first = out.lines[0] if out.lines else ""
        return first + (" ..." if len(out.lines) > 1 else "")

    # ------------------------------------------------------------------ graph level

    def gvar(self, v: g.Var) -> str:
        return self.namer.name(v, v.name)

    def graph_expr(self, e: object) -> str:
        if isinstance(e, g.Var):
            return self.gvar(e)
        if isinstance(e, g.Constant):
            label = f"{e.name}: " if e.name else ""
            return f"R.const({label}{format_array(e.data)})"
        if isinstance(e, g.Call):
            parts = [self.graph_expr(a) for a in e.args]
            parts += [f"{k}={v!r}" for k, v in e.attrs.items()]
            return f"R.op.{e.op}({', '.join(parts)})"
        if isinstance(e, g.CallTensor):
            args = ", ".join(self.graph_expr(a) for a in e.args)
            if len(e.args) == 1:
                args += ","
            return f'R.call_tensor("{e.func}", ({args}), {format_type(e.ret_type)})'
        if isinstance(e, g.Tuple):
            items = [self.graph_expr(f) for f in e.fields]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if isinstance(e, g.TupleGetItem):
            return f"{self.graph_expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, (t.PrimExpr, t.Buffer)):
            return self.expr(e)
        return repr(e)

    def node(self, node: object) -> str:
        """One line for any node: expressions in full, statements by their first line."""
        if isinstance(node, t.Stmt):
            return self.stmt_header(node)
        if isinstance(node, (t.PrimExpr, t.Buffer)):
            return self.expr(node)
        if isinstance(node, g.Binding):
            return f"{self.gvar(node.var)} = {self.graph_expr(node.value)}"
        if isinstance(node, g.Expr):
            return self.graph_expr(node)
        if isinstance(node, (TensorType, TupleType)):
            return format_type(node)
        if isinstance(node, t.PrimFunc):
            return f"<PrimFunc({', '.join(self._param(p) for p in node.params)})>"
        if isinstance(node, g.Function):
            return f"<Function({', '.join(self._gparam(p) for p in node.params)})>"
        if isinstance(node, IRModule):
            return repr(node)
        if hasattr(node, "shape") and hasattr(node, "dtype"):
            return format_array(node)
        return repr(node)

    def _param(self, p: t.Param) -> str:
        if isinstance(p, t.Buffer):
            return f"{self.buffer(p)}: {self.buffer_decl(p)}"
        return f"{self.var(p)}: T.{p.dtype}"

    def _gparam(self, p: g.Var) -> str:
        return f"{self.gvar(p)}: {format_type(p.var_type)}"


@dataclass
class Printed:
    """Printed text of a function with the line span of every statement/binding."""

    lines: list[str] = field(default_factory=list)
    # id(node) -> (first line, last line), 0-based, inclusive.
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)

    def text(self) -> str:
        return "\n".join(self.lines)


class Lines:
    """Accumulates the lines of a function and records the span of each statement."""

    def __init__(self, printer: Printer) -> None:
        self.p = printer
        self.lines: list[str] = []
        self.spans: dict[int, tuple[int, int]] = {}
        self._keep: list[object] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def _mark(self, node: object, first: int) -> None:
        self.spans[id(node)] = (first, len(self.lines) - 1)
        self._keep.append(node)

    def stmt(self, s: t.Stmt, depth: int) -> None:
        p = self.p
        first = len(self.lines)
        if isinstance(s, t.SeqStmt):
            for sub in s.body:
                self.stmt(sub, depth)
        elif isinstance(s, t.Store):
            idx = ", ".join(p.expr(i) for i in s.indices)
            self.emit(depth, f"{p.buffer(s.buffer)}[{idx}] = {p.expr(s.value)}")
        elif isinstance(s, t.For):
            start = s.start
            if isinstance(start, t.Const) and start.value == 0:
                rng = p.expr(s.extent)
            elif isinstance(start, t.Const) and isinstance(s.extent, t.Const):
                rng = f"{p.expr(start)}, {int(start.value) + int(s.extent.value)}"
            else:
                rng = f"{p.expr(start)}, {p.expr(start)} + {p._operand(s.extent, 7)}"
            kind = _LOOP_KINDS.get(s.kind, s.kind)
            var = p.var(s.var)
            typed = "" if s.var.dtype == INDEX_DTYPE else f"  # {var}: {s.var.dtype}"
            self.emit(depth, f"for {var} in T.{kind}({rng}):{typed}")
            self.stmt(s.body, depth + 1)
        elif isinstance(s, t.LetStmt):
            self.emit(depth, f"with T.let({p.expr(s.value)}) as {p.var(s.var)}:")
            self.stmt(s.body, depth + 1)
        elif isinstance(s, t.IfThenElse):
            self.emit(depth, f"if {p.expr(s.cond)}:")
            self.stmt(s.then_body, depth + 1)
            if s.else_body is not None:
                self.emit(depth, "else:")
                self.stmt(s.else_body, depth + 1)
        elif isinstance(s, t.Allocate):
            b = s.buffer
            self.emit(depth, f'{p.buffer(b)} = T.allocate({_shape(b.shape)}, "{b.dtype}", '
                             f'"{b.scope}")')
        elif isinstance(s, t.AllocConst):
            b = s.buffer
            self.emit(depth, f'{p.buffer(b)} = T.alloc_const({_shape(b.shape)}, "{b.dtype}", '
                             f"data={format_array(s.data)})")
        elif isinstance(s, t.DeclBuffer):
            b = s.buffer
            self.emit(depth, f'{p.buffer(b)} = T.decl_buffer({_shape(b.shape)}, "{b.dtype}", '
                             f"{p.buffer(s.source)}, byte_offset={s.byte_offset})")
        elif isinstance(s, t.Evaluate):
            self.emit(depth, f"T.evaluate({p.expr(s.value)})")
        elif isinstance(s, t.CallFunc):
            args = "".join(f", {p.expr(a)}" for a in s.args)
            self.emit(depth, f'T.call_func("{s.func}"{args})')
        else:
            self.emit(depth, f"<{type(s).__name__}>")
        self._mark(s, first)

    def prim_func(self, name: str, fn: t.PrimFunc) -> None:
        p = self.p
        first = len(self.lines)
        self.emit(0, "@T.prim_func")
        self.emit(0, f"def {name}({', '.join(p._param(q) for q in fn.params)}):")
        if fn.attrs:
            self.emit(1, f"T.func_attr({dict(fn.attrs)!r})")
        self.stmt(fn.body, 1)
        self._mark(fn, first)

    def graph_func(self, name: str, fn: g.Function) -> None:
        p = self.p
        first = len(self.lines)
        self.emit(0, "@R.function")
        self.emit(0, f"def {name}({', '.join(p._gparam(q) for q in fn.params)}):")
        if fn.attrs:
            self.emit(1, f"R.func_attr({dict(fn.attrs)!r})")
        for b in fn.bindings:
            start = len(self.lines)
            self.emit(1, f"{p.gvar(b.var)} = {p.graph_expr(b.value)}")
            self._mark(b, start)
        start = len(self.lines)
        self.emit(1, f"return {p.graph_expr(fn.result)}")
        self._mark(fn.result, start)
        self._mark(fn, first)


def print_function(name: str, fn: BaseFunc, printer: Printer | None = None) -> Printed:
    """Print one function; `spans` maps statements and bindings to their lines."""
    out = Lines(printer or Printer())
    if isinstance(fn, t.PrimFunc):
        out.prim_func(name, fn)
    else:
        out.graph_func(name, fn)
    return Printed(out.lines, out.spans)


def print_ir(node: object) -> str:
    """Multi-line text of a module, a function or a statement (for humans)."""
    try:
        return _print_ir(node)
    except RecursionError:
        # Statement lists are flat; only hand-built IR thousands of levels deep gets here.
        raise IRError("print: the IR is nested too deeply to print (an expression or nested "
                      "statements thousands of levels deep)") from None


def _print_ir(node: object) -> str:
    if isinstance(node, IRModule):
        return "\n\n".join(print_function(n, f).text() for n, f in node.items())
    if isinstance(node, (t.PrimFunc, g.Function)):
        return print_function("func", node).text()
    if isinstance(node, t.Stmt):
        out = Lines(Printer())
        out.stmt(node, 0)
        return "\n".join(out.lines)
    return Printer().node(node)


FunctionPrinter = Callable[[str, BaseFunc], Printed]
_function_printer: FunctionPrinter | None = None


def set_function_printer(fn: FunctionPrinter | None) -> None:
    """Replace the printer the verifier quotes functions with (None restores this one).

    A replacement returns `Printed` whose `spans` map `id(stmt)` to line ranges;
    nodes missing from `spans` are quoted without a marked line.
    """
    global _function_printer
    _function_printer = fn


def custom_function_printer() -> FunctionPrinter | None:
    """The printer installed with `set_function_printer`, or None for this module's."""
    return _function_printer


def quote_function(name: str, fn: BaseFunc) -> Printed:
    """Print `fn` with the pluggable printer (this module's by default)."""
    if _function_printer is not None:
        return _function_printer(name, fn)
    return print_function(name, fn)


def excerpt(printed: Printed, node: object, context: int = 3) -> str:
    """Lines around `node` with its line(s) marked `>`; the whole function if unknown."""
    lines = printed.lines
    span = printed.spans.get(id(node))
    width = len(str(len(lines)))
    if span is None:
        lo, hi, mark = 0, min(len(lines), 2 * context + 4) - 1, (-1, -1)
    else:
        first, last = span
        # A statement with a body is marked by its header line only.
        if last > first and not isinstance(node, (t.Store, t.Evaluate, t.CallFunc,
                                                  *t.DECLARATIONS)):
            last = first
        lo, hi, mark = max(0, first - context), min(len(lines) - 1, last + context), (first, last)
    out = []
    if lo > 0:
        out.append(" " * (width + 5) + "...")
    for i in range(lo, hi + 1):
        arrow = ">" if mark[0] <= i <= mark[1] else " "
        out.append(f"  {arrow} {i + 1:>{width}} | {lines[i]}")
    if hi < len(lines) - 1:
        out.append(" " * (width + 5) + "...")
    return "\n".join(out)
