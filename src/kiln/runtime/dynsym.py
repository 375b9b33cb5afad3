"""Find a kiln library's `{prefix}_blob` symbol by reading only its ELF dynamic symbols.

`load_module` must learn the prefix before it can look anything up, and it
must do so fast (a full ELF parser costs several milliseconds, more than the
rest of loading). This reads the ELF header, the section headers and the
`.dynsym`/`.dynstr` pair with `os.pread` and `struct` -- a few kilobytes,
whatever the size of the weights -- with every offset bounds-checked, so a
damaged file gives a FormatError, never a crash. The rule (docs/abi.md): the
blob is the one defined data symbol whose name ends in `_blob`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from kiln.errors import FormatError

ELF_MAGIC = b"\x7fELF"
BLOB_SUFFIX = "_blob"
METADATA_SUFFIX = "_metadata"
SHT_DYNSYM = 11
STT_OBJECT = 1
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
MAX_SYMBOLS = 1 << 20  # a kiln library exports a handful; refuse absurd tables

# (ELF header, section header, symbol) layouts per class; fields we use by name below.
_LAYOUTS = {
    1: ("16sHHIIIIIHHHHHH", "IIIIIIIIII", "IIIBBH"),   # ELFCLASS32
    2: ("16sHHIQQQIHHHHHH", "IIQQQQIIQQ", "IBBHQQ"),   # ELFCLASS64
}


@dataclass(frozen=True)
class BlobSymbol:
    """The blob symbol of a library: its name (`{prefix}_blob`) and ELF size."""

    name: str
    size: int

    @property
    def prefix(self) -> str:
        return self.name[: -len(BLOB_SUFFIX)]


def _read(fd: int, offset: int, size: int, file_size: int, what: str, path: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise FormatError(f"{path}: {what} [{offset}, {offset}+{size}) lies outside the "
                          f"file ({file_size} bytes); the library is damaged or truncated")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError(f"{path}: short read of {what}")
    return data


def dynamic_symbols(path: str) -> list[tuple[str, int, int, int]]:
    """(name, type, section index, size) of every `.dynsym` entry of the ELF file `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        file_size = os.fstat(fd).st_size
        ident = os.pread(fd, 16, 0)
        if ident[:4] != ELF_MAGIC:
            raise FormatError(f"{path}: not an ELF file (starts with {ident[:4]!r}, expected "
                              f"{ELF_MAGIC!r}); expected a kiln shared library")
        if len(ident) < 16 or ident[4] not in _LAYOUTS or ident[5] not in (1, 2):
            raise FormatError(f"{path}: unsupported ELF class/byte order "
                              f"({ident[4:6].hex() if len(ident) >= 6 else 'truncated'})")
        endian = "<" if ident[5] == 1 else ">"
        ehdr_fmt, shdr_fmt, sym_fmt = (struct.Struct(endian + f) for f in _LAYOUTS[ident[4]])
        ehdr = ehdr_fmt.unpack(_read(fd, 0, ehdr_fmt.size, file_size, "the ELF header", path))
        shoff, shentsize, shnum = ehdr[6], ehdr[11], ehdr[12]
        if shoff == 0 or shnum == 0:
            raise FormatError(f"{path}: the ELF file has no section headers")
        if shentsize != shdr_fmt.size:
            raise FormatError(f"{path}: section header size {shentsize}, expected "
                              f"{shdr_fmt.size}")
        raw = _read(fd, shoff, shnum * shentsize, file_size, "the section headers", path)
        sections = [shdr_fmt.unpack_from(raw, i * shentsize) for i in range(shnum)]
        # section header fields: name, type, flags, addr, offset, size, link, info, align, entsize
        dynsym = next((s for s in sections if s[1] == SHT_DYNSYM), None)
        if dynsym is None:
            raise FormatError(f"{path}: the ELF file has no dynamic symbol table; expected a "
                              "kiln shared library")
        if dynsym[6] >= shnum:
            raise FormatError(f"{path}: .dynsym links to missing section {dynsym[6]}")
        strtab = sections[dynsym[6]]
        count = dynsym[5] // sym_fmt.size
        if count > MAX_SYMBOLS:
            raise FormatError(f"{path}: .dynsym claims {count} symbols")
        syms = _read(fd, dynsym[4], count * sym_fmt.size, file_size, ".dynsym", path)
        names = _read(fd, strtab[4], strtab[5], file_size, ".dynstr", path)
    finally:
        os.close(fd)

    out = []
    for i in range(count):
        fields = sym_fmt.unpack_from(syms, i * sym_fmt.size)
        if ident[4] == 2:
            name_off, info, _other, shndx, _value, size = fields
        else:
            name_off, _value, size, info, _other, shndx = fields
        end = names.find(b"\0", name_off)
        if name_off >= len(names) or end < 0:
            raise FormatError(f"{path}: dynamic symbol {i} has a name outside .dynstr")
        name = names[name_off:end].decode("utf-8", errors="replace")
        out.append((name, info & 0xF, shndx, size))
    return out


def find_blob_symbol(path: str, *, prefix: str | None = None) -> BlobSymbol:
    """The library's `{prefix}_blob` symbol (the only one, unless `prefix` picks one)."""
    symbols = dynamic_symbols(path)
    defined = {name for name, _t, shndx, _s in symbols if shndx != SHN_UNDEF}
    wanted = None if prefix is None else prefix + BLOB_SUFFIX
    candidates = {
        name: size for name, kind, shndx, size in symbols
        if kind == STT_OBJECT and SHN_UNDEF < shndx < SHN_LORESERVE
        and (name == wanted if wanted else name.endswith(BLOB_SUFFIX))
    }
    if len(candidates) > 1:  # prefer blobs whose metadata accessor is exported too
        paired = {n: s for n, s in candidates.items()
                  if n[: -len(BLOB_SUFFIX)] + METADATA_SUFFIX in defined}
        if len(paired) == 1:
            candidates = paired
        else:
            raise FormatError(f"{path}: several kiln libraries inside "
                              f"({', '.join(sorted(candidates))}); pass prefix= to choose one")
    if not candidates:
        what = f"'{wanted}'" if wanted else f"exported data symbol ending in '{BLOB_SUFFIX}'"
        raise FormatError(f"{path}: no {what}: not a library exported by kiln (or the blob "
                          "symbol was stripped)")
    ((name, size),) = candidates.items()
    return BlobSymbol(name, size)
