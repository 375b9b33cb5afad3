"""Bind a function's dimension variables from the shapes of its input arrays.

The packed entry of a function with symbolic dimensions (docs/dynamic-shapes.md)
reads each dimension variable from the first input dimension that is exactly that
variable and checks every other occurrence and every bound, before any kernel
runs. This module is that check on the Python side, with the texts of
docs/abi.md, so a deploy host (numpy only) reports the same errors as C. The
dimension texts of the metadata (``seq*4``) are read and computed by
`kiln.dim_expr`, the one definition of the language the C entries use as well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from kiln import dim_expr
from kiln.errors import CallError, FormatError

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
    nonzero: Sequence[tuple[str, str]] = (),
) -> dict[str, int]:
    """Return ``{variable: size}`` read from ``shapes``, the tensors' shapes.

    ``params`` lists each tensor as ``(name, dims)`` (``indices``: their argument
    positions, else 0, 1, ...); ``bounds`` maps each variable to ``(min, max)``
    (``max`` None when unbounded); ``given`` maps variables the caller passes as
    scalars to ``(value, argument index, name)``; ``nonzero`` lists ``(text, why)`` of
    sizes the model divides by. The checks run in the order of the C entry (docs/abi.md,
    check 7): each variable is bound at its first plain occurrence and every later one
    must agree; then the bounds, by name; then the sizes that must not be 0; then each
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
    for text, why in nonzero:  # a size the model divides by (a Reshape's -1), a conv's image
        try:
            value = eval_dim_text(text, values)
        except CallError as err:
            raise CallError(f"{func}: {err}") from None
        if value <= 0:
            raise CallError(f"{func}: {why}, which is {value} here (onnxruntime refuses it too)")
    for index, (pname, dims), shape in zip(where, params, shapes, strict=True):
        if all(isinstance(d, str) and d.isidentifier() for d in dims):
            continue  # every dimension was bound or checked above
        want = [d if isinstance(d, int) else dim_size(func, str(d), values) for d in dims]
        if list(shape) != want:
            raise CallError(
                f"{func}: argument {index} '{pname}': expected shape "
                f"{_shape_text(dims)}, got {_shape_text(shape)}"
            )
    return values


def _shape_text(dims: Sequence[DimSpec]) -> str:
    """``[batch, 64]``: the shape form of docs/abi.md, variables by name."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


def is_dim_text(text: str) -> bool:
    """Whether `text` is a dimension as metadata writes it: a variable name or an
    expression of the `kiln.dim_expr` text form (checked for form only, never evaluated)."""
    try:
        _parse(text)
    except FormatError:
        return False
    return True


def eval_dim_text(text: str, values: Mapping[str, int]) -> int:
    """The value a dimension's text (``seq*4``, ``(h - 1)//2 + 1``) has for ``values``.

    Reads the form the IR's dimension printer writes into metadata (integer
    ``+ - * // %``, unary minus, ``min``/``max``), with the int64 arithmetic of
    `kiln.dim_expr`; anything else, an overflow or a zero divisor is a
    :class:`CallError` naming the text, never a wrapped value. A size (a shape to
    allocate or check) is `compile_dim_text`, which refuses a negative value too.
    """
    return dim_expr.evaluate(_read(text), values)


SizeOf = Callable[[Mapping[str, int]], int]


@functools.lru_cache(maxsize=4096)
def compile_dim_text(text: str) -> SizeOf:
    """A function of the variables' values computing the size `text` spells (see
    `eval_dim_text`; a negative size is a CallError as well). Each text is read and
    compiled once (`kiln.dim_expr.size_function`): every call of a symbolic function
    computes its sizes with it."""
    return dim_expr.size_function(_read(text))


def dim_size(func: str, text: str, values: Mapping[str, int]) -> int:
    """The size `text` has for `values` (`compile_dim_text`), with a failure named as the
    C entry names it: ``main: dimension 'a*2' overflows int64``."""
    try:
        return compile_dim_text(text)(values)
    except CallError as err:
        raise CallError(f"{func}: {err}") from None


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> dim_expr.Expr:
    return dim_expr.parse(text)


def _read(text: str) -> dim_expr.Expr:
    """The expression of a metadata text; one outside the form is a CallError."""
    try:
        return _parse(text)
    except FormatError as err:
        raise CallError(f"unsupported dimension text: {err}") from None
