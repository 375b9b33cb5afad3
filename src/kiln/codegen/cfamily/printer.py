"""Text output for the C backend: an indenting line printer and a scoped name table.

Names are a printing concern (STYLE.md): IR nodes carry hints, and `NameScope`
turns each hint into a C identifier that is unique among the names live at that
point, so two sibling loops may both use `i` while nested ones get `i`, `i_1`.
"""

from __future__ import annotations

import keyword
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from kiln.escape import c_identifier

INDENT = "  "

# Identifiers a generated local must never shadow or redefine: C keywords, the
# <stdint.h> types, and every <math.h> / <stdlib.h> / <string.h> name the
# generated code calls (a local named `expf` would hide the function).
C_KEYWORDS = frozenset((
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
    "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
    "unsigned", "void", "volatile", "while", "_Bool", "_Complex", "_Imaginary", "_Alignas",
    "_Alignof", "_Atomic", "_Generic", "_Noreturn", "_Static_assert", "_Thread_local", "bool",
    "true", "false", "asm", "typeof",
))

C_LIBRARY_NAMES = frozenset((
    "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
    "intptr_t", "uintptr_t", "size_t", "ptrdiff_t", "NULL", "INFINITY", "NAN", "HUGE_VAL",
    "HUGE_VALF", "errno", "memcpy", "memset", "malloc", "free", "KILN_MALLOC", "KILN_FREE",
    "exp", "expf", "exp2", "exp2f",
    "expm1", "expm1f", "log", "logf", "log2", "log2f", "log1p", "log1pf", "sqrt", "sqrtf", "sin",
    "sinf", "cos", "cosf", "tan", "tanf", "tanh", "tanhf", "sinh", "sinhf", "cosh", "coshf", "asin",
    "asinf", "acos", "acosf", "atan", "atanf", "asinh", "asinhf", "acosh", "acoshf", "atanh",
    "atanhf", "erf", "erff", "fabs", "fabsf", "floor", "floorf", "ceil", "ceilf", "rint", "rintf",
    "nearbyint", "nearbyintf", "trunc", "truncf", "pow", "powf", "atan2", "atan2f", "fmod", "fmodf",
    "isnan", "isinf", "isfinite", "signbit", "fpclassify", "isnormal", "copysign", "copysignf",
    "hypot", "hypotf",
))

# Prefix of the static helper functions and macros the C backend defines.
HELPER_PREFIX = "kiln_"


def sanitize(hint: str) -> str:
    """A valid, non-reserved C identifier built from a name hint (any string).

    kiln.escape.c_identifier spells it (ASCII, bounded length); names C or the
    generated code already use get a `v_` in front.
    """
    name = c_identifier(hint)
    if (name in C_KEYWORDS or name in C_LIBRARY_NAMES or keyword.iskeyword(name)
            or name.lower().startswith(HELPER_PREFIX) or name.startswith("KILN_")):
        name = "v_" + name
    return name


class NameScope:
    """Unique C names from hints, with nested scopes (a C block per scope).

    `reserve` adds names that are never handed out (symbols of the translation
    unit). A name is free again once the scope that declared it is popped.
    """

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._reserved = set(reserved)
        self._frames: list[list[str]] = [[]]
        self._live: set[str] = set()

    def reserve(self, name: str) -> None:
        self._reserved.add(name)

    def fresh(self, hint: str) -> str:
        """A new name in the innermost scope, derived from `hint`."""
        base = sanitize(hint)
        name, n = base, 0
        while name in self._live or name in self._reserved:
            n += 1
            name = f"{base}_{n}"
        self._live.add(name)
        self._frames[-1].append(name)
        return name

    @contextmanager
    def scope(self) -> Iterator[None]:
        self._frames.append([])
        try:
            yield
        finally:
            for name in self._frames.pop():
                self._live.discard(name)


class CPrinter:
    """Collects lines of C with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def line(self, text: str = "") -> None:
        self.lines.append(INDENT * self.level + text if text else "")

    def extend(self, lines: Iterable[str]) -> None:
        """Add already formatted lines, indented to the current level."""
        for text in lines:
            self.line(text)

    @contextmanager
    def indented(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    @contextmanager
    def block(self, head: str, tail: str = "}") -> Iterator[None]:
        """`head {` ... `}` with the body indented."""
        self.line(head + " {")
        with self.indented():
            yield
        self.line(tail)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
