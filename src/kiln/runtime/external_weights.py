"""External weights: a library's weights in a file beside it (docs/runtime.md).

Export (`export_library(..., weights="external")`): the native data artifacts
(the weights) go to one weights file (kiln.artifact.weights_file) instead of
into the `.so`; the library gets, in their place, a page-aligned region of
`.bss` per tensor and the small C loader `kiln_weights.c`, which maps the
file's tensors over those regions (`{prefix}_map_weights(path)` for C hosts);
the blob's metadata records the file's content hash and default name
(`metadata["weights"]`).

Load (`load_module(path, weights=None)`): the file (beside the library, or
`weights=PATH`) is opened once per content hash in the process: a weak cache
keyed by the hash holds one read-only mapping of it, which every library of
that hash maps its regions from (the same page-cache pages: the weights cost
memory once) and which is verified once, lazily per `verify_weights`, against
the chunk hashes of its index. A file whose header, version, size or hash
differs is refused with a FormatError before any function is bound. A library
whose file differs from an open one in part (a batch-1 and a batch-32 build)
maps the 64 KiB chunks the two indexes share from the open file
(`lend_chunks`), its own file only for the rest.
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.artifact.artifact import Artifact
from kiln.artifact.integrity import DIGEST_SIZE, chunk_count
from kiln.artifact.segments import Content
from kiln.artifact.weights_file import (
    ALIGN,
    HUGE_ALIGN,
    WeightsHeader,
    read_header,
    write_weights,
)
from kiln.errors import FormatError, MissingFileError, UsageError
from kiln.runtime import ctypes_abi
from kiln.runtime.memory_library import is_memory_path
from kiln.runtime.native import include_dir
from kiln.runtime.weights import ChunkCheck, Region, RegionsCheck, lane_record

if TYPE_CHECKING:
    from kiln.runtime.module import LibraryModule

WEIGHTS_MODES = ("embedded", "external")
WEIGHTS_SUFFIX = ".weights"
# The chunk size of a weights file's index (its SHA-256s): the unit two libraries' files
# share pages by (lend_chunks). 64 KiB, a page on every host, so a chunk maps on its
# own; the blob's 4 MiB chunks would leave a batch-1 and a batch-32 ResNet-50 build
# 16 MiB apart for 8 MiB of differing weights (docs/runtime.md "One copy per process").
SHARE_CHUNK = 1 << 16
# What {prefix}_map_weights returns (kiln_weights.c), as words.
MAP_ERRORS = {-1: "cannot be opened or read", -2: "is not a kiln weights file of version 1",
              -3: "holds other weights than this library was built with",
              -4: "is truncated or holds tensors of other sizes", -5: "could not be mapped"}


def map_symbols(prefix: str) -> list[str]:
    """The entries an external-weights library exports besides the ABI symbols."""
    return [f"{prefix}_map_weights", f"{prefix}_map_weights_fd", f"{prefix}_map_weights_range"]


def default_weights_path(library: Path) -> Path:
    """`model.so` -> `model.so.weights`: where export puts and load looks for the file."""
    return library.with_name(library.name + WEIGHTS_SUFFIX)


def tensor_name(a: Artifact, data: Sequence[Artifact]) -> str:
    """A data artifact's name in the weights file: its file name, unless two share it."""
    if sum(d.file_name == a.file_name for d in data) == 1:
        return a.file_name
    return f"{a.codegen_id}/{a.file_name}"


def export_weights(hashed: Sequence[tuple[Artifact, int, bytes]], prefix: str,
                   weights_path: Path, *, name: str | None = None
                   ) -> tuple[Artifact, dict[str, Any]]:
    """Write the weights file of the native .bin artifacts, given with their chunk size
    and chunk SHA-256s; return the C loader artifact to link in their place and the
    blob metadata entry `weights`. `name` is the file name the library records
    (default: `weights_path`'s), looked up beside it at load."""
    data = [a for a, _chunk, _digests in hashed]
    items: list[tuple[str, Content, int, bytes]] = [
        (tensor_name(a, data), a.content, chunk, digests) for a, chunk, digests in hashed]
    header = write_weights(weights_path, items)
    symbols = [str(a.metadata["symbol"]) for a in data]
    # Regions as aligned as their tensors' offsets (weights_file.HUGE_ALIGN): a 2 MiB
    # folio of the file then maps with one page-table entry (the library's load address
    # is aligned to its largest section alignment).
    align = HUGE_ALIGN if any(t.size >= HUGE_ALIGN for t in header.tensors) else ALIGN
    regions = " ".join(f"X({s}, {t.size}ULL, {max(align, -(-t.size // align) * align)}ULL)"
                       for s, t in zip(symbols, header.tensors))
    hash_init = ", ".join(f"0x{b:02x}" for b in bytes.fromhex(header.content_hash))
    lines = [f"#define KILN_WEIGHTS_MAP {prefix}_map_weights",
             f"#define KILN_WEIGHTS_MAP_FD {prefix}_map_weights_fd",
             f"#define KILN_WEIGHTS_MAP_RANGE {prefix}_map_weights_range",
             f"#define KILN_WEIGHTS_HASH {{{hash_init}}}",
             f"#define KILN_WEIGHTS_COUNT {len(data)}",
             f"#define KILN_WEIGHTS_REGIONS {regions}",
             f"#define KILN_WEIGHTS_ALIGN {align}",
             *(["#define KILN_WEIGHTS_LARGE 1"] if any(a.metadata.get("large") for a in data)
               else []), ""]
    source = "\n".join(lines) + (Path(include_dir()) / "kiln" / "kiln_weights.c").read_text()
    loader = Artifact("weights", "native", "kiln_weights.c", source.encode(),
                      {"exports": map_symbols(prefix)})
    entry = {"file": name or weights_path.name, "format_version": header.version,
             "content_sha256": header.content_hash, "size": header.file_size,
             "tensors": [{"name": t.name, "symbol": s, "size": t.size, "sha256": t.sha256}
                         for s, t in zip(symbols, header.tensors)]}
    return loader, entry


class SharedWeights(ChunkCheck):
    """One weights file mapped read-only, shared by every library of its content hash.

    `view` is the mapping (a memoryview of the whole file); it verifies every tensor
    against the index's chunk hashes once (kiln.runtime.weights.ChunkCheck: in the
    background from `start()`, and in `run()`), remembering a failure.
    """

    def __init__(self, path: Path, fd: int, header: WeightsHeader) -> None:
        super().__init__()
        self.path = path
        self.fd = fd
        self.header = header
        self.content_hash = header.content_hash
        self._map = mmap.mmap(fd, header.file_size, prot=mmap.PROT_READ)
        self.view = memoryview(self._map)
        self.done = False
        weakref.finalize(self, _release, self.view, self._map, fd)

    @functools.cached_property
    def chunks(self) -> dict[bytes, tuple[int, int]]:
        """(offset in the file, length) of each chunk, by its SHA-256: what another
        library's file of partly equal bytes maps from here (lend_chunks). Built on
        first use: a process with one weights file never needs it."""
        out: dict[bytes, tuple[int, int]] = {}
        for t in self.header.tensors:
            for k in range(chunk_count(t.size, t.chunk_size)):
                start = k * t.chunk_size
                out.setdefault(t.digests[k * DIGEST_SIZE:(k + 1) * DIGEST_SIZE],
                               (t.offset + start, min(t.chunk_size, t.size - start)))
        return out

    def tensor(self, name: str) -> memoryview:
        """The bytes of tensor `name` in the mapping (no copy)."""
        t = self.header.tensor(name)
        if t is None:
            raise UsageError(f"{self.path}: no tensor {name!r} in the weights file")
        return self.view[t.offset:t.offset + t.size]

    def regions(self) -> list[Region]:
        """Every tensor, with the index's chunk hashes."""
        return [Region(self.view[t.offset:t.offset + t.size], t.digests, t.chunk_size,
                       f"{self.path}: tensor '{t.name}'") for t in self.header.tensors]


def _release(view: memoryview, mapping: mmap.mmap, fd: int) -> None:
    os.close(fd)  # the libraries' own mappings keep the file's pages
    try:
        view.release()
        mapping.close()
    except BufferError:
        pass  # a caller still holds a tensor view: the mapping goes with it


# The weights files open in this process, by content hash (weak: a file is unmapped
# when the last library using it goes).
_SHARED: weakref.WeakValueDictionary[str, SharedWeights] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def mapped_hashes() -> list[str]:
    """The content hashes of the weights files mapped in this process (one each)."""
    with _SHARED_LOCK:
        return sorted(_SHARED.keys())


def shared_weights(path: Path, entry: Mapping[str, Any], where: str) -> SharedWeights:
    """The shared mapping of the weights a library's `entry` names, opening `path` if
    no library of this process holds it yet (its header checked against `entry`)."""
    wanted = str(entry.get("content_sha256", ""))
    with _SHARED_LOCK:
        found = _SHARED.get(wanted)
        if found is not None:
            return found
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise MissingFileError(f"{where}: its weights file {str(path)!r} does not exist; "
                                   "put it beside the library or pass "
                                   "load_module(..., weights=PATH)") from None
        except OSError as exc:
            raise FormatError(f"{where}: cannot open its weights file {str(path)!r}: "
                              f"{exc.strerror or exc}") from None
        try:
            header = read_header(fd, str(path))
            _match(header, entry, path, where)
            shared = SharedWeights(path, fd, header)
        except BaseException:
            os.close(fd)
            raise
        _SHARED[wanted] = shared
        return shared


def _match(header: WeightsHeader, entry: Mapping[str, Any], path: Path, where: str) -> None:
    if header.content_hash != entry.get("content_sha256"):
        raise FormatError(f"{where}: {str(path)!r} is not this library's weights file "
                          f"(content hash {header.content_hash[:16]}..., the library was "
                          f"built with {str(entry.get('content_sha256'))[:16]}...)")
    wanted = [(t.get("name"), t.get("size")) for t in entry.get("tensors", [])]
    if [(t.name, t.size) for t in header.tensors] != wanted:
        raise FormatError(f"{where}: the tensors of {str(path)!r} differ from the library's "
                          f"({wanted})")


def file_check(lib: LibraryModule, shared: SharedWeights, metadata: Mapping[str, Any]
               ) -> ChunkCheck:
    """The check of `lib`'s external weights: through the library's kiln.lane64 table
    (kiln.runtime.weights_check; the file is then marked verified for every library
    sharing it), else the file's own check against its index's SHA-256s."""
    lanes = lane_record(lib, metadata)
    if lanes is None:
        return shared
    names = {t.get("symbol"): t.get("name") for t in metadata["weights"].get("tensors", [])}
    regions = []
    for record, chunk, intact in lanes:
        name = names.get(record.get("symbol"))
        if not isinstance(name, str):
            raise FormatError(f"{lib.path}: the 'weights_check' record names "
                              f"{record.get('symbol')!r}, no tensor of its weights file")
        view = shared.tensor(name)
        if len(view) != record["size"]:
            raise FormatError(f"{lib.path}: tensor '{name}' holds {len(view)} bytes, its "
                              f"'weights_check' record {record['size']}")
        regions.append(Region(view, b"", chunk, f"{shared.path}: tensor '{name}'", intact))
    return RegionsCheck(regions, then=lambda: setattr(shared, "done", True))


def attach(lib: LibraryModule, entry: Mapping[str, Any], weights: Any) -> SharedWeights:
    """Map `lib`'s external weights (from `weights`, else beside the library) into it."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("file"), str):
        raise FormatError(f"{lib.path}: the library metadata's 'weights' entry is malformed")
    if weights is None:
        if is_memory_path(lib.path):
            raise UsageError(f"{lib.path}: a library loaded from memory with external weights "
                             "needs load_module(data, weights=PATH)")
        path = lib.path.parent / str(entry["file"])
    elif isinstance(weights, (str, os.PathLike)):
        path = Path(weights)
    else:
        raise UsageError(f"load_module: weights must be a path (str or os.PathLike) or None, "
                         f"got {type(weights).__name__}")
    shared = shared_weights(path, entry, str(lib.path))
    try:
        map_fd = ctypes_abi.bind(lib.cdll, f"{lib.prefix}_map_weights_fd", "map_weights_fd")
    except AttributeError:
        raise FormatError(f"{lib.path}: records external weights but exports no "
                          f"{lib.prefix}_map_weights_fd; the file is damaged") from None
    rc = map_fd(shared.fd)
    if rc != 0:
        raise FormatError(f"{lib.path}: its weights file {str(shared.path)!r} "
                          f"{MAP_ERRORS.get(rc, f'was refused ({rc})')}")
    lent = lend_chunks(lib, shared)
    if lent:
        _LENT[lib] = lent
    return shared


@dataclass(frozen=True)
class Lent:
    """Bytes of a library's weights mapped from another weights file of equal bytes
    there (`tensor`'s [start, start + length), at `offset` of `source`)."""

    tensor: str
    start: int
    length: int
    source: SharedWeights
    offset: int


# What each library maps from other files (weak: the entry goes with the library; it
# holds the lending files' SharedWeights, so they stay in mapped_hashes() meanwhile).
_LENT: weakref.WeakKeyDictionary[Any, list[Lent]] = weakref.WeakKeyDictionary()


def lent_chunks(lib: Any) -> list[Lent]:
    """The parts of `lib`'s weights mapped from another library's weights file (chunks
    whose SHA-256 the two files' indexes share); [] when it maps its own file whole."""
    return list(_LENT.get(lib, ()))


def lend_chunks(lib: LibraryModule, shared: SharedWeights) -> list[Lent]:
    """Map the chunks of `lib`'s weights that another open weights file holds (equal
    SHA-256s in both indexes) from that file, so two builds of one model whose packed
    weights differ in a few arrays (a batch-1 and a batch-32 build) share the pages of
    the rest. A library exported before `{prefix}_map_weights_range` maps its own file
    whole; a refused range maps it whole again."""
    with _SHARED_LOCK:
        others = [w for w in _SHARED.values() if w is not shared]
    if not others:
        return []
    try:
        map_range = ctypes_abi.bind(lib.cdll, f"{lib.prefix}_map_weights_range",
                                    "map_weights_range")
    except AttributeError:
        return []
    lent: list[tuple[int, Lent]] = []
    for i, t in enumerate(shared.header.tensors):
        for k in range(chunk_count(t.size, t.chunk_size)):
            start = k * t.chunk_size
            length = min(t.chunk_size, t.size - start)
            digest = t.digests[k * DIGEST_SIZE:(k + 1) * DIGEST_SIZE]
            source, offset = next(((w, w.chunks[digest][0]) for w in others
                                   if w.chunks.get(digest, (0, -1))[1] == length), (None, 0))
            if source is None:
                continue
            last = lent[-1][1] if lent else None
            if last is not None and lent[-1][0] == i and last.source is source and \
                    last.start + last.length == start and last.offset + last.length == offset:
                lent[-1] = (i, Lent(t.name, last.start, last.length + length, source,
                                    last.offset))  # one mapping for a run of chunks
            else:
                lent.append((i, Lent(t.name, start, length, source, offset)))
    for i, part in lent:
        if map_range(part.source.fd, i, part.start, part.length, part.offset) != 0:
            map_fd = ctypes_abi.bind(lib.cdll, f"{lib.prefix}_map_weights_fd", "map_weights_fd")
            map_fd(shared.fd)  # back to the library's own file everywhere
            return []
    return [part for _i, part in lent]


__all__ = ["MAP_ERRORS", "SHARE_CHUNK", "WEIGHTS_MODES", "Lent", "SharedWeights", "attach",
           "default_weights_path", "export_weights", "file_check", "lend_chunks", "lent_chunks",
           "map_symbols", "mapped_hashes", "shared_weights", "tensor_name"]
