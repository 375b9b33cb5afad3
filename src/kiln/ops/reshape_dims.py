"""A reshape's target over symbolic dimensions, as a static attribute.

The `shape` attribute of the `reshape` op is a tuple of ints; `-1` (the remaining
size) and `-2 - k` (the size of input dimension `k`) let it describe a symbolic
target: `(-2, -3, 4, 16)` views `[batch, seq, 64]` as `[batch, seq, 4, 16]`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.errors import IRError
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dims_equal,
    exact_div,
    shape_text,
    simplify_dim,
)
from kiln.ir.types import Dim


def reshape_target(src: Sequence[Dim], shape: Sequence[int]) -> tuple[Dim, ...]:
    """The shape that a reshape's `shape` attribute describes for an input of shape `src`.

    Entries are sizes, except `-1`: the remaining size (at most one), and `-2 - k`:
    the size of input dimension `k`. The last two let a static attribute describe a
    symbolic shape (`(-2, -3, 4, 16)` views `[batch, seq, 64]` as `[batch, seq, 4, 16]`).
    """
    out: list[Dim] = []
    for d in shape:
        d = int(d)
        if d <= -2:
            if -2 - d >= len(src):
                raise IRError(f"reshape: shape {tuple(shape)} copies input dimension {-2 - d}, "
                              f"but the input has {len(src)}")
            out.append(simplify_dim(src[-2 - d]))
        else:
            out.append(d)
    return fill_rest(src, out)


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
            raise IRError(f"reshape: cannot view {shape_text(src)} as {shape_text(shape)}: "
                          f"{dim_text(dim_product(src))} is not a multiple of {dim_text(known)}")
        out[rest[0]] = size
    return tuple(out)


def reshape_attr(src: Sequence[Dim], target: Sequence[Dim]) -> tuple[int, ...]:
    """The reshape `shape` attribute (see `reshape_target`) that views `src` as `target`;
    IRError when a symbolic target dimension is neither an input dimension nor the rest."""
    out: list[int] = []
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
    if len(free) > 1:
        raise IRError(f"reshape: cannot view {shape_text(src)} as {shape_text(target)}: more "
                      "than one target dimension is a new symbolic size")
    return tuple(out)
