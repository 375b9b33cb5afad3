"""What a build tells about kernels a symbolic size left on their generic loops.

`kiln.compile` runs its pipelines under `recorded` (kiln.kernels.specialisation), writes
what was found to the library metadata ("generic_kernels", so `kiln inspect` of the
exported library and `kiln.InferenceSession` read it back) and warns once per build with
`report`'s text (`kiln.errors.GenericKernelWarning`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kiln.errors import GenericKernelWarning
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import dim_bounds
from kiln.kernels.specialisation import recording

#: The metadata key (a list of `GenericKernel.as_json` objects).
METADATA_KEY = "generic_kernels"
#: The most entries the warning lists (the metadata keeps them all).
_LISTED = 12


def recorded(mod: IRModule, run: Callable[[IRModule], IRModule]
             ) -> tuple[IRModule, list[dict[str, Any]]]:
    """`run(mod)`, and the generic kernels the run left (as metadata entries)."""
    bounds: dict[str, tuple[int, int | None]] = {}
    for fn in mod.functions.values():
        if isinstance(fn, g.Function):
            bounds.update(dim_bounds(fn))  # type: ignore[arg-type]
    with recording(bounds) as found:
        out = run(mod)
    return out, [k.as_json() for k in found]


def note(metadata: dict[str, Any], found: list[dict[str, Any]]) -> None:
    """Put `found` into the library `metadata` and warn (once) when it is not empty."""
    if not found:
        return
    metadata[METADATA_KEY] = found
    # stacklevel 3: the warning names compile's caller
    warnings.warn(report(found), GenericKernelWarning, stacklevel=3)


def report(found: Iterable[Mapping[str, Any]]) -> str:
    """The block telling which kernels run generic loops and the pin that avoids it."""
    entries = list(found)
    lines = [f"{len(entries)} kernel(s) run their generic loops because a size is "
             "symbolic; kiln's hand-built kernels take them with the size pinned "
             "(docs/dynamic-shapes.md, \"Specialisation and warnings\"):"]
    for e in entries[:_LISTED]:
        lines.append(f"  node {e['node']!r} ({e['op']} of {', '.join(e['shapes'])}): "
                     f"{e['kernel']} when pinned: {e['hint']}")
    if len(entries) > _LISTED:
        lines.append(f"  ... and {len(entries) - _LISTED} more (kiln inspect lists them all)")
    return "\n".join(lines)


__all__ = ["METADATA_KEY", "note", "recorded", "report"]
