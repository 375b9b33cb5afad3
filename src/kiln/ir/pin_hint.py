"""The one hint that tells a user how to pin a symbolic dimension kiln cannot keep.

Every error about a dimension that must be known at compile time ends with this text,
so Python users and CLI users both see the exact spelling that fixes it, with the
real variable names (`shape_dict={"seq": 128}` and `kiln compile ... --shape seq=128`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kiln.ir.shape_expr import dim_vars

# The example size in the hint: any size works; 128 reads as a plausible sequence length.
_EXAMPLE_SIZE = 128


def pin_hint(names: Iterable[str]) -> str:
    """The sentence telling how to pin the dimension variables `names`, in the Python
    (`shape_dict`) and CLI (`--shape`) forms; a generic sentence when `names` is empty."""
    unique = sorted(set(names))
    if not unique:
        return ("pin the symbolic dimensions with shape_dict={\"NAME\": N} "
                "(CLI: kiln compile ... --shape NAME=N)")
    py = ", ".join(f'"{n}": {_EXAMPLE_SIZE}' for n in unique)
    cli = " ".join(f"--shape {n}={_EXAMPLE_SIZE}" for n in unique)
    return f"pin {', '.join(unique)} with shape_dict={{{py}}} (CLI: kiln compile ... {cli})"


def pin_hint_for(shapes: Iterable[Any]) -> str:
    """`pin_hint` for the dimension variables that the shapes (or dims) `shapes` mention."""
    names: list[str] = []
    for shape in shapes:
        names.extend(v.name for v in dim_vars(shape))
    return pin_hint(names)
