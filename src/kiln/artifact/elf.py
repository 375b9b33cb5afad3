"""Find and read the `{prefix}_blob` symbol of a shared library without loading it.

The library is parsed as ELF with pyelftools: nothing is dlopen'ed, no code of
the file runs, so inspecting an untrusted `.so` is safe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

from kiln.artifact import blob as _blob
from kiln.errors import FormatError

ELF_MAGIC = b"\x7fELF"
BLOB_SUFFIX = "_blob"
METADATA_SUFFIX = "_metadata"


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
    """Locate the blob symbol in the open ELF file `f` (see `read_blob`)."""
    magic = f.read(4)
    f.seek(0)
    if magic != ELF_MAGIC:
        raise FormatError(f"{path}: not an ELF file (starts with {magic!r}, expected "
                          f"{ELF_MAGIC!r}); expected a kiln shared library")
    try:
        return _find(f, path, prefix)
    except FormatError:
        raise
    except Exception as err:
        # pyelftools signals malformed input with many exception types
        # (ELFError, ELFParseError, struct/construct errors, IndexError, ...).
        raise FormatError(f"{path}: malformed ELF file ({type(err).__name__}: {err})") from None


def _find(f: BinaryIO, path: str, prefix: str | None) -> BlobSymbol:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    elf = ELFFile(f)
    wanted = f"{prefix}{BLOB_SUFFIX}" if prefix is not None else None
    candidates: dict[str, Any] = {}
    all_names: set[str] = set()
    has_symtab = False
    for section in elf.iter_sections():
        if not isinstance(section, SymbolTableSection):
            continue
        has_symtab = True
        for sym in section.iter_symbols():
            name = sym.name
            all_names.add(name)
            if sym["st_shndx"] == "SHN_UNDEF" or sym["st_info"]["type"] not in (
                    "STT_OBJECT", "STT_NOTYPE"):
                continue
            if (name == wanted if wanted else name.endswith(BLOB_SUFFIX)):
                candidates.setdefault(name, sym)
    if not has_symtab:
        raise FormatError(f"{path}: the ELF file has no symbol table (.dynsym/.symtab); "
                          "expected a kiln shared library")
    if not candidates:
        what = f"symbol '{wanted}'" if wanted else f"data symbol ending in '{BLOB_SUFFIX}'"
        raise FormatError(f"{path}: no {what} found: not a library exported by kiln, "
                          "or the blob was stripped")
    if len(candidates) > 1:
        # Prefer blobs whose library also exports the matching metadata symbol.
        paired = {n: s for n, s in candidates.items()
                  if n[:-len(BLOB_SUFFIX)] + METADATA_SUFFIX in all_names}
        if len(paired) == 1:
            candidates = paired
        else:
            raise FormatError(
                f"{path}: several blob symbols ({', '.join(sorted(candidates))}); "
                "pass prefix= to choose one")
    name, sym = next(iter(candidates.items()))
    return _locate(elf, path, name, sym)


def _locate(elf: Any, path: str, name: str, sym: Any) -> BlobSymbol:
    shndx = sym["st_shndx"]
    if not isinstance(shndx, int) or shndx >= elf.num_sections():
        raise FormatError(f"{path}: symbol '{name}' is not in a regular section ({shndx})")
    section = elf.get_section(shndx)
    if section["sh_type"] == "SHT_NOBITS":
        raise FormatError(f"{path}: symbol '{name}' is in {section.name}, which has no "
                          "data in the file; expected read-only data")
    value = sym["st_value"]
    # In a relocatable object st_value is an offset into the section; in a
    # linked library it is a virtual address inside the section.
    delta = value if elf["e_type"] == "ET_REL" else value - section["sh_addr"]
    if delta < 0 or delta > section["sh_size"]:
        raise FormatError(f"{path}: symbol '{name}' at 0x{value:x} lies outside its "
                          f"section {section.name}")
    start = section["sh_offset"]
    return BlobSymbol(name, start + delta, int(sym["st_size"]), section.name,
                      start + section["sh_size"])
