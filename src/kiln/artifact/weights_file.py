"""The external weights file: a library's weights beside it, versioned and checksummed.

`export_library(..., weights="external")` writes the weights (the native data
artifacts, `constants.bin`) to one file instead of into the `.so`; the library
records the file's content hash and default name. Layout (little-endian,
docs/format.md "The weights file"):

    0    magic      8 bytes  b"KILNWTS\\0"
    8    version    u32      FORMAT_VERSION
    12   count      u32      number of tensors
    16   file_size  u64      the whole file's length
    24   index_at   u64      where the JSON index starts
    32   index_size u64      its length
    40   content    32 bytes the content hash (below)
    72   table      count x (offset u64, size u64): where each tensor lies
    ...  index      JSON: {"tensors": [{name, offset, size, sha256, chunk_size,
                           chunk_sha256}, ...]}
    then the tensors, each at a multiple of ALIGN (64 KiB: a page on every host,
    so each maps zero-copy, with mmap, at its own page-aligned address); one of
    HUGE_ALIGN bytes or more at a multiple of HUGE_ALIGN (below).

The content hash is SHA-256 of "kiln.weights/1\\n", the table and the index.
The index holds every tensor's chunk SHA-256s (kiln.artifact.integrity), so the
hash names the whole content without reading the data: checking a file's
header against the hash a library recorded is cheap, and the data is checked
lazily, chunk by chunk, against the index. A tensor's `sha256` is the tree
digest of its chunk hashes (`tree_digest`). Names are the artifacts' file names
(not their symbols), so builds of one model with other prefixes or codegens
share a hash. Standard library only: the runtime and the C loader read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.artifact.integrity import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    chunk_count,
    tree_digest,
)
from kiln.artifact.segments import Content, write_content_in_blocks
from kiln.errors import FormatError

MAGIC = b"KILNWTS\0"
# Versions of the weights file:
# 1 (2026-11-27): first version.
FORMAT_VERSION = 1
ALIGN = 1 << 16
# A tensor of at least this many bytes starts at a multiple of it, and is written in
# blocks of it: the page cache then holds it in 2 MiB folios, which a mapping at an
# address congruent to the offset (the library's regions are 2 MiB-aligned,
# kiln.runtime.external_weights) maps with one page-table entry each. The first call
# after load then faults 512 times fewer (docs/performance.md "First call after load").
# Readers only require ALIGN: the layout of version 1.
HUGE_ALIGN = 1 << 21
PREAMBLE = struct.Struct("<8sIIQQQ32s")
ENTRY = struct.Struct("<QQ")
MAX_TENSORS = 1 << 16
_HASH_TAG = b"kiln.weights/1\n"


@dataclass(frozen=True)
class WeightsTensor:
    """One tensor of a weights file: where it lies and its chunk hashes."""

    name: str
    offset: int
    size: int
    chunk_size: int
    digests: bytes  # concatenated chunk SHA-256s

    @property
    def sha256(self) -> str:
        """The tree digest of the chunk hashes (kiln.artifact.integrity.tree_digest)."""
        return tree_digest(self.digests, self.size, self.chunk_size)


@dataclass(frozen=True)
class WeightsHeader:
    """What a weights file's header says (checked against itself by `read_header`)."""

    version: int
    file_size: int
    content_hash: str  # hex
    tensors: tuple[WeightsTensor, ...]

    def tensor(self, name: str) -> WeightsTensor | None:
        """The tensor called `name`, or None."""
        return next((t for t in self.tensors if t.name == name), None)


def _layout(items: Sequence[tuple[str, int, int, bytes]]) -> tuple[bytes, bytes, list[int],
                                                                      int]:
    """(table, index JSON, tensor offsets, file size) of `items` (name, size, chunk, digests)."""
    index_at = PREAMBLE.size + ENTRY.size * len(items)
    # The index's length does not depend on the offsets' values only through their
    # digits: place with a provisional index, then grow until the layout is stable.
    offsets = [0] * len(items)
    for _ in range(4):
        index = _index_json(items, offsets)
        pos = index_at + len(index)
        new = []
        for _name, size, _chunk, _digests in items:
            align = HUGE_ALIGN if size >= HUGE_ALIGN else ALIGN
            pos = -(-pos // align) * align
            new.append(pos)
            pos += size
        if new == offsets:
            break
        offsets = new
    table = b"".join(ENTRY.pack(o, item[1]) for o, item in zip(offsets, items))
    end = offsets[-1] + items[-1][1] if items else index_at + len(index)
    return table, index, offsets, end


def _index_json(items: Sequence[tuple[str, int, int, bytes]], offsets: Sequence[int]) -> bytes:
    tensors = [{"name": name, "offset": off, "size": size,
                "sha256": tree_digest(digests, size, chunk), "chunk_size": chunk,
                "chunk_sha256": digests.hex()}
               for (name, size, chunk, digests), off in zip(items, offsets)]
    return json.dumps({"tensors": tensors}, sort_keys=True, separators=(",", ":")).encode()


def content_hash(table: bytes, index: bytes) -> str:
    """The content hash of a weights file with this table and index (hex SHA-256)."""
    return hashlib.sha256(_HASH_TAG + table + index).hexdigest()


def plan_weights(items: Sequence[tuple[str, int, int, bytes]]) -> WeightsHeader:
    """The header a weights file of `items` (name, size, chunk size, chunk digests) gets."""
    names = [name for name, *_ in items]
    if len(set(names)) != len(names):
        raise FormatError(f"weights file: tensor names must be unique, got {names}")
    table, index, offsets, end = _layout(items)
    tensors = tuple(WeightsTensor(name, off, size, chunk, digests)
                    for (name, size, chunk, digests), off in zip(items, offsets))
    return WeightsHeader(FORMAT_VERSION, end, content_hash(table, index), tensors)


def write_weights(path: str | os.PathLike[str],
                  items: Sequence[tuple[str, Content, int, bytes]]) -> WeightsHeader:
    """Write the weights file `path` (atomically) from (name, bytes, chunk size, digests).

    The data is streamed piece by piece (Segments are not joined); its chunk
    hashes are taken as given (the compiler computed them once).
    """
    plan = [(name, len(content), chunk, digests) for name, content, chunk, digests in items]
    table, index, offsets, end = _layout(plan)
    header = plan_weights(plan)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(items), end,
                                  PREAMBLE.size + len(table), len(index),
                                  bytes.fromhex(header.content_hash)))
            f.write(table)
            f.write(index)
            for (_name, content, _c, _d), off in zip(items, offsets):
                f.seek(off)
                _write_blocks(f, content)
            f.truncate(end)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return header


def _write_blocks(f: Any, content: Content) -> None:
    """Write `content` at `f`'s (HUGE_ALIGN-aligned) position in whole HUGE_ALIGN blocks
    (the page cache then allocates 2 MiB folios, see HUGE_ALIGN), straight to the file."""
    f.flush()
    write_content_in_blocks(f.raw if hasattr(f, "raw") else f, content, HUGE_ALIGN)


def read_header(fd: int, where: str) -> WeightsHeader:
    """Read and check the header of the open weights file `fd` (named `where` in errors).

    FormatError when it is not a kiln weights file, has another format version,
    is truncated or extended, or its table or index do not match its content hash.
    The tensors' data is not read.
    """
    actual_size = os.fstat(fd).st_size
    head = os.pread(fd, PREAMBLE.size, 0)
    if len(head) < PREAMBLE.size or head[:8] != MAGIC:
        raise FormatError(f"{where}: not a kiln weights file (starts with {head[:8]!r}, "
                          f"expected {MAGIC!r})")
    _magic, version, count, file_size, index_at, index_size, digest = PREAMBLE.unpack(head)
    if version != FORMAT_VERSION:
        raise FormatError(f"{where}: weights file format version {version}; this kiln reads "
                          f"version {FORMAT_VERSION}: export the library again with this kiln")
    if file_size != actual_size:
        raise FormatError(f"{where}: the header gives {file_size} bytes but the file has "
                          f"{actual_size} (truncated or appended to)")
    if count > MAX_TENSORS or index_at != PREAMBLE.size + ENTRY.size * count or \
            index_at + index_size > file_size:
        raise FormatError(f"{where}: the weights file's table/index lie outside the file "
                          "(damaged header)")
    table = os.pread(fd, ENTRY.size * count, PREAMBLE.size)
    index = os.pread(fd, index_size, index_at)
    if content_hash(table, index) != digest.hex():
        raise FormatError(f"{where}: the weights file's header does not match its content "
                          "hash (damaged header)")
    tensors = _parse_index(index, table, count, file_size, where)
    return WeightsHeader(version, file_size, digest.hex(), tensors)


def _parse_index(index: bytes, table: bytes, count: int, file_size: int,
                 where: str) -> tuple[WeightsTensor, ...]:
    try:
        entries: Any = json.loads(index)["tensors"]
        tensors = tuple(WeightsTensor(str(e["name"]), int(e["offset"]), int(e["size"]),
                                      int(e["chunk_size"]), bytes.fromhex(e["chunk_sha256"]))
                        for e in entries)
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError(f"{where}: unreadable weights index ({exc})") from None
    if len(tensors) != count:
        raise FormatError(f"{where}: the index lists {len(tensors)} tensors, the table {count}")
    end = 0
    for t, (offset, size) in zip(tensors, ENTRY.iter_unpack(table)):
        if (t.offset, t.size) != (offset, size) or offset % ALIGN or offset < end or \
                offset + size > file_size or not MIN_CHUNK_SIZE <= t.chunk_size <= \
                MAX_CHUNK_SIZE or len(t.digests) != chunk_count(size, t.chunk_size) * \
                DIGEST_SIZE:
            raise FormatError(f"{where}: tensor '{t.name}' has an inconsistent place or "
                              "hashes in the weights index (damaged header)")
        end = offset + size
    return tensors


__all__ = ["ALIGN", "FORMAT_VERSION", "HUGE_ALIGN", "MAGIC", "WeightsHeader", "WeightsTensor",
           "content_hash", "plan_weights", "read_header", "write_weights"]
