"""The one hint that tells a user how to pin a symbolic dimension kiln cannot keep.

Every error about a dimension that must be known at compile time ends with this text,
so Python users and CLI users both see the exact spelling that fixes it, with the
real variable names (`shape_dict={"seq": 128}` and `kiln compile ... --shape seq=128`).
The example size is the one a user most likely pins: 1 for a batch (what a single
request runs, and what exports with a symbolic batch are served at), 128 for any other
size (a sequence length, an image side: a plausible size, to be replaced by the size
served).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kiln.ir.shape_expr import dim_text, dim_vars, simplify_dim
from kiln.ir.tensor import as_expr
from kiln.ir.types import Dim

# The example size in the hint for a size that is no batch: any size works; 128 reads as
# a plausible sequence length or image side.
_EXAMPLE_SIZE = 128
# Names that read as a batch besides those containing "batch" (exporters' `batch`,
# `batch_size`, `nbatch`): `b`, `bs`, and NCHW's `n`.
_BATCH_NAMES = frozenset({"n", "b", "bs"})
# pin_hint_where tries subsets of at most this many names (2**6 checks at most).
MAX_PIN_SEARCH = 6


def is_batch_name(name: str) -> bool:
    """Whether the dimension variable `name` reads as a batch (pinned to 1 in hints)."""
    lower = name.lower()
    return "batch" in lower or lower in _BATCH_NAMES


def example_size(name: str) -> int:
    """The size the hint suggests pinning `name` to: 1 for a batch, else 128."""
    return 1 if is_batch_name(name) else _EXAMPLE_SIZE


def pin_hint(names: Iterable[str]) -> str:
    """The sentence telling how to pin the dimension variables `names`, in the Python
    (`shape_dict`) and CLI (`--shape`) forms; a generic sentence when `names` is empty."""
    unique = sorted(set(names))
    if not unique:
        return ("pin the symbolic dimensions with shape_dict={\"NAME\": N} "
                "(CLI: kiln compile ... --shape NAME=N)")
    py = ", ".join(f'"{n}": {example_size(n)}' for n in unique)
    cli = " ".join(f"--shape {n}={example_size(n)}" for n in unique)
    return f"pin {', '.join(unique)} with shape_dict={{{py}}} (CLI: kiln compile ... {cli})"


def pin_hint_where(holds: Callable[[Mapping[str, int]], bool], names: Iterable[str]) -> str:
    """`pin_hint` for the fewest of `names` (batches first) whose pinning at their
    example sizes makes `holds(pins)` true, so the hint names what a pin must fix and no
    more; all of `names` when no smaller set does (at most MAX_PIN_SEARCH names are
    searched)."""
    unique = sorted(set(names), key=lambda n: (example_size(n) != 1, n))
    for k in range(1, min(len(unique), MAX_PIN_SEARCH)):
        for subset in itertools.combinations(unique, k):
            if holds({n: example_size(n) for n in subset}):
                return pin_hint(subset)
    return pin_hint(unique)


def pin_hint_for(shapes: Iterable[Any]) -> str:
    """`pin_hint` for the dimension variables that the shapes (or dims) `shapes` mention."""
    names: list[str] = []
    for shape in shapes:
        names.extend(v.name for v in dim_vars(shape))
    return pin_hint(names)


def unproven_equal(a: Dim, b: Dim) -> str:
    """The refusal's end when two sizes an operator needs equal are not provably so
    (`s20 + s41` against `s41 + s8`, as an export that named the past keys' and values'
    lengths apart writes them): what kiln could not prove, and the pin of the variables
    of their difference only (pinned alike, the two sizes are equal)."""
    diff = simplify_dim(as_expr(a, "int64") - as_expr(b, "int64"))
    return (f"kiln cannot prove {dim_text(a)} == {dim_text(b)} for every value of the "
            f"symbolic dimensions; {pin_hint_for([diff])}")
