"""What a build tells about kernels a symbolic size left on their generic loops.

`kiln.compile` runs its pipelines under `recorded` (kiln.kernels.specialisation), writes
what was found to the library metadata ("generic_kernels", so `kiln inspect` of the
exported library and `kiln.InferenceSession` read it back) and warns once per build with
`report`'s text (`kiln.errors.GenericKernelWarning`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from kiln.artifact.generic_kernels import METADATA_KEY, report
from kiln.errors import GenericKernelWarning
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import dim_bounds
from kiln.kernels.specialisation import recording


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


__all__ = ["METADATA_KEY", "note", "recorded", "report"]
