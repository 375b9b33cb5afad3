"""Find a kiln library's `{prefix}_blob` symbol by reading only its ELF dynamic symbols.

`load_module` must learn the prefix before it can look anything up, and it
must do so fast (a full ELF parser costs several milliseconds, more than the
rest of loading). `kiln.artifact.elf.read_symbols` reads the ELF header, the
section headers and the `.dynsym`/`.dynstr` pair with `os.pread` and `struct`
-- a few kilobytes, whatever the size of the weights -- with every offset
bounds-checked, so a damaged file gives a FormatError, never a crash. The rule
(docs/abi.md): the blob is the one exported data symbol whose name ends in `_blob`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kiln.artifact.elf import (
    BLOB_SUFFIX,
    SHN_LORESERVE,
    SHN_UNDEF,
    SHT_DYNSYM,
    SHT_NOBITS,
    STT_OBJECT,
    ElfSymbols,
    choose_blob,
    read_symbols,
)
from kiln.errors import FormatError


@dataclass(frozen=True)
class BlobSymbol:
    """The blob symbol of a library: its name (`{prefix}_blob`) and ELF size."""

    name: str
    size: int
    machine: int  # ELF e_machine of the library
    # Where the blob starts in the file and where its section's data ends there
    # (None when the section has no data in the file): the blob is read through a
    # mapping of its own (kiln.runtime.blob_view).
    file_offset: int | None = None
    section_end: int | None = None

    @property
    def prefix(self) -> str:
        """The library's prefix: the symbol's name without `_blob`."""
        return self.name[: -len(BLOB_SUFFIX)]


def _dynamic_symbols(path: str) -> ElfSymbols:
    fd = os.open(path, os.O_RDONLY)
    try:
        elf = read_symbols(fd, path, (SHT_DYNSYM,))
    finally:
        os.close(fd)
    if not elf.has_table:
        raise FormatError(f"{path}: the ELF file has no dynamic symbol table; expected a "
                          "kiln shared library")
    return elf


def dynamic_symbols(path: str) -> list[tuple[str, int, int, int]]:
    """(name, type, section index, size) of every `.dynsym` entry of the ELF file `path`."""
    return [(s.name, s.type, s.shndx, s.size) for s in _dynamic_symbols(path).symbols]


def find_blob_symbol(path: str, *, prefix: str | None = None) -> BlobSymbol:
    """The library's `{prefix}_blob` symbol (the only one, unless `prefix` picks one)."""
    elf = _dynamic_symbols(path)
    symbols = elf.symbols
    wanted = None if prefix is None else prefix + BLOB_SUFFIX
    candidates = {
        s.name: s for s in symbols
        if s.type == STT_OBJECT and SHN_UNDEF < s.shndx < SHN_LORESERVE
        and (s.name == wanted if wanted else s.name.endswith(BLOB_SUFFIX))
    }
    # prefer blobs whose metadata accessor is exported too
    candidates = choose_blob(candidates, {s.name for s in symbols if s.shndx != SHN_UNDEF})
    if len(candidates) > 1:
        raise FormatError(f"{path}: several kiln libraries inside "
                          f"({', '.join(sorted(candidates))}); pass prefix= to choose one")
    if not candidates:
        what = f"'{wanted}'" if wanted else f"exported data symbol ending in '{BLOB_SUFFIX}'"
        raise FormatError(f"{path}: no {what}: not a library exported by kiln (or the blob "
                          "symbol was stripped)")
    ((name, sym),) = candidates.items()
    section = elf.sections[sym.shndx] if sym.shndx < len(elf.sections) else None
    if section is None or section.type == SHT_NOBITS or not \
            section.addr <= sym.value <= section.addr + section.size:
        return BlobSymbol(name, sym.size, elf.machine)
    return BlobSymbol(name, sym.size, elf.machine, section.offset + sym.value - section.addr,
                      section.offset + section.size)
