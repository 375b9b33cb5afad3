"""A reshape's target over symbolic dimensions, as a static attribute.

The `shape` attribute of the `reshape` op is a tuple whose entries are ints or
dimension texts. `-1` (the remaining size) and `-2 - k` (the size of input dimension
`k`) describe most symbolic targets: `(-2, -3, 4, 16)` views `[batch, seq, 64]` as
`[batch, seq, 4, 16]`. A target with several sizes that are no input dimension
(`[batch*seq]` viewed as `[batch, 1, 1, seq]`, as exporters reshape an attention
mask) spells them as texts of `kiln.dim_expr` over the input's dimension variables:
`("batch", 1, 1, "seq")`. A text is a plain string, so the attribute prints and
parses back as any other, and the verifier re-checks that the element count agrees.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln import dim_expr
from kiln.errors import FormatError, IRError
from kiln.ir.pin_hint import pin_hint_where
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dim_vars,
    dims_equal,
    exact_div,
    from_dim_expr,
    is_static,
    shape_text,
    simplify_dim,
    substitute,
)
from kiln.ir.types import Dim

AttrEntry = int | str


def reshape_target(src: Sequence[Dim], shape: Sequence[AttrEntry]) -> tuple[Dim, ...]:
    """The shape that a reshape's `shape` attribute describes for an input of shape `src`.

    Entries are sizes, except `-1`: the remaining size (at most one), `-2 - k`: the
    size of input dimension `k`, and a str: a dimension text over the variables of
    `src` (module docstring). They let a static attribute describe a symbolic shape
    (`(-2, -3, 4, 16)` views `[batch, seq, 64]` as `[batch, seq, 4, 16]`).
    """
    out: list[Dim] = []
    for d in shape:
        if isinstance(d, str):
            out.append(_text_dim(src, shape, d))
            continue
        d = int(d)
        if d <= -2:
            if -2 - d >= len(src):
                raise IRError(f"reshape: shape {tuple(shape)} copies input dimension {-2 - d}, "
                              f"but the input has {len(src)}")
            out.append(simplify_dim(src[-2 - d]))
        else:
            out.append(d)
    return fill_rest(src, out)


def _text_dim(src: Sequence[Dim], shape: Sequence[AttrEntry], text: str) -> Dim:
    """The dimension `text` names, over the dimension variables of `src`."""
    try:
        expr = dim_expr.parse(text)
    except FormatError as exc:
        raise IRError(f"reshape: shape {tuple(shape)}: {exc}") from exc
    variables = {v.name: v for v in dim_vars(src)}
    unknown = sorted(dim_expr.variables(expr) - set(variables))
    if unknown:
        raise IRError(f"reshape: shape {tuple(shape)} names {', '.join(unknown)}, which the "
                      f"input's shape {shape_text(src)} does not mention")
    return from_dim_expr(expr, variables)


def fill_rest(src: Sequence[Dim], shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """`shape` with its -1 entry (at most one) replaced by the size that remains of `src`."""
    out = list(shape)
    rest = [k for k, d in enumerate(out) if isinstance(d, int) and d == -1]
    if len(rest) > 1:
        raise IRError(f"reshape: shape {shape_text(shape)} has more than one -1")
    if rest:
        known = dim_product(d for k, d in enumerate(out) if k != rest[0])
        size = exact_div(dim_product(src), known)
        if size is None:
            # exact_div is a proof (polynomial division): None means "not a multiple for
            # every value", which a pin can change: hint the fewest variables that do.
            count = dim_product(src)
            symbolic = "" if is_static([count, known]) else (
                " for every value of the symbolic dimensions; " + pin_hint_where(
                    lambda pins: exact_div(substitute(count, pins),
                                           substitute(known, pins)) is not None,
                    (v.name for v in dim_vars([count, known]))))
            raise IRError(f"reshape: cannot view {shape_text(src)} as {shape_text(shape)}: "
                          f"{dim_text(count)} is not a multiple of {dim_text(known)}{symbolic}")
        out[rest[0]] = size
    return tuple(out)


def reshape_attr(src: Sequence[Dim], target: Sequence[Dim]) -> tuple[AttrEntry, ...]:
    """The reshape `shape` attribute (see `reshape_target`) that views `src` as `target`.

    A symbolic target dimension is an input dimension (`-2 - k`) where one is equal, the
    rest (`-1`) when it is the only other one, else its text; IRError when a text names a
    variable `src` does not mention or the element counts differ."""
    out: list[AttrEntry] = []
    free: list[int] = []
    for d in target:
        d = simplify_dim(d)
        if isinstance(d, int):
            out.append(d)
            continue
        same = [k for k, s in enumerate(src) if dims_equal(s, d) is True]
        if same:
            out.append(-2 - same[0])
        else:
            free.append(len(out))
            out.append(-1)
    if len(free) > 1:  # several new sizes: spell each out; their product must be the count
        for k in free:
            out[k] = dim_text(target[k])
        if dims_equal(dim_product(reshape_target(src, out)), dim_product(src)) is not True:
            raise IRError(f"reshape: cannot view {shape_text(src)} as {shape_text(target)}: "
                          f"the element counts {dim_text(dim_product(src))} and "
                          f"{dim_text(dim_product(target))} are not provably equal for every "
                          "value of the symbolic dimensions")
    return tuple(out)
