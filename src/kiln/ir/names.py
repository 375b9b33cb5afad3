"""Printable names: unique, valid Python identifiers made from node name hints.

Names are a printing concern: IR nodes carry a hint (`Var("i")`), and two
distinct nodes with the same hint print as `i` and `i_1`; a hint equal to a name
the DSL text itself uses (`T`, `G`, `meta`, ...) is renamed too.
"""

from __future__ import annotations

import keyword
from collections.abc import Container

# Names the DSL text itself uses; a node hint equal to one of them is renamed.
RESERVED = frozenset({"T", "G", "I", "meta", "ir_module", "range", "float"})


def is_plain_name(name: str) -> bool:
    """True if `name` can be printed as is (valid, not a keyword, not reserved)."""
    return name.isidentifier() and not keyword.iskeyword(name) and name not in RESERVED


def sanitize(hint: str, fallback: str = "v") -> str:
    """`hint` turned into a valid Python identifier (not a keyword)."""
    chars = [c if ("a" + c).isidentifier() else "_" for c in hint]
    name = "".join(chars) or fallback
    if not name.isidentifier():  # starts with a digit
        name = f"{fallback}_{name}"
    if keyword.iskeyword(name):
        name += "_"
    return name


def unique_name(base: str, taken: Container[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first not in `taken` (a module's
    function names, say)."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


class Namer:
    """Gives each object (by identity) a unique name derived from its hint."""

    def __init__(self, reserved: frozenset[str] = RESERVED) -> None:
        self._used: set[str] = set(reserved)
        self._names: dict[int, str] = {}
        # Next suffix to try per base: the suffixes below it are all taken, so a
        # thousand `relu`s cost linear time, not quadratic.
        self._next: dict[str, int] = {}
        self._keep: list[object] = []  # keeps ids valid while the namer lives

    def fresh(self, hint: str, fallback: str = "v") -> str:
        """A new unique name (not tied to an object)."""
        base = sanitize(hint, fallback)
        name = base
        k = self._next.get(base, 1)
        if name in self._used:
            name = f"{base}_{k}"
            while name in self._used:
                k += 1
                name = f"{base}_{k}"
            self._next[base] = k + 1
        self._used.add(name)
        return name

    def name(self, obj: object, hint: str, fallback: str = "v") -> str:
        """The name of `obj`, assigned from `hint` on first sight."""
        key = id(obj)
        if key not in self._names:
            self._names[key] = self.fresh(hint, fallback)
            self._keep.append(obj)
        return self._names[key]

    def has(self, obj: object) -> bool:
        """True if `obj` already has a name."""
        return id(obj) in self._names
