"""The library metadata's "generic_kernels": kernels a symbolic size left on generic loops.

Plain data, read by deploy hosts as well as the compiler: `kiln inspect` and
`kiln.InferenceSession` show it from a loaded library (docs/dynamic-shapes.md,
"Specialisation and warnings"); kiln.driver.generic_kernels records it at compile time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The metadata key (a list of entries: node, op, shapes, kernel, hint).
METADATA_KEY = "generic_kernels"
#: The most entries the warning lists (the metadata keeps them all).
_LISTED = 12


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


__all__ = ["METADATA_KEY", "report"]
