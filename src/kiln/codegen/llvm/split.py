"""One lowered LLVM module cut into parts that LLVM compiles apart, with the same code.

A part is a kernel with what only it uses (its outlined loop bodies and their
trampolines, internal helpers), as LLVM IR text that parses on its own: the
globals it names, declarations of the other functions it calls and the metadata
it refers to. Two kernels land in one part when LLVM could see one from the
other while optimising: a call that may be inlined (a graph function with at
most `MAX_INLINED_CALL_SITES` calls inlines its kernels but the `noinline` ones),
an internal function both use. `alwaysinline` private helpers (the float16
conversions) are copied into each part that uses them: they are inlined wherever
they are called, so a copy changes no code.

The whole module's optimiser also tells a caller what it inferred of its callees
(`memory(argmem: read)`, `nocapture`...): the graph function's part is compiled
after the kernels', with their declarations as LLVM left them
(`Part.with_declarations`). Each function's optimised IR and machine code are then
what the whole module gives it (tests/codegen/test_llvm_parts.py checks this).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# `@"name"` (llvmlite quotes every global name) and `!12` (unnamed metadata).
_GLOBAL_REF = re.compile(r'@"((?:[^"\\]|\\.)*)"')
_METADATA_REF = re.compile(r"!(\d+)\b")
_INTERNAL = ("internal", "private")


@dataclass
class Part:
    """LLVM IR text of one part, the functions it defines and those of others it calls."""

    pieces: list[str]  # the text's lines and definitions, in order
    functions: list[str]
    # Functions of other parts it calls -> the index of their declaration in `pieces`
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(self.pieces)

    def with_declarations(self, declarations: dict[str, str]) -> str:
        """The text, the functions it calls declared as in `declarations` (with the
        attributes LLVM inferred for them in their own part)."""
        pieces = list(self.pieces)
        for name, index in self.calls.items():
            pieces[index] = declarations[name]
        return "\n".join(pieces)


class _Sets:
    """Union-find over function names."""

    def __init__(self, names: Iterable[str]) -> None:
        self.parent = {n: n for n in names}

    def find(self, n: str) -> str:
        while self.parent[n] != n:
            self.parent[n] = self.parent[self.parent[n]]
            n = self.parent[n]
        return n

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


@dataclass
class _Module:
    """The lowered module as text pieces: one string per global value and metadata node."""

    header: str
    texts: dict[str, str]  # global name -> its definition's text
    functions: dict[str, Any]  # defined function name -> llvmlite Function
    declared: dict[str, str]  # declared-only function name -> its declaration
    metadata: dict[str, str]  # metadata number -> its line
    named_metadata: list[str]


def _pieces(module: Any) -> _Module:
    header = "\n".join([f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
                        f'target datalayout = "{module.data_layout}"', "",
                        *(t.get_declaration()
                          for t in module.get_identified_types().values())])
    texts: dict[str, str] = {}
    functions: dict[str, Any] = {}
    declared: dict[str, str] = {}
    for name, value in module.globals.items():
        text = str(value)
        texts[name] = text
        if getattr(value, "blocks", None):
            functions[name] = value
        elif hasattr(value, "ftype"):
            declared[name] = text
    metadata = {}
    for md in module.metadata:
        metadata[str(md.name)] = str(md)
    named = [f"!{k} = !{{ {', '.join(i.get_reference() for i in v.operands)} }}"
             for k, v in module.namedmetadata.items()]
    return _Module(header, texts, functions, declared, metadata, named)


def _declaration(fn: Any) -> str:
    buf: list[str] = []
    fn.descr_prototype(buf)
    return "declare" + "".join(buf).removeprefix("define")


def _inlined_helper(fn: Any) -> bool:
    return fn.linkage in _INTERNAL and "alwaysinline" in fn.attributes


def _inlinable_calls(text: str) -> set[str]:
    """The functions `text` calls at some call site that is not `noinline`."""
    out: set[str] = set()
    for line in text.splitlines():
        if "call " in line and not line.rstrip().endswith("noinline"):
            out.update(name for name in _GLOBAL_REF.findall(line) if f'@"{name}"(' in line)
    return out


def _groups(m: _Module) -> tuple[list[list[str]], dict[str, set[str]]]:
    """The defined functions (helpers to copy left out) in parts, module order, and each
    function's references to globals."""
    refs = {n: set(_GLOBAL_REF.findall(t)) - {n} for n, t in m.texts.items()}
    sets = _Sets(m.functions)
    for name, fn in m.functions.items():
        if _inlined_helper(fn):
            continue
        inlinable = _inlinable_calls(m.texts[name])
        for other in refs[name]:
            callee = m.functions.get(other)
            if callee is None or _inlined_helper(callee):
                continue
            if callee.linkage in _INTERNAL or (other in inlinable
                                               and "noinline" not in callee.attributes):
                sets.union(name, other)
    parts: dict[str, list[str]] = {}
    for name, fn in m.functions.items():
        if not _inlined_helper(fn):
            parts.setdefault(sets.find(name), []).append(name)
    return list(parts.values()), refs


def _closure(start: Iterable[str], refs: dict[str, set[str]], follow: Any,
             expand: Any = None) -> set[str]:
    """The names `start` reaches through `refs`, stepping to those `follow` accepts and
    on from those `expand` accepts (default all)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if expand is None or expand(name):
            todo.extend(r for r in refs.get(name, ()) if follow(r))
    return seen


def _part_text(m: _Module, names: list[str], refs: dict[str, set[str]],
               external: frozenset[str]) -> tuple[list[str], dict[str, int]]:
    """`names` (defined functions) with what they use, as a module of its own; and the
    declarations it holds of functions other parts define (or `external` names). What
    the part uses besides its own functions comes first, by name: the lowering makes
    those globals as it meets them, so their order in the module depends on the kernels
    lowered before (or left out: kiln.codegen.llvm.kernel_keys), not on this part."""
    own = set(names)
    copied = _closure(names, refs, lambda r: r in m.functions and (
        r in own or _inlined_helper(m.functions[r]))) - own
    bodies = own | copied
    used = _closure(bodies, refs, lambda r: r in m.texts,
                    lambda n: n in bodies or n not in m.functions)
    body = [m.header]
    calls = {}
    order = {n: i for i, n in enumerate(m.texts)}
    for name in sorted(used, key=lambda n: (1, order[n], "") if n in own else (0, 0, n)):
        if name in external and name in m.declared:
            calls[name] = len(body)
            body.append(m.texts[name])
        elif name in own or name in copied or name not in m.functions:
            body.append(m.texts[name])
        else:
            calls[name] = len(body)
            body.append(_declaration(m.functions[name]).rstrip("\n"))
    text = "\n".join(body)
    md_used: set[str] = set()
    todo = _METADATA_REF.findall(text) + [r for line in m.named_metadata
                                          for r in _METADATA_REF.findall(line)]
    while todo:
        n = todo.pop()
        if n in md_used or n not in m.metadata:
            continue
        md_used.add(n)
        todo.extend(_METADATA_REF.findall(m.metadata[n].split("=", 1)[1]))
    metadata = [m.metadata[n] for n in sorted(md_used, key=int)]
    return [*body, *m.named_metadata, *metadata, ""], calls


def split_module(module: Any, external: frozenset[str] = frozenset()) -> list[Part]:
    """The parts of the llvmlite module `module` (see the module docstring), in module
    order; one part when nothing can be cut. `external`: functions declared in `module`
    whose code comes from elsewhere (the kernel cache), called as another part's."""
    m = _pieces(module)
    groups, refs = _groups(m)
    parts = []
    for names in groups:
        pieces, calls = _part_text(m, names, refs, external)
        parts.append(Part(pieces, names, calls))
    return parts


__all__ = ["Part", "split_module"]
