"""Kernels keyed before their lowering: a hit of the kernel cache skips the lowering too.

The kernel cache (kiln.codegen.kernel_cache) keys a part by its LLVM IR, so a hit still
costs the kernel's lowering to llvmlite IR, its printing and LLVM's parse and print of
the part under content names. A kernel that stands alone in its part (with its
outlined loop bodies and their trampolines: kiln.codegen.llvm.split) is also keyed
before it is lowered (`group_key`), by everything its part's code follows from:

- each function's kiln IR as kiln.script prints it, the group's names written as their
  place in the group (another model numbers the same kernel otherwise), with constants
  as references and, beside them, the pool slot and offset each one is read from;
- what the module-wide analyses give each function: its `noalias` parameters, whether
  it keeps LLVM's SLP vectorizer off, whether the pool is addressed as a large one;
- the lowering options (symbol prefix, data layout, ISA facts), the machine and LLVM's
  version, kiln's version and the sources of kiln's codegen and IR packages.

A kernel whose callers may inline it (a caller of at most MAX_INLINED_CALL_SITES calls)
is compiled in its caller's part and is not keyed; one that calls an external function
is not either (the library's metadata lists the externs its lowering meets).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.codegen import kernel_cache
from kiln.codegen.constants import ConstantPool
from kiln.ir.attrs import ATTR_PARALLEL_OF
from kiln.ir.printer import print_func
from kiln.ir.tensor import AllocConst, CallFunc, PrimFunc
from kiln.ir.visitor import iter_stmts

# v1 (2026-11-28): first version
KEY_VERSION = "kernel-key v1"


@dataclass(frozen=True)
class KernelGroup:
    """A kernel and its outlined loop bodies (kiln names, the kernel first), keyed."""

    functions: tuple[str, ...]
    key: str


@functools.cache
def _sources_fingerprint() -> str:
    """The sources the lowering follows from: kiln.codegen and kiln.ir."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in ("codegen", "ir"):
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def standalone_groups(funcs: Mapping[str, PrimFunc], public: set[str],
                      inlined_calls: Callable[[PrimFunc], bool]) -> list[tuple[str, ...]]:
    """The kernels of `funcs` (those in `public`) that no caller may inline
    (`inlined_calls(caller)`: whether its calls are inlinable), each with its loop
    bodies, in `funcs`' order."""
    bodies: dict[str, list[str]] = {}
    for name, fn in funcs.items():
        owner = fn.attrs.get(ATTR_PARALLEL_OF)
        if owner is not None:
            bodies.setdefault(str(owner), []).append(name)
    inlinable: set[str] = set()
    for fn in funcs.values():
        if inlined_calls(fn):
            inlinable.update(s.func for s in iter_stmts(fn.body) if isinstance(s, CallFunc))
    return [(name, *bodies.get(name, ())) for name in funcs
            if name in public and name not in inlinable]


def group_key(functions: Sequence[str], funcs: Mapping[str, PrimFunc],
              facts: Callable[[str], str], pool: ConstantPool,
              context: Sequence[str]) -> str | None:
    """The key of the group `functions` (see the module docstring), or None when it is
    not keyed (it calls an external function). `facts(name)`: what the module-wide
    analyses give function `name`; `context`: the options, machine and versions. A
    constant not in `pool` yet (its slot is chosen as the module is lowered) leaves the
    group unkeyed too."""
    places = {name: f"group_function_{i}" for i, name in enumerate(functions)}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, places)) + r")\b")
    h = hashlib.sha256()
    for field in (KEY_VERSION, kernel_cache.codegen_fingerprint(), _sources_fingerprint(),
                  *context, f"large={pool.large}"):
        h.update(field.encode() + b"\0")
    for i, name in enumerate(functions):
        fn = funcs[name]
        text = print_func(fn, f"group_function_{i}", metadata="reference")
        if "T.call_extern(" in text:
            return None
        h.update(pattern.sub(lambda m: places[m.group(1)], text).encode() + b"\0")
        h.update(facts(name).encode() + b"\0")
        for s in iter_stmts(fn.body):
            if isinstance(s, AllocConst):
                try:
                    slot = f"const {pool.index(s.data)} {pool.offset(s.data)}\0"
                except KeyError:  # not pooled before the lowering: its slot is not known
                    return None
                h.update(slot.encode())
    return h.hexdigest()


def entry_for(group: Sequence[str], part_symbols: Sequence[str], symbol: Callable[[str], str],
              aliased: set[str], key: str) -> dict[str, Any] | None:
    """The index entry of a kernel group whose part defines `part_symbols` (the model's
    symbols, the part's order) under the part key `key`: each function's place as
    [kind, index in the group] ("kernel" or its thread pool trampoline "run"), and
    whether the join gives it the model's name (`aliased`). None when the part holds
    other functions than the group's."""
    places: dict[str, list[Any]] = {}
    for i, name in enumerate(group):
        places[symbol(name)] = ["kernel", i]
        places[symbol(name) + ".run"] = ["run", i]
    if not set(part_symbols) <= set(places) or any(symbol(n) not in part_symbols
                                                   for n in group):
        return None
    return {"key": key, "functions": [places[s] for s in part_symbols],
            "aliased": [s in aliased for s in part_symbols]}


def entry_symbols(entry: Mapping[str, Any], group: Sequence[str],
                  symbol: Callable[[str], str]) -> list[tuple[str, bool]] | None:
    """(the model's symbol, aliased) of each function of an index entry's part, or None
    when the entry does not fit the group."""
    try:
        out = []
        for (kind, index), aliased in zip(entry["functions"], entry["aliased"], strict=True):
            base = symbol(group[index])
            out.append((base if kind == "kernel" else f"{base}.run", bool(aliased)))
            if kind not in ("kernel", "run"):
                return None
        return out
    except (KeyError, TypeError, ValueError, IndexError):
        return None


__all__ = ["KEY_VERSION", "KernelGroup", "entry_for", "entry_symbols", "group_key",
           "standalone_groups"]
