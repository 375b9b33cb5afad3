"""The sizes the report draws for a library with symbolic dimensions.

A tensor of such a library has its shape as dimension texts (`["batch", 32]`),
no byte size, and an offset into the workspace that may be an expression; the
workspace size is one too (`"batch*128"`). The report draws them at one
representative binding of the dimension variables: each variable at the size
kiln's pin hints suggest (`kiln.ir.pin_hint.example_size`: 1 for a batch, 128 for
any other size), moved into the bounds the library records for it (its
function's `dims`). Next to every number drawn so the page shows the formula it
comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kiln import dim_expr
from kiln.errors import KilnError
from kiln.ir.dtype import bits
from kiln.ir.pin_hint import example_size


@dataclass(frozen=True)
class Binding:
    """A value for each dimension variable of one graph function; empty when it has none."""

    values: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        """`batch=1, seq=128`."""
        return ", ".join(f"{name}={value}" for name, value in self.values.items())

    def size(self, value: Any) -> int | None:
        """An int as it is, a dimension text evaluated at the binding, None otherwise (a
        text kiln cannot parse or evaluate: the page shows the formula alone)."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if not isinstance(value, str):
            return None
        try:
            return dim_expr.evaluate_size(dim_expr.parse(value), self.values)
        except KilnError:
            return None

    def tensor_bytes(self, info: dict[str, Any]) -> int | None:
        """The tensor's bytes: its recorded size, else its shape's at the binding."""
        if isinstance(info.get("bytes"), int):
            return int(info["bytes"])
        dims = [self.size(d) for d in info.get("shape", [])]
        if any(d is None for d in dims):
            return None
        try:
            width = bits(str(info.get("dtype")))
        except KilnError:
            return None
        return math.ceil(math.prod(d or 0 for d in dims) * width / 8)


def _variables(value: Any) -> set[str]:
    if not isinstance(value, str):
        return set()
    try:
        return set(dim_expr.variables(dim_expr.parse(value)))
    except KilnError:
        return set()


def representative(g: dict[str, Any], dims: list[dict[str, Any]] | None = None) -> Binding:
    """The binding the report draws graph `g` at (module docstring); `dims`: the
    function's recorded dimension variables with their `min`/`max`."""
    names: set[str] = set()
    for info in g["tensors"]:
        for d in info.get("shape", []):
            names |= _variables(d)
        names |= _variables(info.get("offset"))
    names |= _variables(g.get("workspace_bytes"))
    bounds = {d.get("name"): d for d in dims or [] if isinstance(d, dict)}
    values = {}
    for name in sorted(names):
        value = example_size(name)
        low, high = bounds.get(name, {}).get("min"), bounds.get(name, {}).get("max")
        if isinstance(low, int) and value < low:
            value = low
        if isinstance(high, int) and value > high:
            value = high
        values[name] = value
    return Binding(values)


def concrete(g: dict[str, Any], binding: Binding) -> dict[str, Any]:
    """A copy of graph `g` with every size and offset an int at `binding` (those kiln
    cannot evaluate left out), each symbolic one's text kept under `formula` /
    `offset_formula` / `workspace_formula`."""
    tensors = []
    for info in g["tensors"]:
        out = dict(info)
        size = binding.tensor_bytes(info)
        if not isinstance(info.get("bytes"), int):
            out["bytes"] = size
            if size is not None:
                out["formula"] = _bytes_formula(info)
        offset = info.get("offset")
        if isinstance(offset, str):
            out["offset"] = binding.size(offset)
            out["offset_formula"] = offset
        tensors.append(out)
    out_g = dict(g, tensors=tensors)
    total = g.get("workspace_bytes")
    if isinstance(total, str):
        out_g["workspace_bytes"] = binding.size(total)
        out_g["workspace_formula"] = total
    return out_g


def _bytes_formula(info: dict[str, Any]) -> str:
    """`batch*32*4`: the shape's product times the element size, as the page shows it."""
    dims = [str(d) if isinstance(d, int) or str(d).isidentifier() else f"({d})"
            for d in info.get("shape", [])]
    try:
        width = bits(str(info.get("dtype")))
    except KilnError:
        return "*".join(dims) or "1"
    factor = f"*{width // 8}" if width % 8 == 0 else f"*{width}/8"
    return "*".join(dims or ["1"]) + factor
