"""The library metadata's "generic_kernels": kernels a symbolic size left on generic loops.

Plain data, read by deploy hosts as well as the compiler: `kiln inspect` and
`kiln.InferenceSession` show it from a loaded library (docs/dynamic-shapes.md,
"Specialisation and warnings"); kiln.driver.generic_kernels records it at compile time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The metadata key (a list of entries: node, op, shapes, kernel, hint, and the ONNX
#: node's onnx_node (its name, "" when unnamed), onnx_op, onnx_output when it is known).
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
        lines.append(f"  {where(e)}: {e['kernel']} when pinned: {e['hint']}")
    if len(entries) > _LISTED:
        lines.append(f"  ... and {len(entries) - _LISTED} more (kiln inspect lists them all)")
    return "\n".join(lines)


def where(entry: Mapping[str, Any]) -> str:
    """Which node an entry is: the ONNX node it was imported from when the build knew it
    (`node 'norm1' (LRN), kiln's lrn of [batch, 8, 5, 5]`), else the value's name."""
    shapes = ", ".join(entry.get("shapes") or [])
    op_type = entry.get("onnx_op")
    if not op_type:
        return f"node {entry.get('node')!r} ({entry.get('op')} of {shapes})"
    name, output = entry.get("onnx_node"), entry.get("onnx_output")
    who = repr(name) if name else f"with output {output!r}"
    return f"node {who} ({op_type}), kiln's {entry.get('op')} of {shapes}"


__all__ = ["METADATA_KEY", "report", "where"]
