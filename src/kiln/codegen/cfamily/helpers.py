"""Small `static inline` C helpers the generated code calls, emitted only when used.

The helpers are C in a C file: `kiln_kernels.h` next to kiln.h
(`kiln.runtime.include_dir()/kiln/`); this module copies the ones a
translation unit uses into it, so generated files stay self-contained.

Each helper is named `kiln_<op>_<suffix>`; the suffix names the C type it works
on: i32 (int32_t, also used for the narrower integers after C's promotion), i64,
u32, u64, f32 (float; float16 and bfloat16 compute in float) and f64.

They exist where C has no operator with the IR's meaning (kiln.ir.evaluate):
rounding division and modulo, min/max with the IR's tie and NaN rules, integer pow/abs,
and the 16-bit float conversions (correctly rounded, ties to even).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from kiln.codegen.cfamily.dialect import C_DIALECT, CDialect
from kiln.errors import CompileError
from kiln.ir import dtype as dt

SUFFIX_CTYPES = {
    "i32": "int32_t", "i64": "int64_t", "u32": "uint32_t", "u64": "uint64_t",
    "f32": "float", "f64": "double",
}


def suffix(dtype: str) -> str:
    """The helper suffix of the C type a `dtype` value computes in."""
    k, b = dt.DTYPES[dt.check_dtype(dtype)]
    if k == "float":
        return "f64" if b == 64 else "f32"
    if b == 64:
        return "i64" if k == "int" else "u64"
    if b == 32 and k == "uint":
        return "u32"
    return "i32"  # bool, int8..int32, uint8, uint16: promoted to int


@dataclass(frozen=True)
class HelperCode:
    """One helper's C in two parts: `head`, the text before its function definition (a
    helper of kiln_kernels.h: its comment), and `function`, the definition after its
    `static inline`, which the printing dialect spells its own way (`helper_qualifiers`).
    kiln_dim.c, used whole, is all `head`."""

    head: str
    function: str | None
    needs: tuple[str, ...] = ()

    def text(self, dialect: CDialect) -> str:
        """The helper's C in `dialect`."""
        if self.function is None:
            if dialect.helper_qualifiers != C_DIALECT.helper_qualifiers:
                raise CompileError(f"the {dialect.name} cannot size heap buffers from "
                                   f"symbolic dimensions ({DIM_RUNTIME_FILE} is host C)")
            return self.head
        return f"{self.head}{dialect.helper_qualifiers} {self.function}"


class Helpers:
    """The helpers one translation unit uses, in dependency order."""

    def __init__(self) -> None:
        self._code: dict[str, HelperCode] = {}

    def use(self, name: str) -> str:
        """Register helper `name` (and what it needs); return the name to call."""
        if name not in self._code:
            code = _make(name)
            for dep in code.needs:
                self.use(dep)
            self._code[name] = code
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._code

    def __bool__(self) -> bool:
        return bool(self._code)

    @property
    def names(self) -> list[str]:
        """The helpers used, in the order `lines` defines them."""
        return list(self._code)

    @property
    def needs_string_h(self) -> bool:
        return any("memcpy" in code.text(C_DIALECT) for code in self._code.values())

    def lines(self, dialect: CDialect = C_DIALECT) -> list[str]:
        """The helpers' definitions, each followed by an empty line, in `dialect`."""
        out: list[str] = []
        for code in self._code.values():
            out.extend(code.text(dialect).strip("\n").split("\n"))
            out.append("")
        return out


def _make(name: str) -> HelperCode:
    if name == DIM_HELPERS:
        return HelperCode(dim_runtime_source(), None)
    made = kernel_helpers().get(name)
    if made is None:
        raise CompileError(f"internal error: no C helper named {name!r}")
    return made


# The checked int64 arithmetic of dimension expressions (kiln.dim_expr.to_c): a real C
# file shipped next to kiln.h, shared with host.c (kiln_host.c includes it).
DIM_RUNTIME_FILE = "kiln_dim.c"
#: The name `Helpers.use` takes for all of kiln_dim.c.
DIM_HELPERS = "kiln_dim"
# The helpers themselves: a C header shipped next to kiln.h (runtime package data, like
# kiln_dim.c and kiln_host.c: C that runs on the deploy host, compiled with its `cc`).
KERNEL_HELPERS_FILE = "kiln_kernels.h"
_HELPER = re.compile(r"^KILN_HELPER\((\w+)\)\n(?:KILN_NEEDS\(([\w, ]*)\)\n)?", re.M)
# A helper's definition starts at its qualifiers, the first line that begins with them.
_DEFINITION = re.compile(r"^static inline ", re.M)


def _runtime_include(file_name: str) -> str:
    path = Path(__file__).resolve().parents[2] / "runtime" / "include" / "kiln"
    return (path / file_name).read_text(encoding="utf-8")


@functools.cache
def dim_runtime_source() -> str:
    """The text of kiln_dim.c (`kiln.runtime.include_dir()/kiln/kiln_dim.c`)."""
    return _runtime_include(DIM_RUNTIME_FILE)


@functools.cache
def kernel_helpers() -> dict[str, HelperCode]:
    """name -> its code and the names of the helpers it needs, read from kiln_kernels.h.

    Each helper runs from its `KILN_HELPER(name)` marker line (and optional
    `KILN_NEEDS(...)` line) to the next marker or the header's `#endif`: a comment,
    then a `static inline` function definition.
    """
    text = _runtime_include(KERNEL_HELPERS_FILE)
    end = text.rindex("\n#endif")
    marks = list(_HELPER.finditer(text))
    out: dict[str, HelperCode] = {}
    for k, m in enumerate(marks):
        stop = marks[k + 1].start() if k + 1 < len(marks) else end
        needs = tuple(n.strip() for n in (m.group(2) or "").split(",") if n.strip())
        code = text[m.end():stop].strip("\n")
        definition = _DEFINITION.search(code)
        if definition is None:
            raise CompileError(f"{KERNEL_HELPERS_FILE}: helper {m.group(1)} is not a "
                               "`static inline` function definition")
        out[m.group(1)] = HelperCode(code[:definition.start()], code[definition.end():], needs)
    return out
