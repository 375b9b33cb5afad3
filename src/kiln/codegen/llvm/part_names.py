"""A part keyed by its code, whatever its functions are named; found code renamed.

Two models (or two builds of one edited model) number the same kernel differently:
`fused_conv2d_nchwc_relu_3` in one is `fused_conv2d_nchwc_relu_7` in the other,
with the same body. The kernel cache's key is therefore a part's text
(kiln.codegen.llvm.split) with the functions it defines and those of other parts
it calls renamed `__kiln_part_<i>_`, numbered in the part's own order
(`placeholders`, `keyed_text`). A part is still compiled under its own names, so
a build that finds nothing, or finds its own kernels again, gives the very bytes
it gave before. Code found under other names (`names` of the build that stored
it, in the same order) is renamed: the symbols of the object (`rename_symbols`,
in its ELF symbol table), the declarations the part gives its callers, the
functions of the bitcode. A name changes no machine code; in the bitcode, labels
and alias scopes LLVM named after an inlined function keep the stored names.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.codegen.llvm.split import Part
from kiln.errors import CompileError

PLACEHOLDER = "__kiln_part_"
# `@"name"` as llvmlite writes every global name (the parts' texts), or `@name` as LLVM
# prints a plain one (the declarations of other parts' functions, as they were optimised)
_GLOBAL_REF = re.compile(r'@(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._][-a-zA-Z$._0-9]*))')
_SHT_SYMTAB = 2


def names_of(part: Part) -> list[str]:
    """The functions `part` defines, then those of other parts it calls: the names a
    stored part is renamed by, in placeholder order."""
    return [*part.functions, *part.calls]


def keyed_text(part: Part, text: str) -> str:
    """`text` (`part`'s LLVM IR, names quoted) with its functions' names replaced by
    placeholders; `text` itself when a name would need escaping."""
    names = names_of(part)
    if any('"' in n or "\\" in n or not n.isprintable() for n in names):
        return text
    placeholder = {name: f"{PLACEHOLDER}{i}_" for i, name in enumerate(names)}
    def swap(m: re.Match[str]) -> str:
        name = m[1] if m[1] is not None else m[2]
        return f'@"{placeholder[name]}"' if name in placeholder else m[0]
    return _GLOBAL_REF.sub(swap, text)


def renaming(stored: Sequence[str], wanted: Sequence[str]) -> dict[str, str]:
    """Stored name -> wanted name, for the names that differ."""
    if len(stored) != len(wanted):
        raise CompileError("a cached kernel does not name as many functions as its part")
    return {old: new for old, new in zip(stored, wanted) if old != new}


def rename_declarations(declarations: str, renames: Mapping[str, str]) -> str:
    """A compiled part's declarations (`name\\0declare ... @name(...` lines) renamed."""
    if not renames:
        return declarations
    ref = re.compile(r'@"?(' + "|".join(map(re.escape, renames)) + r')"?\(')
    lines = []
    for line in declarations.splitlines():
        name, declaration = line.split("\0", 1)
        declaration = ref.sub(lambda m: f'@"{renames[m[1]]}"(', declaration)
        lines.append(f"{renames.get(name, name)}\0{declaration}")
    return "\n".join(lines)


def rename_functions(module: Any, renames: Mapping[str, str]) -> None:
    """Rename the functions of the llvmlite ModuleRef `module` named in `renames`."""
    for fn in module.functions:
        if fn.name in renames:
            fn.name = renames[fn.name]


def rename_symbols(obj: bytes, renames: Mapping[str, str]) -> bytes:
    """The ELF relocatable object `obj` with the symbols named in `renames` renamed.

    The new names are appended to a copy of the symbol string table placed at the end
    of the file (the old one stays, unreferenced); sections, relocations and symbol
    indices are untouched."""
    if not renames:
        return obj
    if obj[:4] != b"\x7fELF" or obj[4] not in (1, 2) or obj[5] not in (1, 2):
        raise CompileError("a cached kernel's object is not an ELF file")
    end = "<" if obj[5] == 1 else ">"
    wide = obj[4] == 2
    shoff, = struct.unpack_from(end + ("Q" if wide else "I"), obj, 0x28 if wide else 0x20)
    shentsize, shnum = struct.unpack_from(end + "HH", obj, 0x3A if wide else 0x2E)
    shdr = struct.Struct(end + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
    headers = [list(shdr.unpack_from(obj, shoff + i * shentsize)) for i in range(shnum)]
    encoded = {old.encode(): new.encode() for old, new in renames.items()}
    out = bytearray(obj)
    tables: dict[int, bytearray] = {}  # string table index -> its new content
    for sh in headers:
        if sh[1] != _SHT_SYMTAB:
            continue
        offset, size, link, entsize = sh[4], sh[5], sh[6], sh[9]
        base = headers[link][4]
        strings = tables.setdefault(link, bytearray(obj[base:base + headers[link][5]]))
        for at in range(offset, offset + size, entsize):
            start = base + struct.unpack_from(end + "I", obj, at)[0]
            new = encoded.get(obj[start:obj.index(b"\0", start)])
            if new is not None:
                struct.pack_into(end + "I", out, at, len(strings))
                strings += new + b"\0"
    for link, strings in tables.items():
        headers[link][4], headers[link][5] = len(out), len(strings)
        out += strings
        shdr.pack_into(out, shoff + link * shentsize, *headers[link])
    return bytes(out)


__all__ = ["PLACEHOLDER", "keyed_text", "names_of", "rename_declarations", "rename_functions",
           "rename_symbols", "renaming"]
