"""Bind a function's dimension variables from the shapes of its input arrays.

The packed entry of a function with symbolic dimensions (docs/dynamic-shapes.md)
reads each dimension variable from the first input dimension that is exactly that
variable and checks every other occurrence and every bound, before any kernel
runs. This module is that check on the Python side, with the texts of
docs/abi.md, so a deploy host (numpy only) reports the same errors as C.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping, Sequence

from kiln.errors import CallError

#: One dimension of a signature: a static size, the name of a dimension variable,
#: or an expression over them in ``dim_text`` form (``seq*2``).
DimSpec = int | str


def bind_dims(
    func: str,
    params: Sequence[tuple[str, Sequence[DimSpec]]],
    shapes: Sequence[Sequence[int]],
    bounds: Mapping[str, tuple[int, int | None]],
    *,
    indices: Sequence[int] | None = None,
    given: Mapping[str, tuple[int, int, str]] | None = None,
) -> dict[str, int]:
    """Return ``{variable: size}`` read from ``shapes``, the tensors' shapes.

    ``params`` lists each tensor as ``(name, dims)`` (``indices``: their argument
    positions, else 0, 1, ...); ``bounds`` maps each variable to ``(min, max)``
    (``max`` None when unbounded); ``given`` maps variables the caller passes as
    scalars to ``(value, argument index, name)``. The checks run in the order of the
    C entry (docs/abi.md, check 7): each variable is bound at its first plain
    occurrence and every later one must agree; then the bounds, by name; then each
    tensor's whole shape. Raises :class:`CallError` with the entry's texts.
    """
    if len(params) != len(shapes):
        noun = "argument" if len(params) == 1 else "arguments"
        raise CallError(f"{func}: expected {len(params)} {noun}, got {len(shapes)}")
    where = list(indices) if indices is not None else list(range(len(params)))
    for index, (pname, dims), shape in zip(where, params, shapes, strict=True):
        if len(dims) != len(shape):
            noun = "dimension" if len(dims) == 1 else "dimensions"
            raise CallError(
                f"{func}: argument {index} '{pname}': expected {len(dims)} {noun}, "
                f"got {len(shape)}"
            )
    seen: dict[str, tuple[int, int, str]] = dict(given or {})
    for index, (pname, dims), shape in zip(where, params, shapes, strict=True):
        for dim, size in zip(dims, shape, strict=True):
            if not isinstance(dim, str) or not dim.isidentifier():
                continue  # a size or an expression such as seq*2: checked below
            if dim not in seen:
                seen[dim] = (int(size), index, pname)
                continue
            first, first_index, first_name = seen[dim]
            if first != size:
                raise CallError(
                    f"{func}: dimension '{dim}' is {first} in argument {first_index} "
                    f"'{first_name}' but {size} in argument {index} '{pname}'"
                )
    values = {name: size for name, (size, _, _) in seen.items()}
    for name, (low, high) in sorted(bounds.items()):
        if name not in values:
            raise CallError(f"{func}: dimension '{name}' appears in no input")
        if values[name] < low:
            raise CallError(
                f"{func}: dimension '{name}' = {values[name]} is below its minimum {low}"
            )
        if high is not None and values[name] > high:
            raise CallError(
                f"{func}: dimension '{name}' = {values[name]} is above its maximum {high}"
            )
    for index, (pname, dims), shape in zip(where, params, shapes, strict=True):
        if all(isinstance(d, str) and d.isidentifier() for d in dims):
            continue  # every dimension was bound or checked above
        want = [d if isinstance(d, int) else eval_dim_text(str(d), values) for d in dims]
        if list(shape) != want:
            raise CallError(
                f"{func}: argument {index} '{pname}': expected shape "
                f"{_shape_text(dims)}, got {_shape_text(shape)}"
            )
    return values


def _shape_text(dims: Sequence[DimSpec]) -> str:
    """``[batch, 64]``: the shape form of docs/abi.md, variables by name."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CALLS: dict[str, Callable[[int, int], int]] = {"min": min, "max": max}


# Longest dimension text a library's metadata may hold (the compiler's are far shorter).
MAX_DIM_TEXT = 1024


def is_dim_text(text: str) -> bool:
    """Whether `text` is a dimension as metadata writes it: a variable name or an
    expression `eval_dim_text` reads (checked for form only, never evaluated)."""
    if len(text) > MAX_DIM_TEXT:
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    allowed = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.UnaryOp, ast.USub,
               ast.BinOp, ast.Call, *_BINARY)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            return False
        if isinstance(node, ast.Constant) and type(node.value) is not int:
            return False
        if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in _CALLS
                and len(node.args) == 2 and not node.keywords):
            return False
    return True


def eval_dim_text(text: str, values: Mapping[str, int]) -> int:
    """The size a dimension's text (``seq*4``, ``(h - 1)//2 + 1``) has for ``values``.

    Reads the form ``kiln.ir.shape_expr.dim_text`` writes into metadata (integer
    ``+ - * // %``, unary minus, ``min``/``max``), with Python's floor semantics as
    the compiler's; anything else is a :class:`CallError`, never evaluated. Each text
    is read once (`compile_dim_text`); a call evaluates the result.
    """
    return compile_dim_text(text)(values)


SizeOf = Callable[[Mapping[str, int]], int]


@functools.lru_cache(maxsize=4096)
def compile_dim_text(text: str) -> SizeOf:
    """A function of the variables' values computing `text` (see `eval_dim_text`)."""
    if not is_dim_text(text):
        raise CallError(f"unsupported dimension text {text[:80]!r}")
    tree = ast.parse(text, mode="eval")

    def build(node: ast.AST) -> SizeOf:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
            return lambda values: value
        if isinstance(node, ast.Name):
            name = node.id

            def lookup(values: Mapping[str, int]) -> int:
                if name not in values:
                    raise CallError(f"dimension text {text!r}: no value for '{name}'")
                return int(values[name])

            return lookup
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            operand = build(node.operand)
            return lambda values: -operand(values)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right, op = build(node.left), build(node.right), _BINARY[type(node.op)]
            divides = isinstance(node.op, ast.FloorDiv | ast.Mod)

            def binary(values: Mapping[str, int]) -> int:
                a, b = left(values), right(values)
                if divides and b == 0:
                    raise CallError(f"dimension text {text!r}: division by zero")
                return op(a, b)

            return binary
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)  # is_dim_text
        first, second, pick = build(node.args[0]), build(node.args[1]), _CALLS[node.func.id]
        return lambda values: pick(first(values), second(values))

    return build(tree.body)
