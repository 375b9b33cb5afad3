"""A relocatable ELF object holding read-only data, written straight from Python.

The blob and the weights go into the library as data. Through the assembler
(`.incbin`) the weights are written to disk twice before the link (a data file,
then the assembler's object); this writes the object once, streaming each
piece from memory. It covers 64-bit little-endian ELF (x86-64, AArch64,
RISC-V 64, ...): the machine, OS ABI and flags are copied from an object the C
compiler made for the same library, so the linker sees a matching input. For
anything else `export_library` falls back to the assembler.

Layout (System V gABI): ELF header, the data section `.rodata.<name>` (flags
SHF_ALLOC, at its alignment), optionally a NOBITS section reserving room for
data written after the link, `.note.GNU-stack` (empty: no executable stack),
`.symtab`, `.strtab`, `.shstrtab`, then the section headers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.artifact.segments import Content, write_content
from kiln.errors import UsageError

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
ELFCLASS64, ELFDATA2LSB, ET_REL = 2, 1, 1
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 1, 2, 3, 8
SHF_ALLOC = 0x2
SHF_X86_64_LARGE = 0x10000000  # x86-64 psABI: data beyond the small code model's reach
EM_X86_64 = 62
EM_AARCH64 = 183
# The page a page-table entry one level up maps (x86-64's 2 MiB PMD page; AArch64's with
# its usual 4 KiB granule): a file mapping whose virtual address and file offset both sit
# on this boundary can be mapped with such entries, where the page cache holds folios that
# large (smaps `FilePmdMapped`). Machines not listed get no extra alignment.
LARGE_PAGE_BYTES = {EM_X86_64: 2 << 20, EM_AARCH64: 2 << 20}
STB_GLOBAL, STT_OBJECT = 1, 1
STV_DEFAULT, STV_HIDDEN = 0, 2
# The most a section's data is aligned to within the object file (its address in the
# link keeps the section's full alignment).
_FILE_ALIGN_MAX = 4096


@dataclass(frozen=True)
class DataSymbol:
    """A global object symbol at `offset` in the section, `size` bytes long."""

    name: str
    offset: int
    size: int
    hidden: bool


@dataclass(frozen=True)
class Machine:
    """What the linker checks of an input object: OS ABI, machine and flags."""

    osabi: int
    machine: int
    flags: int


def machine_of(obj: Path) -> Machine | None:
    """The machine of a 64-bit little-endian relocatable ELF object; None for anything else."""
    with open(obj, "rb") as f:
        head = f.read(_EHDR.size)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF":
        return None
    if head[4] != ELFCLASS64 or head[5] != ELFDATA2LSB:
        return None
    ident, e_type, machine, _v, _e, _ph, _sh, flags, *_rest = _EHDR.unpack(head)
    if e_type != ET_REL:
        return None
    return Machine(ident[7], machine, flags)


def write_data_object(path: Path, machine: Machine, section: str, align: int,
                      pieces: Sequence[tuple[int, Content]],
                      symbols: Sequence[DataSymbol], size: int,
                      reserved_from: int | None = None, large: bool = False) -> None:
    """Write an object whose section `section` holds `pieces` (offset, bytes), `size` long.

    Gaps between pieces are zero. Every symbol is global; `hidden` ones are
    not exported from the shared library.

    With `reserved_from` (a multiple of `align`), bytes from there to `size`
    are only reserved: they go into a second section `{section}.reserved` of
    type NOBITS (no bytes in the object) that the linker places right after the
    first one and lays out as zeros (without writing them: the library file
    has a hole there), for the caller to fill in the linked library. The pieces
    must end before it; symbols may span both sections.

    `large` (x86-64 only) flags the sections SHF_X86_64_LARGE, for a section named
    `.lrodata.*`: the linker places it after every small section, so a multi-GiB
    weights section leaves the code and the small data within +-2 GiB of each other.
    """
    flags = SHF_ALLOC | (SHF_X86_64_LARGE if large else 0)
    if large and machine.machine != EM_X86_64:
        raise UsageError(f"large data sections are an x86-64 feature; machine "
                         f"{machine.machine} has none")
    split = size if reserved_from is None else reserved_from
    if (reserved_from is not None and split % align) or not 0 <= split <= size or \
            any(off + len(p) > split for off, p in pieces):
        raise UsageError(f"reserved_from={reserved_from}: must be a multiple of {align} "
                         f"in [0, {size}] after every piece")
    sections = [section, ".note.GNU-stack", ".symtab", ".strtab", ".shstrtab"]
    if reserved_from is not None:
        sections.insert(1, f"{section}.reserved")
    index = {n: i + 1 for i, n in enumerate(sections)}
    strtab = bytearray(b"\0")
    sym_names = []
    for sym in symbols:
        sym_names.append(len(strtab))
        strtab += sym.name.encode() + b"\0"
    shstrtab = bytearray(b"\0")
    names = {}
    for n in sections:
        names[n] = len(shstrtab)
        shstrtab += n.encode() + b"\0"
    symtab = bytearray(_SYM.size)  # the null symbol
    for sym, name_off in zip(symbols, sym_names):
        in_reserved = reserved_from is not None and sym.offset >= split and sym.size
        shndx, value = ((index[f"{section}.reserved"], sym.offset - split) if in_reserved
                        else (index[section], sym.offset))
        symtab += _SYM.pack(name_off, (STB_GLOBAL << 4) | STT_OBJECT,
                            STV_HIDDEN if sym.hidden else STV_DEFAULT, shndx, value, sym.size)

    # The alignment binds the section's address in the link, not its offset in this file:
    # a large page's worth of zeros before the data would only grow the object.
    file_align = min(align, _FILE_ALIGN_MAX)
    data_off = -(-_EHDR.size // file_align) * file_align
    symtab_off = -(-(data_off + split) // 8) * 8
    strtab_off = symtab_off + len(symtab)
    shstrtab_off = strtab_off + len(strtab)
    shdr_off = -(-(shstrtab_off + len(shstrtab)) // 8) * 8
    headers = [
        bytes(_SHDR.size),
        _SHDR.pack(names[section], SHT_PROGBITS, flags, 0, data_off, split, 0, 0, align, 0),
    ]
    if reserved_from is not None:
        headers.append(_SHDR.pack(names[f"{section}.reserved"], SHT_NOBITS, flags, 0,
                                  data_off + split, size - split, 0, 0, align, 0))
    headers += [
        _SHDR.pack(names[".note.GNU-stack"], SHT_PROGBITS, 0, 0, data_off, 0, 0, 0, 1, 0),
        _SHDR.pack(names[".symtab"], SHT_SYMTAB, 0, 0, symtab_off, len(symtab),
                   index[".strtab"], 1, 8, _SYM.size),
        _SHDR.pack(names[".strtab"], SHT_STRTAB, 0, 0, strtab_off, len(strtab), 0, 0, 1, 0),
        _SHDR.pack(names[".shstrtab"], SHT_STRTAB, 0, 0, shstrtab_off, len(shstrtab), 0, 0,
                   1, 0),
    ]
    ident = b"\x7fELF" + bytes([ELFCLASS64, ELFDATA2LSB, 1, machine.osabi]) + bytes(8)
    ehdr = _EHDR.pack(ident, ET_REL, machine.machine, 1, 0, 0, shdr_off, machine.flags,
                      _EHDR.size, 0, 0, _SHDR.size, len(headers), len(headers) - 1)
    with open(path, "wb") as f:
        f.write(ehdr)
        f.write(bytes(data_off - _EHDR.size))
        pos = 0
        for offset, piece in sorted(pieces, key=lambda p: p[0]):
            f.write(bytes(offset - pos))
            write_content(f, piece)  # straight from the artifact's memory
            pos = offset + len(piece)
        f.write(bytes(symtab_off - data_off - pos))
        f.write(symtab)
        f.write(strtab)
        f.write(shstrtab)
        f.write(bytes(shdr_off - shstrtab_off - len(shstrtab)))
        f.write(b"".join(headers))


__all__ = ["LARGE_PAGE_BYTES", "DataSymbol", "Machine", "machine_of", "write_data_object"]
