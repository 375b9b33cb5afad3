"""Printable names for DSL text: `kiln.ir.names` plus the names the DSL reserves.

Names are a printing concern: IR nodes carry a hint (`Var("i")`), and two
distinct nodes with the same hint print as `i` and `i_1`.
"""

from __future__ import annotations

import keyword

from kiln.ir import names as _ir_names
from kiln.ir.names import sanitize

__all__ = ["RESERVED", "Namer", "is_plain_name", "sanitize"]

# Names the DSL text itself uses; a node hint equal to one of them is renamed.
RESERVED = frozenset({"T", "G", "I", "meta", "ir_module", "range", "float"})


def is_plain_name(name: str) -> bool:
    """True if `name` can be printed as is (valid, not a keyword, not reserved)."""
    return name.isidentifier() and not keyword.iskeyword(name) and name not in RESERVED


class Namer(_ir_names.Namer):
    """A `kiln.ir.names.Namer` that by default never hands out the DSL's reserved names."""

    def __init__(self, reserved: frozenset[str] = RESERVED) -> None:
        super().__init__(reserved)
