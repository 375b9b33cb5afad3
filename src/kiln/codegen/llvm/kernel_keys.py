"""Kernels keyed before their lowering: a hit of the kernel cache skips the lowering too.

The kernel cache (kiln.codegen.kernel_cache) keys a part by its LLVM IR, so a hit still
costs the kernel's lowering to llvmlite IR, its printing and LLVM's parse and print of
the part under content names. A kernel that stands alone in its part (with its
outlined loop bodies and their trampolines: kiln.codegen.llvm.split) is also keyed
before it is lowered (`group_key`), by everything its part's code follows from:

- each function's kiln IR as kiln.script prints it, the group's names written as their
  place in the group (another model numbers the same kernel otherwise), with constants
  as references and, beside them, the pool slot and offset each one is read from (the
  code reads them there, whatever their values); any other array by its bytes;
- what the module-wide analyses give each function: its `noalias` parameters, whether
  it keeps LLVM's SLP vectorizer off, and for a kernel that reads constants whether
  the pool is addressed as a large one;
- the lowering options (symbol prefix, data layout, ISA facts), the machine and LLVM's
  version, kiln's version and the sources of kiln's codegen and IR packages (and of
  the base modules they use).

A kernel that a caller may inline (a caller of at most MAX_INLINED_CALL_SITES calls, the
kernel not `noinline`) is compiled in its caller's part and is not keyed; one that calls
an external function is not either (the library's metadata lists the externs its
lowering meets).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.codegen import kernel_cache
from kiln.codegen.constants import ConstantPool
from kiln.ir.attrs import ATTR_PARALLEL_OF
from kiln.ir.printer import print_func
from kiln.ir.tensor import AllocConst, CallFunc, PrimFunc, Stmt
from kiln.ir.visitor import StmtMutator, iter_stmts

# v1 (2026-11-28): first version
KEY_VERSION = "kernel-key v1"


@dataclass(frozen=True)
class KernelGroup:
    """A kernel and its outlined loop bodies (kiln names, the kernel first), keyed."""

    functions: tuple[str, ...]
    key: str


@functools.cache
def _sources_fingerprint() -> str:
    """The sources the lowering follows from: kiln.codegen, kiln.ir and the base modules."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    paths = [root / f"{base}.py" for base in ("escape", "dim_expr", "_bfloat16", "errors")]
    for package in ("codegen", "ir"):
        paths += sorted((root / package).rglob("*.py"))
    for path in paths:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def standalone_groups(funcs: Mapping[str, PrimFunc], public: set[str],
                      inlined_calls: Callable[[PrimFunc], bool],
                      noinline: Callable[[str], bool]) -> list[tuple[str, ...]]:
    """The kernels of `funcs` (those in `public`) that no caller may inline
    (`inlined_calls(caller)`: whether its calls are inlinable; `noinline(kernel)`:
    whether the kernel itself forbids it) and that call no function but their own loop
    bodies, each with its loop bodies, in `funcs`' order."""
    bodies: dict[str, list[str]] = {}
    for name, fn in funcs.items():
        owner = fn.attrs.get(ATTR_PARALLEL_OF)
        if owner is not None:
            bodies.setdefault(str(owner), []).append(name)
    inlinable: set[str] = set()
    callees: dict[str, set[str]] = {}
    for name, fn in funcs.items():
        callees[name] = {s.func for s in iter_stmts(fn.body) if isinstance(s, CallFunc)}
        if inlined_calls(fn):
            inlinable |= callees[name]
    groups = [(name, *bodies.get(name, ())) for name in funcs
              if name in public and (name not in inlinable or noinline(name))]
    # a group calling another part's functions (a graph function) is not content-named
    return [g for g in groups if all(callees[n] <= set(g) for n in g)]


class _Placed(StmtMutator):
    """Calls of the group's functions under their place in the group."""

    def __init__(self, places: Mapping[str, str]) -> None:
        self.places = places

    def visit_call_func(self, s: CallFunc) -> Stmt:
        return CallFunc(self.places[s.func], s.args) if s.func in self.places else s


def _placed(fn: PrimFunc, places: Mapping[str, str]) -> PrimFunc:
    """`fn` with the group's function names (its calls, the kernel a loop body belongs
    to) written as their place in the group: what another model numbers otherwise."""
    body = _Placed(places).visit_stmt(fn.body)
    owner = str(fn.attrs.get(ATTR_PARALLEL_OF, ""))
    attrs = {**fn.attrs, ATTR_PARALLEL_OF: places[owner]} if owner in places else fn.attrs
    return PrimFunc(fn.params, body, attrs)


def group_key(functions: Sequence[str], funcs: Mapping[str, PrimFunc],
              facts: Callable[[str], str], pool: ConstantPool,
              context: Sequence[str]) -> str | None:
    """The key of the group `functions` (see the module docstring), or None when it is
    not keyed (it calls an external function). `facts(name)`: what the module-wide
    analyses give function `name`; `context`: the options, machine and versions. A
    constant not in `pool` yet (its slot is chosen as the module is lowered) leaves the
    group unkeyed too."""
    places = {name: f"group_function_{i}" for i, name in enumerate(functions)}
    h = hashlib.sha256()
    for field in (KEY_VERSION, kernel_cache.codegen_fingerprint(), _sources_fingerprint(),
                  *context):
        h.update(field.encode() + b"\0")
    for name in functions:
        fn = funcs[name]
        text = print_func(_placed(fn, places), places[name], metadata="reference")
        if "T.call_extern(" in text:
            return None
        h.update(text.encode() + b"\0")
        h.update(facts(name).encode() + b"\0")
        pooled = set()
        for s in iter_stmts(fn.body):
            if isinstance(s, AllocConst):
                try:
                    # how the code addresses it: slot, offset, and the pool's size class
                    slot = f"const {pool.index(s.data)} {pool.offset(s.data)} {pool.large}\0"
                except KeyError:  # not pooled before the lowering: its slot is not known
                    return None
                pooled.add(id(s.data))
                h.update(slot.encode())
        # any other array the text names by reference (an attribute's): by its bytes
        for ref, array in text.metadata.items():
            if id(array) not in pooled:
                data = np.ascontiguousarray(array)
                h.update(f"{ref} {data.dtype.str} {data.shape}\0".encode())
                h.update(hashlib.sha256(data.tobytes()).digest())
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
