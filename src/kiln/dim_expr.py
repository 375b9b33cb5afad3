"""The dimension-expression language: one definition of a symbolic size.

A symbolic tensor dimension (docs/dynamic-shapes.md) is an int64 expression over
dimension variables: `batch*seq`, `(h - 1)//2 + 1`, `min(a, b)`. The compiler keeps
it as a PrimExpr in canonical form (`kiln.ir.shape_expr`); library metadata keeps it
as text; the packed entries compute it in C; the runtime and the reference
interpreter compute it in Python. This module is the one definition all of them
use: a small frozen AST, the text form (parser and printer), the limits on
untrusted text, the evaluation and the C form, with one arithmetic:

- every value, the variables' and each intermediate result's, is an int64; a result
  outside int64 is an overflow, never a wrap;
- `//` and `%` round toward minus infinity (Python's); a zero divisor is an error;
- `min`/`max` of two values, unary minus (`-INT64_MIN` overflows);
- a failure does not stop the computation: the failed node gives 0 and every
  failure is recorded (`Failure` flags), so the outcome does not depend on the
  order in which C evaluates a call's arguments. Overflow is reported before a
  zero divisor;
- a *size* (a tensor dimension, a byte count) must also be non-negative.

Every walk over a tree is iterative (explicit stacks), so no tree, however deep,
reaches Python's recursion limit; parsing bounds the text (MAX_DIM_TEXT) and its
nesting (MAX_DEPTH). This module imports only the standard library, kiln.errors
and kiln.escape: the runtime (numpy only) uses it as well as the compiler.
"""

from __future__ import annotations

import enum
import keyword
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

from kiln.errors import CallError, FormatError
from kiln.escape import int64_literal

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: Longest dimension text accepted (a library's metadata; the compiler's are far shorter).
MAX_DIM_TEXT = 1024
#: Deepest nesting of a text: parentheses, calls and unary minuses inside each other.
MAX_DEPTH = 64
# Longest text quoted in an error message.
_QUOTE = 200


class Op(enum.StrEnum):
    """A binary operator, named as the PrimExpr operator it stands for."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    FLOORDIV = "floordiv"
    FLOORMOD = "floormod"
    MIN = "min"
    MAX = "max"


class Failure(enum.IntFlag):
    """What went wrong computing an expression (the same bits as kiln_dim.c's)."""

    OVERFLOW = 1
    ZERO_DIVISOR = 2


@dataclass(frozen=True, slots=True)
class Const:
    """An int64 constant."""

    value: int

    def __post_init__(self) -> None:
        if type(self.value) is not int or not INT64_MIN <= self.value <= INT64_MAX:
            raise FormatError(f"dimension constant {self.value!r} is not an int64")


@dataclass(frozen=True, slots=True)
class Var:
    """A dimension variable, by name (an ASCII identifier that is no Python keyword)."""

    name: str

    def __post_init__(self) -> None:
        if not is_variable_name(self.name):
            raise FormatError(f"{self.name[:_QUOTE]!r} is not a dimension variable name")


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus."""

    a: Expr


@dataclass(frozen=True, slots=True)
class Binary:
    """`a op b`; `min` and `max` print as calls."""

    op: Op
    a: Expr
    b: Expr


Expr = Const | Var | Neg | Binary

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_variable_name(name: object) -> bool:
    """Whether `name` may name a dimension variable: an ASCII identifier that is no Python
    keyword (so a text reads the same in Python, C and the DSL)."""
    return (isinstance(name, str) and _NAME.fullmatch(name) is not None
            and not keyword.iskeyword(name))


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of `e` (none for a constant or a variable)."""
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Neg):
        return (e.a,)
    return ()


def postorder(e: Expr) -> Iterator[Expr]:
    """Every node of `e` once, operands before the node using them (no recursion; a
    subtree shared by two parents, as the compiler's conversions make, is visited once)."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children(node)) if id(c) not in seen)


def variables(e: Expr) -> frozenset[str]:
    """The names of the variables `e` mentions."""
    return frozenset(n.name for n in postorder(e) if isinstance(n, Var))


def fold(e: Expr, leaf: Callable[[Const | Var], object],
         node: Callable[[Neg | Binary, list[object]], object]) -> object:
    """Bottom-up evaluation of `e`: `leaf` for constants and variables, `node` for an
    operator given its operands' results (no recursion; shared subtrees once each)."""
    done: dict[int, object] = {}
    for n in postorder(e):
        if isinstance(n, Const | Var):
            done[id(n)] = leaf(n)
        else:
            done[id(n)] = node(n, [done[id(c)] for c in children(n)])
    return done[id(e)]


# ---------------------------------------------------------------------- arithmetic


def _floordiv(a: int, b: int) -> tuple[int, Failure]:
    if b == 0:
        return 0, Failure.ZERO_DIVISOR
    return a // b, Failure(0)


def _floormod(a: int, b: int) -> tuple[int, Failure]:
    if b == 0:
        return 0, Failure.ZERO_DIVISOR
    return a % b, Failure(0)


_ARITH: dict[Op, Callable[[int, int], tuple[int, Failure]]] = {
    Op.ADD: lambda a, b: (a + b, Failure(0)),
    Op.SUB: lambda a, b: (a - b, Failure(0)),
    Op.MUL: lambda a, b: (a * b, Failure(0)),
    Op.FLOORDIV: _floordiv,
    Op.FLOORMOD: _floormod,
    Op.MIN: lambda a, b: (min(a, b), Failure(0)),
    Op.MAX: lambda a, b: (max(a, b), Failure(0)),
}


def compute(e: Expr, values: Mapping[str, int]) -> tuple[int, Failure]:
    """(value, failures) of `e` with int64 arithmetic (module docstring); a failed node
    gives 0. A variable missing from `values`, or whose value is not an int64, is a
    CallError naming the text."""
    failed = Failure(0)

    def leaf(n: Const | Var) -> int:
        if isinstance(n, Const):
            return n.value
        if n.name not in values:
            raise CallError(f"dimension '{quote(e)}' has no value for '{n.name}'")
        v = values[n.name]
        try:
            value = None if isinstance(v, bool) else operator.index(v)  # numpy ints too
        except TypeError:
            value = None
        if value is None or not INT64_MIN <= value <= INT64_MAX:
            raise CallError(f"dimension '{quote(e)}': '{n.name}' = {v!r} is not an int64")
        return value

    def node(n: Neg | Binary, args: list[object]) -> int:
        nonlocal failed
        ints = [int(a) for a in args]  # type: ignore[call-overload]
        if isinstance(n, Neg):
            value, why = -ints[0], Failure(0)
        else:
            value, why = _ARITH[n.op](ints[0], ints[1])
        if not INT64_MIN <= value <= INT64_MAX:
            value, why = 0, Failure.OVERFLOW
        failed |= why
        return value if not why else 0

    value = fold(e, leaf, node)
    assert isinstance(value, int)
    return value, failed


def evaluate(e: Expr, values: Mapping[str, int]) -> int:
    """The value of `e` for the variables' `values`; CallError on an int64 overflow or a
    zero divisor (naming the text), never a wrapped value."""
    value, failed = compute(e, values)
    if failed:
        raise CallError(failure_message(e, failed))
    return value


def evaluate_size(e: Expr, values: Mapping[str, int]) -> int:
    """`evaluate`, for a size: a negative value is a CallError as well."""
    value = evaluate(e, values)
    if value < 0:
        raise CallError(f"dimension '{quote(e)}' = {value} is negative")
    return value


#: The most nodes an expression compiled to closures may have (`size_function`): each
#: node is one nested call, so a larger one is walked by `evaluate_size` instead.
MAX_COMPILED_NODES = 64

SizeFunction = Callable[[Mapping[str, int]], int]


class _Irregular(Exception):
    """A compiled expression met something only the walk decides (a failure, a value
    that is no plain int64): `size_function` then asks `evaluate_size`."""


def size_function(e: Expr) -> SizeFunction:
    """A function of the variables' values equal to `evaluate_size(e, values)`, for a
    call's every size: the expression compiled once to closures over Python ints.
    Anything but plain int64 arithmetic (an overflow, a zero divisor, a negative result,
    a missing variable, a value that is no `int`) falls back to `evaluate_size`, so the
    results and every error are its own; an expression of more than
    `MAX_COMPILED_NODES` nodes is walked by it always."""
    general: SizeFunction = lambda values: evaluate_size(e, values)  # noqa: E731
    if isinstance(e, Var):  # the usual case: a dimension that is a variable
        name = e.name

        def variable(values: Mapping[str, int]) -> int:
            v = values.get(name)
            if type(v) is int and 0 <= v <= INT64_MAX:
                return v
            return general(values)
        return variable
    if sum(1 for _ in postorder(e)) > MAX_COMPILED_NODES:
        return general
    compiled = cast(SizeFunction, fold(e, _compiled_leaf, _compiled_node))

    def size(values: Mapping[str, int]) -> int:
        try:
            v = compiled(values)
        except (_Irregular, KeyError):
            return general(values)
        return v if v >= 0 else general(values)
    return size


def _compiled_leaf(n: Const | Var) -> SizeFunction:
    if isinstance(n, Const):
        value = n.value
        return lambda values: value
    name = n.name

    def variable(values: Mapping[str, int]) -> int:
        v = values[name]
        if type(v) is not int or not INT64_MIN <= v <= INT64_MAX:
            raise _Irregular
        return v
    return variable


def _compiled_node(n: Neg | Binary, args: list[object]) -> SizeFunction:
    fs: list[SizeFunction] = args  # type: ignore[assignment]
    if isinstance(n, Neg):
        return _checked(lambda values: -fs[0](values))
    a, b = fs
    if n.op in (Op.FLOORDIV, Op.FLOORMOD):
        div = operator.floordiv if n.op is Op.FLOORDIV else operator.mod

        def divide(values: Mapping[str, int]) -> int:
            d = b(values)
            if d == 0:
                raise _Irregular
            return int(div(a(values), d))
        return _checked(divide)  # INT64_MIN // -1 leaves int64
    py = _PY_OPS[n.op]
    return _checked(lambda values: py(a(values), b(values)))


_PY_OPS: dict[Op, Callable[[int, int], int]] = {
    Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul, Op.MIN: min,
    Op.MAX: max}


def _checked(f: SizeFunction) -> SizeFunction:
    def in_range(values: Mapping[str, int]) -> int:
        v = f(values)
        if not INT64_MIN <= v <= INT64_MAX:
            raise _Irregular
        return v
    return in_range


def failure_message(e: Expr, failed: Failure) -> str:
    """The message of a failed computation (the text kiln_host.c's dim_ok writes)."""
    if Failure.OVERFLOW in failed:
        return f"dimension '{quote(e)}' overflows int64"
    return f"dimension '{quote(e)}' divides by zero"


def quote(e: Expr) -> str:
    """The text of `e` for an error message (cut to 200 characters)."""
    text = to_text(e)
    return text if len(text) <= _QUOTE else text[:_QUOTE - 3] + "..."


# ---------------------------------------------------------------------- text

_CALLS = {"min": Op.MIN, "max": Op.MAX}
_INFIX = {Op.ADD: " + ", Op.SUB: " - ", Op.MUL: "*", Op.FLOORDIV: "//", Op.FLOORMOD: "%"}
_PRECEDENCE = {Op.ADD: 1, Op.SUB: 1, Op.MUL: 2, Op.FLOORDIV: 2, Op.FLOORMOD: 2}
_UNARY = 3  # binds tighter than every infix operator


def to_text(e: Expr) -> str:
    """`e` as metadata writes it: `seq*4`, `batch*seq`, `(h - 1)//2 + 1`, `min(a, b)`.

    Python syntax: parentheses only where precedence needs them (left-associative
    `+ -` and `* // %`), unary minus on the operand (`-seq`, `-(a + b)`).
    """
    # (text, precedence of its outermost operator); a call or leaf binds tightest
    done: dict[int, tuple[str, int]] = {}

    def wrap(child: Expr, need: int) -> str:
        text, prec = done[id(child)]
        return f"({text})" if prec < need else text

    for n in postorder(e):
        if isinstance(n, Const):
            done[id(n)] = (str(n.value), _UNARY + 1)
        elif isinstance(n, Var):
            done[id(n)] = (n.name, _UNARY + 1)
        elif isinstance(n, Neg):
            done[id(n)] = (f"-{wrap(n.a, _UNARY)}", _UNARY)
        elif n.op in _INFIX:
            prec = _PRECEDENCE[n.op]
            done[id(n)] = (f"{wrap(n.a, prec)}{_INFIX[n.op]}{wrap(n.b, prec + 1)}", prec)
        else:
            done[id(n)] = (f"{n.op.value}({done[id(n.a)][0]}, {done[id(n.b)][0]})", _UNARY + 1)
    return done[id(e)][0]


# ASCII only: `\d` and `\s` would take other scripts' digits and line breaks
_TOKEN = re.compile(r" *(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),]))")
_BY_SYMBOL = {"+": Op.ADD, "-": Op.SUB, "*": Op.MUL, "//": Op.FLOORDIV, "%": Op.FLOORMOD}


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, token) pairs: kind is "int", "name" or the operator itself."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if not text[pos:].strip(" "):
                break
            raise _bad(text, f"unexpected {text[pos:pos + 10]!r} at {pos}")
        number, name, symbol = m.groups()
        if number is not None:
            if len(number) > 1 and number[0] == "0":
                raise _bad(text, f"the number {number[:30]} has a leading zero")
            out.append(("int", number))
        elif name is not None:
            out.append(("name", name))
        else:
            out.append((symbol, symbol))
        pos = m.end()
    return out


def _bad(text: str, why: str) -> FormatError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return FormatError(f"dimension text {shown!r}: {why}")


class _Parser:
    """Recursive descent over the tokens. `+ -` and `* // %` chains are loops (a long
    sum nests no deeper); only parentheses, calls and unary minus recurse, each
    counted against MAX_DEPTH first."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def found(self) -> str:
        return "the end" if self.pos >= len(self.tokens) else repr(self.tokens[self.pos][1])

    def take(self, kind: str) -> str:
        if self.peek() != kind:
            raise _bad(self.text, f"expected {kind!r}, found {self.found()}")
        self.pos += 1
        return self.tokens[self.pos - 1][1]

    def expr(self) -> Expr:
        left = self.term()
        while self.peek() in ("+", "-"):
            op = _BY_SYMBOL[self.take(self.peek() or "")]
            left = Binary(op, left, self.term())
        return left

    def term(self) -> Expr:
        left = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = _BY_SYMBOL[self.take(self.peek() or "")]
            left = Binary(op, left, self.unary())
        return left

    def unary(self) -> Expr:
        kind = self.peek()
        if kind == "int":
            return self.constant(int(self.take("int")))
        if kind == "name" and not (self.tokens[self.pos][1] in _CALLS
                                   and self.pos + 1 < len(self.tokens)
                                   and self.tokens[self.pos + 1][0] == "("):
            name = self.take("name")
            if not is_variable_name(name):
                raise _bad(self.text, f"{name!r} is not a dimension variable name")
            return Var(name)
        if kind not in ("-", "(", "name"):
            raise _bad(self.text, f"expected a number, a name, '-' or '(', found {self.found()}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _bad(self.text, f"nested deeper than {MAX_DEPTH}")
        out: Expr
        if kind == "-":
            self.pos += 1
            # `-5` is the constant -5 (as `to_text` writes Const(-5)), else a negation
            out = (self.constant(-int(self.take("int"))) if self.peek() == "int"
                   else Neg(self.unary()))
        elif kind == "(":
            self.pos += 1
            out = self.expr()
            self.take(")")
        else:  # min( / max(
            op = _CALLS[self.take("name")]
            self.take("(")
            a = self.expr()
            self.take(",")
            out = Binary(op, a, self.expr())
            self.take(")")
        self.depth -= 1
        return out

    def constant(self, value: int) -> Const:
        if not INT64_MIN <= value <= INT64_MAX:
            raise _bad(self.text, "a constant does not fit int64")
        return Const(value)


def parse(text: str) -> Expr:
    """The expression a dimension text spells (the form `to_text` writes).

    Grammar: `expr := term (('+' | '-') term)*`, `term := unary (('*' | '//' | '%')
    unary)*`, `unary := '-' unary | INT | NAME | ('min' | 'max') '(' expr ',' expr ')'
    | '(' expr ')'`; INT decimal without leading zeros and within int64, NAME an ASCII
    identifier that is no Python keyword; spaces between tokens. Anything else (other
    whitespace, non-ASCII digits), a text longer than MAX_DIM_TEXT or nested deeper
    than MAX_DEPTH, is a FormatError naming the text.
    """
    if not isinstance(text, str):
        raise FormatError(f"a dimension text must be a str, got {type(text).__name__}")
    if len(text) > MAX_DIM_TEXT:
        raise _bad(text, f"longer than {MAX_DIM_TEXT} characters")
    parser = _Parser(text)
    out = parser.expr()
    if parser.peek() is not None:
        raise _bad(text, f"unexpected {parser.found()} after the expression")
    return out


# ---------------------------------------------------------------------- C

#: The C helpers `to_c` calls (kiln_dim.c, shipped next to kiln.h).
C_HELPERS = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.FLOORDIV: "floordiv",
             Op.FLOORMOD: "floormod", Op.MIN: "min", Op.MAX: "max"}


def to_c(e: Expr, names: Mapping[str, str], status: str, *, prefix: str = "kiln_dim_") -> str:
    """`e` as one int64 C expression over the locals `names` (by variable name).

    Every operator is a call of kiln_dim.c's checked helpers (`kiln_dim_add(a, b,
    &status)`), which OR `Failure` bits into the int32_t lvalue `status` instead of
    wrapping; the caller checks it after the expression. `prefix` is the helpers'
    name prefix in the translation unit.
    """
    def leaf(n: Const | Var) -> str:
        if isinstance(n, Const):
            return int64_literal(n.value)
        return names[n.name]

    def node(n: Neg | Binary, args: list[object]) -> str:
        if isinstance(n, Neg):
            return f"{prefix}neg({args[0]}, &{status})"
        return f"{prefix}{C_HELPERS[n.op]}({args[0]}, {args[1]}, &{status})"

    return str(fold(e, leaf, node))


__all__ = [
    "C_HELPERS",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "MAX_DIM_TEXT",
    "Binary",
    "Const",
    "Expr",
    "Failure",
    "Neg",
    "Op",
    "Var",
    "children",
    "compute",
    "evaluate",
    "evaluate_size",
    "failure_message",
    "fold",
    "is_variable_name",
    "parse",
    "postorder",
    "quote",
    "to_c",
    "to_text",
]
