"""Read an ELF file's symbols without loading it, and find the `{prefix}_blob` symbol.

This is kiln's one ELF reader. It reads the ELF header, the section headers
and the symbol tables asked for with `os.pread` and `struct` -- a few
kilobytes, whatever the size of the weights -- with every offset
bounds-checked, so a damaged file gives a FormatError, never a crash. Nothing
is dlopen'ed and no code of the file runs, so inspecting an untrusted `.so` is
safe. Two users:

- `kiln.artifact.load` (`read_blob` here): the blob's bytes, read from disk,
  from a shared library or a relocatable object (`.dynsym` and `.symtab`);
- `kiln.runtime.dynsym` (`load_module`): the prefix, from `.dynsym` alone,
  fast, before the library is dlopen'ed.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple, NoReturn

from kiln.artifact import blob as _blob
from kiln.errors import FormatError

ELF_MAGIC = b"\x7fELF"
BLOB_SUFFIX = "_blob"
METADATA_SUFFIX = "_metadata"

ET_REL = 1
SHT_SYMTAB = 2
SHT_NOBITS = 8
SHT_DYNSYM = 11
STT_NOTYPE = 0
STT_OBJECT = 1
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
_SHN_NAMES = {0xFFF1: "SHN_ABS", 0xFFF2: "SHN_COMMON", 0xFFFF: "SHN_XINDEX"}
# e_machine values of the instruction sets kiln targets, and `platform.machine()` names.
ELF_MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv",
                258: "loongarch", 21: "ppc64", 8: "mips"}
_HOST_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "riscv64": 243,
                  "ppc64le": 21, "ppc64": 21, "loongarch64": 258, "i386": 3, "i686": 3}
MAX_SYMBOLS = 1 << 20  # a kiln library exports a handful; refuse absurd tables

# (ELF header, section header, symbol) layouts per (class, byte order). Section and
# Symbol are named tuples, not dataclasses: load_module builds dozens per call.
_LAYOUTS = {
    (cls, data): tuple(struct.Struct(endian + f) for f in formats)
    for cls, formats in {
        1: ("16sHHIIIIIHHHHHH", "IIIIIIIIII", "IIIBBH"),   # ELFCLASS32
        2: ("16sHHIQQQIHHHHHH", "IIQQQQIIQQ", "IBBHQQ"),   # ELFCLASS64
    }.items()
    for data, endian in ((1, "<"), (2, ">"))
}


class Section(NamedTuple):
    """An ELF section header (Elf32_Shdr / Elf64_Shdr, in field order)."""

    name_offset: int  # into the section-name string table
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


class Symbol(NamedTuple):
    """One entry of an ELF symbol table."""

    name: str
    type: int     # STT_*
    shndx: int    # section index, or SHN_UNDEF / a reserved index
    value: int
    size: int


@dataclass(frozen=True)
class ElfSymbols:
    """What `read_symbols` found: the file's type, its sections and the symbols."""

    path: str
    e_type: int
    machine: int  # e_machine (EM_*): the instruction set the file was built for
    shstrndx: int
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    has_table: bool  # whether any of the requested symbol tables exists


def _read(fd: int, offset: int, size: int, file_size: int, what: str, path: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise FormatError(f"{path}: {what} [{offset}, {offset}+{size}) lies outside the "
                          f"file ({file_size} bytes); the library is damaged or truncated")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"{path}: short read of {what}")
    return data


def _c_string(table: bytes, offset: int, path: str, what: str) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise FormatError(f"{path}: {what} has a name outside its string table")
    return table[offset:end].decode("utf-8", errors="replace")


def read_symbols(fd: int, path: str, table_types: tuple[int, ...]) -> ElfSymbols:
    """The symbols of every section of a type in `table_types` (SHT_DYNSYM, SHT_SYMTAB).

    `fd` is an open file descriptor of the ELF file `path` (named in errors);
    tables come in section order, each table's symbols in table order.
    """
    file_size = os.fstat(fd).st_size
    ident = os.pread(fd, 16, 0)
    if ident[:4] != ELF_MAGIC:
        raise FormatError(f"{path}: not an ELF file (starts with {ident[:4]!r}, expected "
                          f"{ELF_MAGIC!r}); expected a kiln shared library")
    layouts = _LAYOUTS.get((ident[4], ident[5])) if len(ident) == 16 else None
    if layouts is None:
        raise FormatError(f"{path}: unsupported ELF class/byte order "
                          f"({ident[4:6].hex() if len(ident) >= 6 else 'truncated'})")
    ehdr_fmt, shdr_fmt, sym_fmt = layouts
    ehdr = ehdr_fmt.unpack(_read(fd, 0, ehdr_fmt.size, file_size, "the ELF header", path))
    e_type, machine = ehdr[1], ehdr[2]
    shoff, shentsize, shnum, shstrndx = ehdr[6], ehdr[11], ehdr[12], ehdr[13]
    if shoff == 0 or shnum == 0:
        raise FormatError(f"{path}: the ELF file has no section headers")
    if shentsize != shdr_fmt.size:
        raise FormatError(f"{path}: section header size {shentsize}, expected "
                          f"{shdr_fmt.size}")
    raw = _read(fd, shoff, shnum * shentsize, file_size, "the section headers", path)
    sections = tuple(map(Section._make, shdr_fmt.iter_unpack(raw)))
    is64 = ident[4] == 2
    symbols: list[Symbol] = []
    tables = [s for s in sections if s.type in table_types]
    for table in tables:
        what = ".dynsym" if table.type == SHT_DYNSYM else ".symtab"
        if table.link >= shnum:
            raise FormatError(f"{path}: {what} links to missing section {table.link}")
        strtab = sections[table.link]
        count = table.size // sym_fmt.size
        if count > MAX_SYMBOLS:
            raise FormatError(f"{path}: {what} claims {count} symbols")
        syms = _read(fd, table.offset, count * sym_fmt.size, file_size, what, path)
        names = _read(fd, strtab.offset, strtab.size, file_size, f"the strings of {what}", path)
        for i, fields in enumerate(sym_fmt.iter_unpack(syms)):
            if is64:
                name_off, info, _other, shndx, value, size = fields
            else:
                name_off, value, size, info, _other, shndx = fields
            end = names.find(b"\0", name_off)
            if name_off >= len(names) or end < 0:
                raise FormatError(f"{path}: {what} symbol {i} has a name outside its "
                                  "string table")
            name = names[name_off:end].decode("utf-8", errors="replace")
            symbols.append(Symbol(name, info & 0xF, shndx, value, size))
    return ElfSymbols(path, e_type, machine, shstrndx, sections, tuple(symbols), bool(tables))


def section_name(elf: ElfSymbols, fd: int, index: int) -> str:
    """The name of section `index`, read from the section-name string table."""
    if elf.shstrndx >= len(elf.sections):
        raise FormatError(f"{elf.path}: the section-name table index {elf.shstrndx} "
                          "is out of range")
    table = elf.sections[elf.shstrndx]
    names = _read(fd, table.offset, table.size, os.fstat(fd).st_size,
                  "the section names", elf.path)
    return _c_string(names, elf.sections[index].name_offset, elf.path, f"section {index}")


def choose_blob(candidates: dict[str, Symbol], names: set[str]) -> dict[str, Symbol]:
    """Of several blob candidates, the one whose `{p}_metadata` is in `names`, if unique."""
    if len(candidates) <= 1:
        return candidates
    paired = {n: s for n, s in candidates.items()
              if n[: -len(BLOB_SUFFIX)] + METADATA_SUFFIX in names}
    return paired if len(paired) == 1 else candidates


# ------------------------------------------------------------------ kiln.artifact.load
@dataclass(frozen=True)
class BlobSymbol:
    """Where the blob symbol sits in the file."""

    name: str
    file_offset: int
    size: int          # st_size; 0 if the symbol has no size recorded
    section: str
    section_end: int   # file offset where the containing section's data ends


def read_blob(path: str | os.PathLike[str], *, prefix: str | None = None) -> bytes:
    """The raw blob bytes embedded in the ELF file at `path`.

    With `prefix`, the symbol must be exactly `{prefix}_blob`; without, the one
    defined data symbol ending in `_blob` (if several, the one whose
    `{p}_metadata` sibling exists). FormatError names the file and what is missing.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        sym = find_blob_symbol(f, path, prefix=prefix)
        file_size = os.fstat(f.fileno()).st_size

        def fail(message: str) -> NoReturn:
            raise FormatError(f"{path}: symbol '{sym.name}': {message}")

        if sym.file_offset + _blob.HEADER_SIZE > min(sym.section_end, file_size):
            fail(f"expected a {_blob.HEADER_SIZE}-byte blob header at file offset "
                 f"{sym.file_offset}, but the file/section ends first (truncated?)")
        f.seek(sym.file_offset)
        header = f.read(_blob.HEADER_SIZE)
        try:
            length = _blob.blob_length(header)
        except FormatError as err:
            fail(str(err))
        if sym.size and sym.size < length:
            fail(f"the blob header gives {length} bytes, but the symbol is only {sym.size}")
        end = sym.file_offset + length
        if end > sym.section_end or end > file_size:
            fail(f"the blob header gives {length} bytes, which runs past the end of "
                 f"section {sym.section} / the file (truncated?)")
        f.seek(sym.file_offset)
        data = f.read(length)
    if len(data) != length:
        raise FormatError(f"{path}: blob truncated: expected {length} bytes, read {len(data)}")
    return data


def find_blob_symbol(f: BinaryIO, path: str, *, prefix: str | None = None) -> BlobSymbol:
    """Locate the blob symbol in the open ELF file `f` (see `read_blob`).

    Both `.dynsym` and `.symtab` are searched, so a relocatable object works too.
    """
    fd = f.fileno()
    elf = read_symbols(fd, path, (SHT_DYNSYM, SHT_SYMTAB))
    if not elf.has_table:
        raise FormatError(f"{path}: the ELF file has no symbol table (.dynsym/.symtab); "
                          "expected a kiln shared library")
    wanted = f"{prefix}{BLOB_SUFFIX}" if prefix is not None else None
    candidates: dict[str, Symbol] = {}
    for sym in elf.symbols:
        if sym.shndx == SHN_UNDEF or sym.type not in (STT_OBJECT, STT_NOTYPE):
            continue
        if sym.name == wanted if wanted else sym.name.endswith(BLOB_SUFFIX):
            candidates.setdefault(sym.name, sym)
    if not candidates:
        what = f"symbol '{wanted}'" if wanted else f"data symbol ending in '{BLOB_SUFFIX}'"
        raise FormatError(f"{path}: no {what} found: not a library exported by kiln, "
                          "or the blob was stripped")
    candidates = choose_blob(candidates, {s.name for s in elf.symbols})
    if len(candidates) > 1:
        raise FormatError(f"{path}: several blob symbols ({', '.join(sorted(candidates))}); "
                          "pass prefix= to choose one")
    (sym,) = candidates.values()
    return _locate(elf, fd, sym)


def _locate(elf: ElfSymbols, fd: int, sym: Symbol) -> BlobSymbol:
    path, name, shndx = elf.path, sym.name, sym.shndx
    if shndx >= len(elf.sections):
        raise FormatError(f"{path}: symbol '{name}' is not in a regular section "
                          f"({_SHN_NAMES.get(shndx, shndx)})")
    section = elf.sections[shndx]
    section_label = section_name(elf, fd, shndx)
    if section.type == SHT_NOBITS:
        raise FormatError(f"{path}: symbol '{name}' is in {section_label}, which has no "
                          "data in the file; expected read-only data")
    # In a relocatable object st_value is an offset into the section; in a
    # linked library it is a virtual address inside the section.
    delta = sym.value if elf.e_type == ET_REL else sym.value - section.addr
    if delta < 0 or delta > section.size:
        raise FormatError(f"{path}: symbol '{name}' at 0x{sym.value:x} lies outside its "
                          f"section {section_label}")
    return BlobSymbol(name, section.offset + delta, sym.size, section_label,
                      section.offset + section.size)


def host_machine() -> int | None:
    """The ELF e_machine of this machine's instruction set (None if kiln does not know it)."""

    return _HOST_MACHINES.get(platform.machine().lower())


def machine_name(machine: int) -> str:
    """`aarch64` for EM_AARCH64; `machine 42` for one kiln does not name."""
    return ELF_MACHINES.get(machine, f"machine {machine}")
