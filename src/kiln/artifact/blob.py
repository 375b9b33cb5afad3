"""The library blob: the ArtifactSet and module tree embedded in every kiln .so.

Every library kiln links carries one read-only symbol `{prefix}_blob` holding
this format (byte layout in docs/format.md). It follows Apache TVM's module
blob -- a list of modules, each a loader plus its artifacts, and the
import tree in CSR form -- with a magic, a format version, a section table and
a SHA-256 checksum, so a reader can tell a damaged or newer blob from a good one.

`unpack` trusts nothing: every length and count is checked against the bytes
that are actually there before anything is allocated, and every failure is a
`kiln.errors.FormatError` that says what was expected and what was found.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any, NoReturn

from kiln import __version__
from kiln.artifact._json import canonical_json, freeze_object, parse_json_object, split_entry
from kiln.artifact.artifact import (
    NATIVE,
    Artifact,
    ArtifactSet,
    check_name,
    require_serializable,
)
from kiln.artifact.integrity import DIGEST_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, chunk_count
from kiln.artifact.segments import content_parts
from kiln.errors import ArgumentTypeError, ArtifactError, FormatError

MAGIC = b"KILNBLOB"

# Blob format versions. Readers accept MIN_SUPPORTED_VERSION..FORMAT_VERSION and
# reject anything else with a message. Bump FORMAT_VERSION for any change a
# reader of the previous version would misread, add a dated line here, and
# check in a new golden file (tests/golden/blob_v<N>_<date>.bin).
#
# 1 (2026-11-21): first version. 32-byte header (magic, version, flags,
#   total length, section count), section table, sections ARTIFACTS, MODULES,
#   IMPORT_TREE (CSR, as in TVM's blob) and METADATA, 32-byte SHA-256 trailer.
# 2 (2026-11-22): new section LINKED_DATA (kind 5): where the linked data
#   (the weights) lies after the blob in the library and the SHA-256 of each
#   of its chunks, so the runtime can check the weights (docs/format.md).
#   Version-1 blobs are still read (they carry no weight hashes).
# 3 (2026-11-22): each ARTIFACTS record holds the artifact's target_key (a str
#   after file_name; "" for host code), so the artifacts of two devices of a
#   heterogeneous build stay distinct (docs/artifacts.md). Versions 1 and 2 are
#   still read (their artifacts have target_key "").
FORMAT_VERSION = 3
MIN_SUPPORTED_VERSION = 1

# magic, version, flags, total length, section count, reserved (0).
# The first 24 bytes (magic..total length) keep their meaning in every version,
# so `blob_length` works on blobs newer than this reader.
_HEADER = struct.Struct("<8sIIQII")
HEADER_SIZE = _HEADER.size  # 32
# kind, reserved (0), offset from blob start, length in bytes.
_SECTION = struct.Struct("<IIQQ")
SECTION_ENTRY_SIZE = _SECTION.size  # 24
CHECKSUM_SIZE = 32  # SHA-256 of every byte before it
SECTION_ALIGN = 8
MAX_SECTIONS = 64

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# LINKED_DATA record: artifact index, chunk size, offset, length (then the digests).
_LINKED = struct.Struct("<IIQQ")


class SectionKind(IntEnum):
    """The sections of a blob; each appears exactly once (LINKED_DATA from version 2)."""

    ARTIFACTS = 1
    MODULES = 2
    IMPORT_TREE = 3
    METADATA = 4
    LINKED_DATA = 5


def _kinds(version: int) -> tuple[SectionKind, ...]:
    """The sections a blob of `version` holds."""
    return tuple(SectionKind)[:4] if version == 1 else tuple(SectionKind)


# Native artifacts whose content build_contents keeps even when dropping linked
# code: source text is small and is what `inspect_source("c")` shows. Objects
# and raw data (.o, .bin -- e.g. the weights) are already inside the library.
_KEEP_NATIVE_EXTENSIONS = frozenset({".c", ".h", ".cc", ".cpp", ".cxx", ".hpp"})


@dataclass(frozen=True)
class ModuleNode:
    """One module of the import tree: a loader and the artifacts it loads.

    `modules[0]` of a blob is always the host library itself (loader "native").
    """

    loader: str                  # "native" for modules[0], the host library
    artifacts: tuple[int, ...]   # indices into BlobContents.artifacts


@dataclass(frozen=True)
class LinkedData:
    """Where the bytes of a linked data artifact (the weights) lie, and their hashes.

    The library places them after the blob, in the same read-only section:
    `offset` counts from the first byte of the blob. `digests` holds the SHA-256
    of each `chunk_size` piece (kiln.artifact.integrity), 32 bytes each.
    """

    artifact: int       # index into BlobContents.artifacts (a linked stub)
    offset: int
    length: int
    chunk_size: int
    digests: bytes = field(repr=False)


@dataclass(frozen=True)
class BlobContents:
    """Everything a blob carries, as Python values."""

    artifacts: ArtifactSet
    modules: tuple[ModuleNode, ...]   # modules[0] is the root (the native host library)
    row_ptr: tuple[int, ...]          # CSR import tree over modules (docs/format.md)
    child_indices: tuple[int, ...]
    metadata: Mapping[str, Any]       # library metadata JSON (docs/abi.md)
    linked: tuple[LinkedData, ...] = ()  # linked data after the blob (version 2)

    def children(self, module: int) -> tuple[int, ...]:
        """Indices of the modules that module `module` imports."""
        return self.child_indices[self.row_ptr[module]:self.row_ptr[module + 1]]

    def module_artifacts(self, module: int) -> list[Artifact]:
        """The artifacts of module `module`, in blob order."""
        items = list(self.artifacts)
        return [require_serializable(items[i]) for i in self.modules[module].artifacts]


def is_linked(artifact: Artifact) -> bool:
    """True if the blob keeps only a stub of `artifact` (its code lives in the library)."""
    return artifact.metadata.get("linked") is True


def build_contents(artifacts: ArtifactSet, metadata: Mapping[str, Any], *,
                   drop_linked: bool = True) -> BlobContents:
    """The blob contents for a library built from `artifacts`.

    The root module (loader "native") holds the native artifacts; every other
    loader group becomes one child of the root, in order of first appearance,
    the "none" group included (inspect-only, never loaded).

    With `drop_linked`, native artifacts other than C source (.o objects, .bin
    data such as the weights) are stored without content, with
    `metadata["linked"] = True` and `metadata["size"]` = the original size: the
    library already contains them. An InMemoryArtifact raises ExportError.
    """
    meta = freeze_object(metadata, "library metadata")
    stored = ArtifactSet()
    for a in artifacts:
        art = require_serializable(a)
        if drop_linked and art.loader == NATIVE and art.extension not in _KEEP_NATIVE_EXTENSIONS:
            art = _linked_stub(art)
        stored.add(art)

    groups: dict[str, list[int]] = {NATIVE: []}
    for i, a in enumerate(stored):
        groups.setdefault(a.loader, []).append(i)
    modules = tuple(ModuleNode(loader, tuple(idx)) for loader, idx in groups.items())
    n_children = len(modules) - 1
    row_ptr = (0,) + (n_children,) * len(modules)
    child_indices = tuple(range(1, len(modules)))
    return BlobContents(stored, modules, row_ptr, child_indices, meta)


def _linked_stub(a: Artifact) -> Artifact:
    if is_linked(a) and not a.content:
        return a  # already a stub (e.g. artifacts read back from a .so)
    meta = {**a.metadata, "linked": True, "size": len(a.content)}
    return Artifact(a.codegen_id, a.loader, a.file_name, b"", meta, a.target_key)


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

def pack(contents: BlobContents) -> bytes:
    """Serialize `contents` to blob bytes (ArtifactError if the contents are inconsistent)."""
    arts = [require_serializable(a) for a in contents.artifacts]
    _check_structure([a.loader for a in arts], contents.modules, contents.row_ptr,
                     contents.child_indices, _inconsistent)
    meta = freeze_object(contents.metadata, "library metadata")

    _check_linked(arts, contents.linked, None, _inconsistent)

    sections = {
        SectionKind.ARTIFACTS: _encode_artifacts(arts),
        SectionKind.MODULES: _encode_modules(contents.modules),
        SectionKind.IMPORT_TREE: _encode_tree(contents.row_ptr, contents.child_indices),
        SectionKind.METADATA: _json_bytes(meta),
        SectionKind.LINKED_DATA: _encode_linked(contents.linked),
    }
    table_end = HEADER_SIZE + SECTION_ENTRY_SIZE * len(sections)
    offset = _align(table_end)
    table = bytearray()
    payload = bytearray(offset - table_end)
    for kind, body in sections.items():
        table += _SECTION.pack(int(kind), 0, offset, len(body))
        payload += body
        padded = _align(len(body))
        payload += bytes(padded - len(body))
        offset += padded
    total = offset + CHECKSUM_SIZE
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, total, len(sections), 0)
    body = bytes(header + table + payload)
    return body + hashlib.sha256(body).digest()


def _align(n: int) -> int:
    return -(-n // SECTION_ALIGN) * SECTION_ALIGN


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U32.pack(len(b)) + b


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _encode_artifacts(arts: list[Artifact]) -> bytes:
    out = bytearray(_U32.pack(len(arts)))
    for a in arts:
        out += _str(a.codegen_id) + _str(a.loader) + _str(a.file_name) + _str(a.target_key)
        meta = _json_bytes(a.metadata)
        out += _U32.pack(len(meta)) + meta
        out += _U64.pack(len(a.content))
        for part in content_parts(a.content):
            out += part
    return bytes(out)


def _encode_modules(modules: tuple[ModuleNode, ...]) -> bytes:
    out = bytearray(_U32.pack(len(modules)))
    for m in modules:
        out += _str(m.loader) + _U32.pack(len(m.artifacts))
        out += b"".join(_U32.pack(i) for i in m.artifacts)
    return bytes(out)


def _encode_linked(linked: tuple[LinkedData, ...]) -> bytes:
    out = bytearray(_U32.pack(len(linked)))
    for d in linked:
        out += _LINKED.pack(d.artifact, d.chunk_size, d.offset, d.length) + d.digests
    return bytes(out)


def packed_length(contents: BlobContents) -> int:
    """The byte length `pack(contents)` gives; LinkedData offsets do not change it."""
    return len(pack(contents))


def place_linked(contents: BlobContents, data: list[tuple[int, int, int, bytes]],
                 align: int) -> tuple[BlobContents, int]:
    """Contents whose LINKED_DATA places `data` after the blob; and where the data ends.

    `data` is (artifact index, length, chunk_size, digests) per linked artifact,
    laid out in that order, each at an `align`-aligned offset from the blob start.
    """
    placeholder = tuple(LinkedData(i, 0, n, c, d) for i, n, c, d in data)
    end = packed_length(replace(contents, linked=placeholder))
    linked = []
    for i, n, c, d in data:
        offset = -(-end // align) * align
        linked.append(LinkedData(i, offset, n, c, d))
        end = offset + n
    return replace(contents, linked=tuple(linked)), end


def _encode_tree(row_ptr: tuple[int, ...], child_indices: tuple[int, ...]) -> bytes:
    out = bytearray(_U32.pack(len(row_ptr)))
    out += b"".join(_U32.pack(i) for i in row_ptr)
    out += _U32.pack(len(child_indices))
    out += b"".join(_U32.pack(i) for i in child_indices)
    return bytes(out)


# --------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------

def _fail(message: str) -> NoReturn:
    raise FormatError(f"kiln blob: {message}")


def _inconsistent(message: str) -> NoReturn:
    raise ArtifactError(f"inconsistent blob contents: {message}")


def blob_length(header: bytes | bytearray | memoryview) -> int:
    """Total blob length in bytes, read from its first HEADER_SIZE bytes.

    FormatError if `header` is short or does not start with the kiln magic.
    Works for every format version (the first 24 header bytes never change).
    """
    view = memoryview(header).cast("B") if isinstance(header, memoryview) else header
    if len(view) < HEADER_SIZE:
        _fail(f"truncated header: expected {HEADER_SIZE} bytes, found {len(view)}")
    magic, _version, _flags, total, _count, _reserved = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        _fail(f"not a kiln blob: expected magic {MAGIC!r}, found {bytes(magic)!r}")
    minimum = HEADER_SIZE + CHECKSUM_SIZE
    if total < minimum:
        _fail(f"header gives total length {total}, less than the minimum {minimum}")
    return int(total)


def unpack(data: bytes | bytearray | memoryview, *, copy: bool = True,
           skip: tuple[str, ...] = ()) -> BlobContents:
    """Parse and check blob bytes; FormatError on anything unexpected.

    `data` must be exactly the blob (as long as its header says). With `copy`
    False the artifacts' contents are read-only views of `data` rather than
    copies: the caller keeps `data` valid for as long as the artifacts live
    (the runtime passes a read-only file mapping, whose pages the kernel reads
    back from the file when a view is used). The metadata's top-level object
    entries named in `skip` are left out unparsed (the runtime skips "graphs",
    which only reports read, from the library's own metadata).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"unpack expects bytes-like data, got {type(data).__name__}")
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = blob_length(view)
    _magic, version, flags, _total, count, reserved = _HEADER.unpack_from(view, 0)
    if version > FORMAT_VERSION:
        _fail(f"format version {version} is newer than this kiln {__version__} supports "
              f"(versions {MIN_SUPPORTED_VERSION}..{FORMAT_VERSION}); upgrade kiln to read it")
    if version < MIN_SUPPORTED_VERSION:
        _fail(f"format version {version} is too old: this kiln reads versions "
              f"{MIN_SUPPORTED_VERSION}..{FORMAT_VERSION}; re-export the library")
    if flags != 0:
        _fail(f"unknown header flags 0x{flags:08x}: version {version} defines none")
    if reserved != 0:
        _fail(f"reserved header field must be 0, found {reserved}")
    if len(view) < total:
        _fail(f"truncated: header gives total length {total}, only {len(view)} bytes present")
    if len(view) > total:
        _fail(f"length mismatch: header gives total length {total}, "
              f"but {len(view)} bytes were given")
    body_end = total - CHECKSUM_SIZE
    expected = bytes(view[body_end:total])
    actual = hashlib.sha256(view[:body_end]).digest()
    if actual != expected:
        _fail(f"checksum mismatch: stored sha256 {expected.hex()[:16]}..., "
              f"computed {actual.hex()[:16]}... (the blob is damaged)")

    sections = _read_section_table(view, count, body_end, _kinds(version))
    artifacts = _decode_artifacts(view, sections[SectionKind.ARTIFACTS], version, copy)
    try:
        artifact_set = ArtifactSet(artifacts)
    except ValueError as err:
        _fail(f"ARTIFACTS section: {err}")
    modules = _decode_modules(view, sections[SectionKind.MODULES])
    row_ptr, child_indices = _decode_tree(view, sections[SectionKind.IMPORT_TREE])
    start, end = sections[SectionKind.METADATA]
    raw = bytes(view[start:end])
    text: str | bytes = raw
    if skip and raw.isascii():  # anything else: the parser's own errors, unskipped
        text = raw.decode("ascii")
        for key in skip:
            text = split_entry(text, key)[0]
    metadata = parse_json_object(text, "kiln blob: METADATA section", FormatError)
    _check_structure([a.loader for a in artifacts], modules, row_ptr, child_indices, _fail)
    linked: tuple[LinkedData, ...] = ()
    if SectionKind.LINKED_DATA in sections:
        linked = _decode_linked(view, sections[SectionKind.LINKED_DATA])
        _check_linked(artifacts, linked, total, _fail)
    return BlobContents(artifact_set, modules, row_ptr, child_indices, metadata, linked)


def _read_section_table(view: memoryview, count: int, body_end: int,
                        kinds: tuple[SectionKind, ...]) -> dict[SectionKind, tuple[int, int]]:
    if count > MAX_SECTIONS:
        _fail(f"section count {count} exceeds the maximum {MAX_SECTIONS}")
    table_end = HEADER_SIZE + count * SECTION_ENTRY_SIZE
    if table_end > body_end:
        _fail(f"section table of {count} entries ends at byte {table_end}, "
              f"past the end of the data ({body_end})")
    found: dict[SectionKind, tuple[int, int]] = {}
    for i in range(count):
        raw_kind, reserved, offset, length = _SECTION.unpack_from(
            view, HEADER_SIZE + i * SECTION_ENTRY_SIZE)
        if raw_kind not in kinds:
            _fail(f"section {i} has unknown kind {raw_kind}; "
                  f"expected one of {[int(k) for k in kinds]}")
        kind = SectionKind(raw_kind)
        if reserved != 0:
            _fail(f"section {i} ({kind.name}): reserved field must be 0, found {reserved}")
        if kind in found:
            _fail(f"section {kind.name} appears twice in the section table")
        if offset < table_end or offset > body_end or length > body_end - offset:
            _fail(f"section {kind.name} [{offset}, {offset}+{length}) is out of bounds: "
                  f"sections must lie within [{table_end}, {body_end})")
        found[kind] = (offset, offset + length)
    missing = [k.name for k in kinds if k not in found]
    if missing:
        _fail(f"missing section(s) {', '.join(missing)}")
    spans = sorted((start, end, kind) for kind, (start, end) in found.items())
    for (s0, e0, k0), (s1, _e1, k1) in itertools.pairwise(spans):
        if s1 < e0:
            _fail(f"sections {k0.name} [{s0}, {e0}) and {k1.name} (from {s1}) overlap")
    return found


class _Reader:
    """Bounds-checked little-endian reads within one section."""

    def __init__(self, view: memoryview, span: tuple[int, int], section: str) -> None:
        self.view = view
        self.pos, self.end = span
        self.section = section

    def _need(self, n: int, what: str) -> None:
        left = self.end - self.pos
        if n > left:
            _fail(f"{self.section} section: {what} needs {n} bytes at offset {self.pos}, "
                  f"only {left} left in the section (truncated or corrupt)")

    def u32(self, what: str) -> int:
        self._need(4, what)
        (v,) = _U32.unpack_from(self.view, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self._need(8, what)
        (v,) = _U64.unpack_from(self.view, self.pos)
        self.pos += 8
        return int(v)

    def raw(self, n: int, what: str) -> bytes:
        self._need(n, what)
        out = bytes(self.view[self.pos:self.pos + n])
        self.pos += n
        return out

    def borrow(self, n: int, what: str) -> memoryview:
        """The next `n` bytes as a read-only view of the data (nothing copied)."""
        self._need(n, what)
        out = self.view[self.pos:self.pos + n].toreadonly()
        self.pos += n
        return out

    def text(self, what: str) -> str:
        raw = self.raw(self.u32(f"length of {what}"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            _fail(f"{self.section} section: {what} is not valid UTF-8 "
                  f"(bad byte at {err.start}: {raw[err.start:err.start + 1]!r})")

    def count(self, what: str, min_item_size: int) -> int:
        """A u32 item count, checked to fit in the remaining bytes before use."""
        n = self.u32(what)
        left = self.end - self.pos
        if n * min_item_size > left:
            _fail(f"{self.section} section: {what} is {n}, but {n} items need at least "
                  f"{n * min_item_size} bytes and only {left} are left")
        return n

    def u32_array(self, what: str) -> tuple[int, ...]:
        n = self.count(f"length of {what}", 4)
        data = self.raw(4 * n, what)
        return tuple(struct.unpack_from(f"<{n}I", data, 0))

    def done(self) -> None:
        if self.pos != self.end:
            _fail(f"{self.section} section has {self.end - self.pos} unexpected bytes "
                  f"after its last entry (at offset {self.pos})")


# Smallest possible encodings, used to bound counts before allocating.
_MIN_ARTIFACT_SIZE = 4 * 4 + 8   # four empty strings + content length (five from version 3)
_MIN_MODULE_SIZE = 4 + 4         # empty loader + artifact count


def _decode_artifacts(view: memoryview, span: tuple[int, int], version: int,
                      copy: bool = True) -> list[Artifact]:
    r = _Reader(view, span, "ARTIFACTS")
    out = []
    keyed = version >= 3
    for i in range(r.count("artifact count", _MIN_ARTIFACT_SIZE + 4 * keyed)):
        codegen_id = r.text(f"artifact {i} codegen_id")
        loader = r.text(f"artifact {i} loader")
        file_name = r.text(f"artifact {i} file_name")
        target_key = r.text(f"artifact {i} target_key") if keyed else ""
        meta_raw = r.raw(r.u32(f"artifact {i} metadata length"), f"artifact {i} metadata")
        meta = parse_json_object(meta_raw, f"kiln blob: metadata of artifact {i} "
                                 f"({codegen_id}/{file_name})", FormatError)
        size, what = r.u64(f"artifact {i} content length"), f"artifact {i} content"
        content = r.raw(size, what) if copy or not size else r.borrow(size, what)
        try:
            out.append(Artifact(codegen_id, loader, file_name, content, meta, target_key))
        except ValueError as err:
            _fail(f"artifact {i}: {err}")
    r.done()
    return out


def _decode_modules(view: memoryview, span: tuple[int, int]) -> tuple[ModuleNode, ...]:
    r = _Reader(view, span, "MODULES")
    out = []
    for i in range(r.count("module count", _MIN_MODULE_SIZE)):
        loader = r.text(f"module {i} loader")
        out.append(ModuleNode(loader, r.u32_array(f"module {i} artifact indices")))
    r.done()
    return tuple(out)


_MIN_LINKED_SIZE = _LINKED.size


def _decode_linked(view: memoryview, span: tuple[int, int]) -> tuple[LinkedData, ...]:
    r = _Reader(view, span, "LINKED_DATA")
    out = []
    for i in range(r.count("linked data count", _MIN_LINKED_SIZE)):
        r._need(_LINKED.size, f"linked data {i} record")
        artifact, chunk, offset, length = _LINKED.unpack_from(view, r.pos)
        r.pos += _LINKED.size
        if not (MIN_CHUNK_SIZE <= chunk <= MAX_CHUNK_SIZE and chunk & (chunk - 1) == 0):
            _fail(f"LINKED_DATA section: linked data {i} has chunk size {chunk}; expected a "
                  f"power of two in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
        digests = r.raw(chunk_count(length, chunk) * DIGEST_SIZE, f"linked data {i} digests")
        out.append(LinkedData(int(artifact), int(offset), int(length), int(chunk), digests))
    r.done()
    return tuple(out)


def _check_linked(artifacts: list[Artifact], linked: tuple[LinkedData, ...],
                  total: int | None, fail: Callable[[str], NoReturn]) -> None:
    """Each record names a distinct linked native stub of that size, after the blob."""
    seen: set[int] = set()
    spans = []
    for i, d in enumerate(linked):
        where = f"LINKED_DATA record {i}"
        if not 0 <= d.artifact < len(artifacts):
            fail(f"{where} refers to artifact {d.artifact}, but there are {len(artifacts)}")
        a = artifacts[d.artifact]
        if d.artifact in seen:
            fail(f"{where}: artifact {d.artifact} is listed twice")
        seen.add(d.artifact)
        if a.loader != NATIVE or not is_linked(a) or a.content:
            fail(f"{where}: artifact {d.artifact} ({a.codegen_id}/{a.file_name}) is not a "
                 "linked native stub")
        if a.metadata.get("size") != d.length:
            fail(f"{where}: length {d.length} differs from the size "
                 f"{a.metadata.get('size')!r} of artifact {a.codegen_id}/{a.file_name}")
        if len(d.digests) != chunk_count(d.length, d.chunk_size) * DIGEST_SIZE:
            fail(f"{where}: {d.length} bytes in chunks of {d.chunk_size} need "
                 f"{chunk_count(d.length, d.chunk_size)} digests")
        if total is not None and d.offset < total:
            fail(f"{where}: offset {d.offset} lies inside the blob ({total} bytes); linked "
                 "data follows the blob")
        spans.append((d.offset, d.offset + d.length, i))
    spans.sort()
    for (s0, e0, i0), (s1, _e1, i1) in itertools.pairwise(spans):
        if s1 < e0:
            fail(f"LINKED_DATA records {i0} [{s0}, {e0}) and {i1} (from {s1}) overlap")


def _decode_tree(view: memoryview,
                 span: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    r = _Reader(view, span, "IMPORT_TREE")
    row_ptr = r.u32_array("row_ptr")
    child_indices = r.u32_array("child_indices")
    r.done()
    return row_ptr, child_indices


def _check_structure(loaders: list[str], modules: tuple[ModuleNode, ...],
                     row_ptr: tuple[int, ...], child_indices: tuple[int, ...],
                     fail: Callable[[str], NoReturn]) -> None:
    """Module list and CSR import tree agree with each other and with the artifacts.

    Rules (docs/format.md): module 0 is the native root; every artifact belongs
    to exactly one module with the same loader; row_ptr has one entry per
    module plus one, starts at 0, never decreases and ends at
    len(child_indices); imports form a DAG in which every module is reachable
    from the root and the root is imported by nobody.
    """
    n = len(modules)
    if n == 0:
        fail("there must be at least one module (the native root)")
    for i, m in enumerate(modules):
        if not isinstance(m, ModuleNode):
            fail(f"module {i} is a {type(m).__name__}, expected ModuleNode")
        try:
            check_name(f"module {i} loader", m.loader)
        except ValueError as err:
            fail(str(err))
    if modules[0].loader != NATIVE:
        fail(f"module 0 (the root) must have loader '{NATIVE}', found '{modules[0].loader}'")
    owner: dict[int, int] = {}
    for i, m in enumerate(modules):
        if i > 0 and m.loader == NATIVE:
            fail(f"module {i} has loader '{NATIVE}': native code belongs to the root module 0")
        for a in m.artifacts:
            if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < len(loaders):
                fail(f"module {i} refers to artifact {a}, but there are {len(loaders)} artifacts")
            if a in owner:
                fail(f"artifact {a} belongs to both module {owner[a]} and module {i}")
            owner[a] = i
            if loaders[a] != m.loader:
                fail(f"artifact {a} has loader '{loaders[a]}' but sits in module {i} "
                     f"with loader '{m.loader}'")
    orphans = [a for a in range(len(loaders)) if a not in owner]
    if orphans:
        fail(f"artifacts {orphans[:8]} belong to no module")

    for name, values in (("row_ptr", row_ptr), ("child_indices", child_indices)):
        bad = [v for v in values if not isinstance(v, int) or not 0 <= v < 2**32]
        if bad:
            fail(f"{name} holds {bad[0]!r}, expected unsigned 32-bit ints")
    if len(row_ptr) != n + 1:
        fail(f"row_ptr has {len(row_ptr)} entries, expected {n + 1} (modules + 1)")
    if row_ptr[0] != 0:
        fail(f"row_ptr[0] must be 0, found {row_ptr[0]}")
    for i in range(n):
        if row_ptr[i + 1] < row_ptr[i]:
            fail(f"row_ptr decreases at {i + 1}: {row_ptr[i]} -> {row_ptr[i + 1]}")
    if row_ptr[n] != len(child_indices):
        fail(f"row_ptr ends at {row_ptr[n]}, expected len(child_indices) = {len(child_indices)}")
    for c in child_indices:
        if not isinstance(c, int) or not 1 <= c < n:
            fail(f"import tree child {c} is not a module index in [1, {n})")
    children = [child_indices[row_ptr[i]:row_ptr[i + 1]] for i in range(n)]
    for i, kids in enumerate(children):
        if len(set(kids)) != len(kids):
            fail(f"module {i} imports the same module twice: {list(kids)}")
    _check_dag(children, fail)


def _check_dag(children: list[tuple[int, ...]], fail: Callable[[str], NoReturn]) -> None:
    """Every module reachable from 0, no cycles (iterative DFS; no recursion limit)."""
    WHITE, GREY, BLACK = 0, 1, 2
    state = [WHITE] * len(children)
    stack: list[tuple[int, int]] = [(0, 0)]
    state[0] = GREY
    while stack:
        node, next_child = stack[-1]
        if next_child < len(children[node]):
            stack[-1] = (node, next_child + 1)
            child = children[node][next_child]
            if state[child] == GREY:
                fail(f"import cycle: module {node} imports module {child}, "
                     f"which (indirectly) imports module {node}")
            if state[child] == WHITE:
                state[child] = GREY
                stack.append((child, 0))
        else:
            state[node] = BLACK
            stack.pop()
    unreachable = [i for i, s in enumerate(state) if s == WHITE]
    if unreachable:
        fail(f"modules {unreachable[:8]} are not reachable from the root module 0")


def describe(contents: BlobContents) -> str:
    """A short human-readable outline of a blob (modules, their loaders and artifacts)."""
    items = list(contents.artifacts)
    lines = [f"kiln blob v{FORMAT_VERSION}: {len(items)} artifacts, "
             f"{len(contents.modules)} modules"]
    for i, m in enumerate(contents.modules):
        kids = contents.children(i)
        names = ", ".join(f"{items[a].codegen_id}/{items[a].file_name}" for a in m.artifacts)
        lines.append(f"  module {i} [{m.loader}] imports {list(kids)}: {names or '(no artifacts)'}")
    for d in contents.linked:
        a = items[d.artifact]
        lines.append(f"  linked data {a.codegen_id}/{a.file_name}: {d.length} bytes at blob "
                     f"offset {d.offset}, {len(d.digests) // DIGEST_SIZE} chunk SHA-256s")
    lines.append(f"  metadata: {canonical_json(contents.metadata)[:120]}")
    return "\n".join(lines)


__all__ = [
    "CHECKSUM_SIZE", "FORMAT_VERSION", "HEADER_SIZE", "MAGIC", "MIN_SUPPORTED_VERSION",
    "BlobContents", "LinkedData", "ModuleNode", "SectionKind", "blob_length",
    "build_contents", "describe", "is_linked", "pack", "packed_length", "place_linked",
    "unpack",
]
