"""Small `static inline` C helpers the generated code calls, emitted only when used.

The helpers are C in a C file: `kiln_kernels.h` next to kiln.h
(`kiln.runtime.include_dir()/kiln/`); this module copies the ones a
translation unit uses into it, so generated files stay self-contained.

Each helper is named `kiln_<op>_<suffix>`; the suffix names the C type it works
on: i32 (int32_t, also used for the narrower integers after C's promotion), i64,
u32, u64, f32 (float; float16 and bfloat16 compute in float) and f64.

They exist where C has no operator with the IR's meaning (kiln.ir.evaluate):
rounding division and modulo, min/max with Python's tie rule, integer pow/abs,
and the 16-bit float conversions (correctly rounded, ties to even).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

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


class Helpers:
    """The helpers one translation unit uses, in dependency order."""

    def __init__(self) -> None:
        self._code: dict[str, str] = {}

    def use(self, name: str) -> str:
        """Register helper `name` (and what it needs); return the name to call."""
        if name not in self._code:
            code, deps = _make(name)
            for dep in deps:
                self.use(dep)
            self._code[name] = code
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._code

    def __bool__(self) -> bool:
        return bool(self._code)

    @property
    def needs_string_h(self) -> bool:
        return any("memcpy" in code for code in self._code.values())

    def lines(self, namespace: str = "kiln_") -> list[str]:
        """The helpers' C definitions; `namespace` replaces their `kiln_` name prefix
        (host.c shares a namespace with the public entries, so it uses the reserved
        `{prefix}_host_`)."""
        out: list[str] = []
        for code in self._code.values():
            code = code.strip("\n").replace("kiln_", namespace)
            out.extend(code.split("\n"))
            out.append("")
        return out


def _make(name: str) -> tuple[str, tuple[str, ...]]:
    if name == DIM_HELPERS:
        return dim_runtime_source(), ()
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


def _runtime_include(file_name: str) -> str:
    path = Path(__file__).resolve().parents[2] / "runtime" / "include" / "kiln"
    return (path / file_name).read_text(encoding="utf-8")


@functools.cache
def dim_runtime_source() -> str:
    """The text of kiln_dim.c (`kiln.runtime.include_dir()/kiln/kiln_dim.c`)."""
    return _runtime_include(DIM_RUNTIME_FILE)


@functools.cache
def kernel_helpers() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (C definition, names of the helpers it needs), read from kiln_kernels.h.

    Each helper runs from its `KILN_HELPER(name)` marker line (and optional
    `KILN_NEEDS(...)` line) to the next marker or the header's `#endif`.
    """
    text = _runtime_include(KERNEL_HELPERS_FILE)
    end = text.rindex("\n#endif")
    marks = list(_HELPER.finditer(text))
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for k, m in enumerate(marks):
        stop = marks[k + 1].start() if k + 1 < len(marks) else end
        needs = tuple(n.strip() for n in (m.group(2) or "").split(",") if n.strip())
        out[m.group(1)] = (text[m.end():stop].strip("\n"), needs)
    return out
