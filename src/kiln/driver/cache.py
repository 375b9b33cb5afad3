"""The on-disk compile cache: codegen output keyed by what determines it.

Key: SHA-256 over the lowered module's structural fingerprint (its constants named
by their place in the constant pool), the pool's chunked digest (the weights, hashed
once per compile), the target's fingerprint, the kiln version and a hash of kiln's
own sources, the llvmlite version, the symbol prefix and the codegen's identity. The
same key without the weights (the build's structure) is marked by every store: a build
whose structure the cache never stored cannot hit and skips the lookup
(`structure_known`), so its weights are hashed while it compiles rather than before
(kiln.driver.compiler).

Layout under the cache directory (docs/compile.md):

    v2/entries/<key>.json      one per build: artifact names, metadata, object names,
                               the library metadata and a SHA-256 of the entry itself
    v2/objects/<aa>/<name>     artifact contents, content-addressed: stored once, shared
                               by every entry (recompiles of one model store no new weights)
    v2/staging/                libraries being linked, moved into objects/ when stored
    v2/digests/<h>.json        the digest of a file hashed before (a model given to a
                               session), with its stat identity
    v2/structures/<key>        empty: an entry of this structure key was stored (a hint)

An entry may instead hold one linked shared library (`store_library`, for
`kiln.InferenceSession`, kiln/session/start.py): that object is loaded from where it
lies, after every byte of it is checked (`lookup_library`), unless it is the very file
stored: the same inode, size, mtime and ctime (a write, a truncation, a replacement, a
chmod or touch each change one of them; the library's own weight check, lazy by
default, still runs before its first call). The same rule lets a session skip hashing a
model file again (`remembered_digest`), except one changed less than RACY_SECONDS
before it was hashed.

An object's name is the SHA-256 of its bytes, or for data carrying chunk hashes
(the weights) the digest of those hashes (`kiln.artifact.integrity.tree_digest`),
so storing hashes nothing twice. Every read checks the file's owner and
permissions (refused unless owned by this user and not writable by group or
others, like the cache directory itself) and its hash, before anything is used.
An entry records its own key (inside its checksum) and is checked against
`ENTRY_SCHEMA`: an entry found under another key (renamed, swapped) is a miss
with a CacheWarning, never another model's code.
Files are written to a temporary name and renamed; there is no fsync: a file
damaged by a crash fails its hash and counts as a miss. Objects of DIRECT_WRITE_BYTES
or more (the weights) are written past the page cache (kiln.driver.direct_write).
In-memory artifacts are never cached.

Size: at most `$KILN_CACHE_MAX` bytes (default 2G; "500M", "2G", "1.5G", plain
bytes; "0" = no limit). When a store goes over it, the least recently used
entries (an entry's mtime is touched on every hit) are evicted, then the objects
no entry uses. `list_entries()`, `info()` and `clear()` (also `kiln cache
list|info|clear`) manage it.

Location: `$KILN_CACHE_DIR`, else `~/.cache/kiln`. Disable with
`KILN_CACHE=0` or `PassContext(config={"kiln.cache": False})`. Any filesystem
error (the path below a regular file, a read-only or full disk, a permission
denied) makes the cache no cache for that step, with a CacheWarning: a cache
that cannot be read or written never fails a build.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import mmap
import os
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kiln
from kiln import __version__
from kiln.artifact import Artifact, ArtifactSet
from kiln.artifact._json import thaw
from kiln.artifact.artifact import require_serializable
from kiln.artifact.capped import parse_size
from kiln.artifact.integrity import (
    CHUNK_SIZE,
    DIGEST_SIZE,
    chunk_count,
    chunk_digests,
    tree_digest,
    verify,
)
from kiln.artifact.schema import (
    Anything,
    Enum,
    Int,
    ListOf,
    Num,
    Obj,
    Str,
    optional,
    parse,
)
from kiln.artifact.segments import aligned_buffer, content_parts
from kiln.codegen import kernel_cache
from kiln.driver import source_digest
from kiln.driver.direct_write import write_direct
from kiln.errors import FormatError, UnsafePathError
from kiln.target.host import llvmlite_version

# 3 (2026-11-23): an entry records its key ("key"), checked on lookup.
CACHE_FORMAT = 3
# Entries of every format live in one layout: a format change changes every key.
LAYOUT = "v2"
ENTRY_FORMAT = "kiln.cache-entry"
DEFAULT_MAX_BYTES = 2 << 30
# Objects at least this large (a model's weights) are written past the page cache: a
# later build reads them back at most, and a cold compile's fresh page-cache pages for
# them cost more CPU than the copy (kiln.driver.direct_write). Tests lower it.
DIRECT_WRITE_BYTES = 16 << 20
# Objects this young are never collected: another process may be storing an
# entry that uses them.
_GRACE_SECONDS = 60.0


class CacheWarning(UserWarning):
    """The cache is not used for a step: an unsafe directory or entry (wrong owner or
    permissions), an entry under another key, or a filesystem error."""


_HEX64 = r"[0-9a-f]{64}"
# An object's name is a path component: only what `store` writes (no "/" or "..").
_OBJECT_NAME = Str(r"c?[0-9a-f]{64}", 65, "an object name (64 hex digits, 'c' first if "
                   "chunked)")
_ITEM = Obj(required={"codegen_id": Str(max_len=1024), "loader": Str(max_len=1024),
                      "file_name": Str(max_len=1024), "target_key": Str(max_len=1024),
                      "metadata": Obj(extra=Anything()), "size": Int(0),
                      "object": _OBJECT_NAME, "chunk_size": optional(Int(1, 1 << 40))})
ENTRY_SCHEMA = Obj(required={
    "format": Enum((ENTRY_FORMAT,)), "version": Enum((CACHE_FORMAT,)),
    "key": Str(_HEX64, 64, "a cache key (64 hex digits)"), "kiln_version": Str(max_len=64),
    "created": Num(), "artifacts": ListOf(_ITEM), "metadata": Obj(extra=Anything()),
    "checksum": Str(_HEX64, 64, "a SHA-256 (64 hex digits)")})
# What listing and eviction read of an entry of any format (older ones included).
_LISTED = Obj(required={"artifacts": ListOf(Obj(
                  required={"codegen_id": Str(max_len=1024), "file_name": Str(max_len=1024),
                            "object": _OBJECT_NAME}, extra=Anything()))},
              optional={"created": Num(), "kiln_version": Str(max_len=64)}, extra=Anything())

_OFF = ("0", "off", "false", "no")


@dataclass
class CacheStats:
    """Counters of this process's cache lookups (tests assert hits with these)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    errors: int = 0

    def reset(self) -> None:
        self.hits = self.misses = self.stores = self.errors = 0


STATS = CacheStats()


def cache_dir() -> Path:
    """The cache directory: $KILN_CACHE_DIR or ~/.cache/kiln."""
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "kiln"


def cache_enabled(config: dict[str, Any] | None = None) -> bool:
    """False when KILN_CACHE is off-like or the PassContext config says `kiln.cache: False`."""
    if os.environ.get("KILN_CACHE", "").strip().lower() in _OFF:
        return False
    return bool((config or {}).get("kiln.cache", True))


def kernel_cache_enabled(config: dict[str, Any] | None = None) -> bool:
    """Whether a build under this PassContext `config` uses the kernel cache
    (kiln.codegen.kernel_cache): `kiln.kernel_cache` when the config sets it, else
    as the compile cache (`cache_enabled`). The environment's switches still win."""
    config = config or {}
    return bool(config.get("kiln.kernel_cache", cache_enabled(config)))


def cache_key(*, ir_fingerprint: str, weights: str | None, target_fingerprint: str,
              prefix: str, codegen: str) -> str:
    """The hex key of one build: `weights` names its constant pool (`ConstantPool.
    fingerprint`); None gives its structure key (`structure_known`)."""

    fields = {"format": CACHE_FORMAT, "ir": ir_fingerprint, "weights": weights,
              "target": target_fingerprint,
              "kiln": __version__, "kiln_source": kiln_source_fingerprint(),
              "llvmlite": llvmlite_version(), "prefix": prefix, "codegen": codegen}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@functools.cache
def kiln_source_fingerprint() -> str:
    """SHA-256 over kiln's own sources (once per process): the Python, and the C and
    headers shipped as package data, which generated files embed (host.c starts
    with kiln_host.c, whose CPU check and thread pool change under one version too).

    The version number alone would serve stale objects to anyone running kiln
    from a source checkout while the codegens change under the same version.
    Remembered in the cache directory under the files' sizes and times (`sources/`,
    kiln.driver.source_digest): a process reads them only when one of them changed.
    """

    root = Path(kiln.__file__).resolve().parent
    files = source_digest.source_files(root)
    key, newest = source_digest.stat_key(root, files)
    memo = _root() / "sources" / key if cache_enabled() else None
    if memo is not None:
        with contextlib.suppress(OSError, FormatError):
            if _safe_dirs(create=False):
                text = _read_checked(memo).decode("ascii", "replace")
                if source_digest.is_digest(text):
                    return text
    digest = source_digest.content_digest(root, files)
    if memo is not None and source_digest.settled(newest):
        with contextlib.suppress(OSError):
            if _safe_dirs(create=True):
                _write_atomic(memo, [digest.encode()])
    return digest


# ------------------------------------------------------------------ size cap

def max_bytes() -> int | None:
    """The size cap: $KILN_CACHE_MAX (None when "0"), else DEFAULT_MAX_BYTES."""
    env = os.environ.get("KILN_CACHE_MAX", "").strip()
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        value = parse_size(env)
    except ValueError as exc:
        warnings.warn(f"KILN_CACHE_MAX: {exc}; using the default {DEFAULT_MAX_BYTES} bytes",
                      CacheWarning, stacklevel=2)
        return DEFAULT_MAX_BYTES
    return value or None


# ------------------------------------------------------------------ paths and safety

def _root() -> Path:
    return cache_dir() / LAYOUT


def entry_path(key: str) -> Path:
    """Where the index of cache entry `key` lives."""
    return _root() / "entries" / f"{key}.json"


def object_path(name: str) -> Path:
    """Where the content-addressed object `name` lives."""
    return _root() / "objects" / name[:2] / name


def structure_path(key: str) -> Path:
    """The mark that an entry of structure key `key` was stored."""
    return _root() / "structures" / key


def _unsafe(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this lstat may not be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{what} is a symbolic link"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{what} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class _Unsafe(FormatError):
    """A cache file we may not trust (another owner, writable by others): left alone."""


_WARNED: set[str] = set()


def _warn(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"kiln compile cache: {message}; not using it (compiling instead)",
                      CacheWarning, stacklevel=3)


def _degrade(exc: OSError, doing: str) -> None:
    """A filesystem error: this step goes without the cache (counted and warned once)."""
    STATS.errors += 1
    _warn(f"cannot {doing} {exc.filename or cache_dir()}: {exc.strerror or exc}")


def _safe_dirs(create: bool) -> bool:
    """The cache directories exist (made 0700 with `create`) and are safe to use."""
    root = cache_dir()
    for path in (root, root / LAYOUT, root / LAYOUT / "entries", root / LAYOUT / "objects"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return False
            # OSError (read-only home, a file in the way) goes to the caller.
            path.mkdir(mode=0o700, parents=path == root)
            st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            if create:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
            return False
        problem = _unsafe(st, f"directory {path}")
        if problem:
            _warn(problem)
            return False
    return True


def _read_checked(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file we may trust; OSError/FormatError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        _check_trusted(os.fstat(fd), path, str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _read_aligned(path: Path, align: int) -> memoryview:
    """`_read_checked`'s bytes, read-only, starting at a multiple of `align` in memory:
    a constants object the jit's kernels read where it lies (kiln.runtime.jit_constants)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        _check_trusted(st, path, str(path))
        view = aligned_buffer(st.st_size, align)
        with os.fdopen(fd, "rb", closefd=False) as f:
            if f.readinto(view) != st.st_size or f.read(1):
                raise FormatError(f"{path} changed size while it was read")
        return view.toreadonly()
    finally:
        os.close(fd)


def _check_trusted(st: os.stat_result, path: Path, what: str) -> None:
    """FormatError naming `what` unless `st` (of `path`) is a regular file; _Unsafe
    (warned) unless we may trust it."""
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{what} is not a regular file")
    problem = _unsafe(st, f"file {path}")
    if problem:
        _warn(problem)
        raise _Unsafe(problem)


def _write_atomic(path: Path, parts: Iterable[Any], size: int = 0) -> None:
    """Write `parts` to a temporary file next to `path` (mode 0600) and rename it there;
    past the page cache (kiln.driver.direct_write) when `size`, their length, is at
    least DIRECT_WRITE_BYTES.

    No fsync: every read checks the hash, so a torn file is only a miss.
    """
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if size >= DIRECT_WRITE_BYTES:
            try:
                write_direct(fd, parts)
            finally:
                os.close(fd)
        else:
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------ objects

def _object_name(a: Artifact) -> tuple[str, tuple[int, bytes] | None]:
    """(content address, (chunk size, chunk digests) when the artifact carries them)."""

    size, hexed = a.metadata.get("chunk_size"), a.metadata.get("chunk_sha256")
    if isinstance(size, int) and isinstance(hexed, str):
        with contextlib.suppress(ValueError):
            digests = bytes.fromhex(hexed)
            if size > 0 and len(digests) == chunk_count(a.size, size) * DIGEST_SIZE:
                return chunked_object_name(a.size, size, digests), (size, digests)
    return a.sha256(), None


def chunked_object_name(size: int, chunk_size: int, digests: bytes) -> str:
    """The content address of an object known by its chunk hashes (e.g. the weights),
    the same name `store` gives an artifact carrying them in its metadata."""

    return "c" + tree_digest(digests, size, chunk_size)


def store_object_async(name: Callable[[], str], size: int,
                       parts: Iterable[bytes | memoryview]) -> threading.Thread | None:
    """Start writing one object (`size` bytes, in `parts`) in a background thread, which
    asks `name()` for its name first (the weights' name waits for their digests).

    The compile driver writes the weights this way while the code generator
    runs (both release the GIL), so a large model's cache write costs no wall
    time; `store` then finds the object present. Join the thread before
    `store`. None when the cache cannot hold the object; the thread writes nothing
    when it is there already.
    Failures are counted in STATS.errors, never raised: the cache never fails a build.
    """
    cap = max_bytes()
    if cap is not None and size > cap:
        return None
    try:
        if not _safe_dirs(create=True):
            return None
    except OSError as exc:
        _degrade(exc, "write to the compile cache at")
        return None

    def write() -> None:
        try:
            target = object_path(name())
            if not target.is_file() or target.stat().st_size != size:
                _write_atomic(target, parts, size)
        except (OSError, ValueError):
            STATS.errors += 1

    thread = threading.Thread(target=write, name="kiln-cache-write", daemon=False)
    thread.start()
    return thread


def _check_object(name: str, data: bytes | memoryview, chunks: tuple[int, bytes] | None) -> None:
    if chunks is not None:
        verify(data, chunks[1], chunks[0], f"cache object {name}")
    elif hashlib.sha256(data).hexdigest() != name:
        raise FormatError(f"cache object {name}: SHA-256 mismatch (the file is damaged)")


# ------------------------------------------------------------------ entries

def _entry_checksum(entry: Mapping[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class _Misplaced(FormatError):
    """An intact entry under another key than its own (renamed or swapped)."""


def _parse_entry(raw: bytes, key: str) -> dict[str, Any]:
    """The entry for `key`: FormatError if it is damaged, _Misplaced if it is another key's."""
    where = f"cache entry {entry_path(key)}"
    entry: dict[str, Any] = parse(raw, ENTRY_SCHEMA, where)
    if entry["checksum"] != _entry_checksum(entry):
        raise FormatError(f"{where}: checksum mismatch (the entry is damaged)")
    if entry["key"] != key:
        raise _Misplaced(f"{where} is the entry of key {entry['key']} (renamed or swapped)")
    return entry


def lookup(key: str) -> ArtifactSet | None:
    """The cached ArtifactSet for `key`, or None.

    A damaged entry or object is deleted and counts as a miss (and an error);
    an unsafe one (wrong owner or permissions) is left alone, warned about and
    not used.
    """
    try:
        found = _lookup(key)
    except OSError as exc:  # the directories cannot be read: no cache for this build
        _degrade(exc, "read the compile cache at")
        found = None
    if found is None:
        STATS.misses += 1
        return None
    with contextlib.suppress(OSError):
        os.utime(entry_path(key))  # most recently used
    STATS.hits += 1
    return found


def structure_known(key: str) -> bool:
    """Whether an entry of structure key `key` (`cache_key` without weights) was stored,
    as far as the marks tell: False means no lookup of a key of this structure can hit
    (counted as a miss), so the build need not hash its weights to ask. A mark evicted
    or lost only costs a compile; the entry's own checks stay what a hit trusts."""
    try:
        if _safe_dirs(create=False) and structure_path(key).is_file():
            os.utime(structure_path(key))  # in use: eviction keeps it (`evict`)
            return True
    except OSError:
        pass  # an unreadable cache: the store after the build says so
    STATS.misses += 1
    return False


def _lookup(key: str) -> ArtifactSet | None:
    path = entry_path(key)
    if not _safe_dirs(create=False) or not path.is_file():
        return None
    try:
        entry = _parse_entry(_read_checked(path), key)
        artifacts = ArtifactSet()
        for item in entry["artifacts"]:
            name = str(item["object"])
            align = item["metadata"].get("align") if item.get("chunk_size") is not None else None
            data: bytes | memoryview = (
                _read_aligned(object_path(name), align)
                if isinstance(align, int) and 1 < align <= 4096 and not align & (align - 1)
                else _read_checked(object_path(name)))
            chunks = None
            if item.get("chunk_size") is not None:
                chunks = (int(item["chunk_size"]), bytes.fromhex(item["metadata"]["chunk_sha256"]))
            try:
                _check_object(name, data, chunks)
            except FormatError:
                with contextlib.suppress(OSError):  # damaged: the next store rewrites it
                    object_path(name).unlink()
                raise
            artifacts.add(Artifact(item["codegen_id"], item["loader"], item["file_name"], data,
                                   item["metadata"], item.get("target_key", "")))
    except (FormatError, FileNotFoundError, KeyError, TypeError, ValueError) as exc:
        # Damaged (or pointing to an object that is gone): a miss, deleted and rebuilt.
        # Unsafe: not ours to touch. Misplaced: warned about, then rebuilt under its key.
        STATS.errors += 1
        if isinstance(exc, _Misplaced):
            _warn(str(exc))
        if not isinstance(exc, _Unsafe):
            with contextlib.suppress(OSError):
                path.unlink()
        return None
    return artifacts


def store(key: str, artifacts: ArtifactSet, metadata: dict[str, Any],
          structure: str | None = None) -> bool:
    """Save `artifacts` under `key`, and mark its `structure` key (`structure_known`);
    False (and nothing written) if any is in-memory.

    Objects already present are not written again. A cache that cannot be
    written (read-only home, full disk, unsafe directory) never fails a build.
    """

    if not artifacts.serializable:
        return False
    arts = [require_serializable(a) for a in artifacts]
    cap = max_bytes()
    if cap is not None and sum(a.size for a in arts) > cap:
        return False  # would evict everything, then itself

    def write() -> bool:
        if not _safe_dirs(create=True):
            return False
        items = []
        for a in arts:
            name, chunks = _object_name(a)
            target = object_path(name)
            if not target.is_file() or target.stat().st_size != a.size:
                _write_atomic(target, content_parts(a.content), a.size)
            else:
                os.utime(target)  # keeps it out of the grace-period collection race
            items.append({"codegen_id": a.codegen_id, "loader": a.loader,
                          "file_name": a.file_name, "target_key": a.target_key,
                          "metadata": thaw(a.metadata),
                          "size": a.size, "object": name,
                          "chunk_size": chunks[0] if chunks else None})
        _write_entry(key, items, metadata)
        if structure is not None:
            _mark(structure_path(structure))
        return True

    return _committed(write, cap)


def _mark(path: Path) -> None:
    """Create the empty file `path` (0600), or touch it."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
    os.utime(path)


def _committed(write: Callable[[], bool], cap: int | None) -> bool:
    """Whether `write()` stored its objects and entry (False: it did not, or a filesystem
    error or metadata that is not JSON stopped it, counted); then evict down to `cap`."""
    try:
        if not write():
            return False
    except OSError as exc:
        _degrade(exc, "write to the compile cache at")
        return False
    except (TypeError, ValueError):  # metadata that is not JSON: not cacheable
        STATS.errors += 1
        return False
    STATS.stores += 1
    _keep_under(cap)
    return True


def _write_entry(key: str, items: list[dict[str, Any]], metadata: dict[str, Any]) -> None:
    """Write the entry of `key` (its objects stored already); OSError, or TypeError and
    ValueError for metadata that is not JSON."""
    entry: dict[str, Any] = {"format": ENTRY_FORMAT, "version": CACHE_FORMAT, "key": key,
                             "kiln_version": __version__, "created": time.time(),
                             "artifacts": items, "metadata": metadata}
    entry["checksum"] = _entry_checksum(entry)
    _write_atomic(entry_path(key), [json.dumps(entry, sort_keys=True).encode()])


def _keep_under(cap: int | None) -> None:
    """Evict down to `cap` bytes after a store, if the cache holds more."""
    if cap is None:
        return
    try:
        # Under the cap, nothing to evict: only stat the files. A new process (a CLI
        # compile) would otherwise parse every entry of the cache at its first store.
        used = usage()
        if used > cap:
            evict(cap, used=used)
    except OSError as exc:
        _degrade(exc, "evict entries from the compile cache at")


# ------------------------------------------------------------------ linked libraries

# The codegen_id of an entry holding one linked library (kiln.session.start): such an
# entry's one object is a shared library, loaded from where it lies, never read back.
LIBRARY_ENTRY = "linked-library"
LIBRARY_FILE = "lib.so"


# A file changed this close to the moment it was hashed may change again within one
# timestamp tick unseen (git's "racy clean" case): its digest is not remembered.
RACY_SECONDS = 2.0
_DIGEST_MEMO = Obj(required={"path": Str(max_len=4096), "stat": ListOf(Int(), 5, 5),
                             "digest": Str(_HEX64, 64, "a digest (64 hex digits)")})


@dataclass(frozen=True)
class LibraryHit:
    """A linked library found in the cache: its file, its entry's metadata, and whether
    every byte was hashed now (`hashed`; else the file is the very one stored, unchanged
    since: same inode, size, mtime and ctime)."""

    path: Path
    metadata: dict[str, Any]
    hashed: bool


def stat_identity(st: os.stat_result) -> list[int]:
    """What changes whenever a file is written, replaced or touched: device, inode,
    size, mtime and ctime (nanoseconds)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _digest_memo(path: Path) -> Path:
    return _root() / "digests" / f"{hashlib.sha256(str(path).encode()).hexdigest()}.json"


def remembered_digest(path: Path, st: os.stat_result) -> str | None:
    """The digest `remember_digest` kept for the file at `path` (an absolute path) if
    the file is unchanged since (`st`, its stat now, has the same identity); else None."""
    memo = _digest_memo(path)
    try:
        if not _safe_dirs(create=False) or not memo.is_file():
            return None
        found = parse(_read_checked(memo), _DIGEST_MEMO, f"digest memo {memo}")
    except (OSError, FormatError):
        return None
    if found["path"] != str(path) or found["stat"] != stat_identity(st):
        return None
    return str(found["digest"])


def remember_digest(path: Path, st: os.stat_result, digest: str, hashed_at: float) -> None:
    """Keep `digest`, hashed from the file at `path` (stat `st` before and after) from
    time `hashed_at` on, unless the file changed less than RACY_SECONDS before."""
    if max(st.st_mtime_ns, st.st_ctime_ns) > (hashed_at - RACY_SECONDS) * 1e9:
        return
    try:
        if _safe_dirs(create=True):
            memo = _digest_memo(path)
            body = {"path": str(path), "stat": stat_identity(st), "digest": digest}
            _write_atomic(memo, [json.dumps(body).encode()])
    except OSError as exc:
        _degrade(exc, "write to the compile cache at")


def staging_dir() -> Path | None:
    """A fresh private directory inside the cache (the objects' filesystem, so a library
    linked there is stored by a rename), or None when the cache cannot be written."""
    try:
        if not _safe_dirs(create=True):
            return None
        parent = _root() / "staging"
        parent.mkdir(mode=0o700, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="link-", dir=parent))
    except OSError as exc:
        _degrade(exc, "write to the compile cache at")
        return None


def store_library(key: str, path: Path, metadata: dict[str, Any]) -> Path | None:
    """Move the linked library at `path` (written in `staging_dir()`) into the cache as
    the entry of `key`, with `metadata` beside it; the path it now has, or None (the
    file left where it is) when the cache cannot take it."""
    cap = max_bytes()
    moved: list[Path] = []

    def write() -> bool:
        size = path.stat().st_size
        if (cap is not None and size > cap) or not _safe_dirs(create=True):
            return False
        name = chunked_object_name(size, CHUNK_SIZE, file_chunk_digests(path, size))
        target = object_path(name)
        target.parent.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o600)
        os.replace(path, target)  # atomic; an equal object already there is replaced
        moved.append(target)
        stored = {"stat": stat_identity(os.lstat(target))}  # a hit on it hashes nothing
        _write_entry(key, [{"codegen_id": LIBRARY_ENTRY, "loader": "none",
                            "file_name": LIBRARY_FILE, "target_key": "", "metadata": stored,
                            "size": size, "object": name, "chunk_size": CHUNK_SIZE}],
                     metadata)
        return True

    if _committed(write, cap):
        return moved[0]
    for target in moved:  # the entry failed: the library goes back to the caller
        with contextlib.suppress(OSError):
            os.replace(target, path)
    return None


def lookup_library(key: str) -> LibraryHit | None:
    """The linked library stored under `key`, every byte checked against its name, or None.

    A damaged or foreign entry (another key's, one that holds no linked library, a
    library whose bytes changed) is refused with a CacheWarning saying why, deleted and
    counted a miss; an unsafe one (wrong owner or permissions) is left alone.
    """
    path = entry_path(key)
    try:
        found = _safe_dirs(create=False) and path.is_file() and _library_of(path, key)
    except OSError as exc:
        _degrade(exc, "read the compile cache at")
        found = None
    if not found:
        STATS.misses += 1
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # most recently used
    STATS.hits += 1
    return found


def _library_of(path: Path, key: str) -> LibraryHit | None:
    """The checked library of entry file `path` (key `key`); None, warned and deleted,
    when the entry cannot be used."""
    obj = None
    try:
        entry = _parse_entry(_read_checked(path), key)
        items = entry["artifacts"]
        if len(items) != 1 or items[0]["codegen_id"] != LIBRARY_ENTRY:
            held = ", ".join(f"{i['codegen_id']}/{i['file_name']}" for i in items) or "nothing"
            raise FormatError(f"cache entry {path} holds {held}, not a linked library")
        obj = object_path(str(items[0]["object"]))
        hashed = _check_library_file(obj, items[0])
    except (FormatError, FileNotFoundError, KeyError, TypeError, ValueError) as exc:
        STATS.errors += 1
        if not isinstance(exc, _Unsafe):
            _warn(str(exc))
            for damaged in [p for p in (path, obj) if p is not None]:
                with contextlib.suppress(OSError):
                    damaged.unlink()
        return None
    return LibraryHit(obj, dict(entry["metadata"]), hashed)


def _check_library_file(path: Path, item: Mapping[str, Any]) -> bool:
    """FormatError (or _Unsafe) unless `path` is a trusted regular file of the entry
    item's size, either the very file stored (its stat identity unchanged: False) or one
    whose chunk hashes give its object name (True)."""
    st = os.lstat(path)
    _check_trusted(st, path, f"cache object {path}")
    if st.st_size != item["size"]:
        raise FormatError(f"cache object {path}: {st.st_size} bytes where its entry says "
                          f"{item['size']} (the library is damaged)")
    if item["metadata"].get("stat") == stat_identity(st):
        return False
    chunk = int(item["chunk_size"] or CHUNK_SIZE)
    if chunked_object_name(st.st_size, chunk, file_chunk_digests(path, st.st_size, chunk)) \
            != item["object"]:
        raise FormatError(f"cache object {path}: its bytes do not match its SHA-256 "
                          "(the library is damaged)")
    return True


def file_chunk_digests(path: Path, size: int, chunk_size: int = CHUNK_SIZE) -> bytes:
    """The chunk digests of the file at `path` (`size` bytes), hashed on several threads
    from a read-only mapping (no copy of a file of hundreds of megabytes)."""
    if size == 0:
        return b""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, \
            memoryview(m) as view:
        return chunk_digests(view, chunk_size)


# ------------------------------------------------------------------ management

@dataclass(frozen=True)
class CacheEntry:
    """One cache entry as `list_entries` reports it."""

    key: str
    size: int             # the entry plus the objects it uses (shared ones counted fully)
    last_used: float      # seconds since the epoch (the entry's mtime)
    created: float
    artifacts: tuple[str, ...]   # "codegen_id/file_name"
    kiln_version: str


def _entries() -> list[tuple[Path, os.stat_result]]:
    folder = _root() / "entries"
    out = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for p in folder.iterdir():
            if p.suffix == ".json" and not p.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    out.append((p, p.stat()))
    return out


def _objects() -> dict[str, Path]:
    out = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for sub in (_root() / "objects").iterdir():
            if sub.is_dir():
                for p in sub.iterdir():
                    if not p.name.startswith("."):
                        out[p.name] = p
    return out


def _listed(path: Path) -> dict[str, Any]:
    """What listing and eviction read of an entry (any format); FormatError or OSError."""
    entry: dict[str, Any] = parse(path.read_bytes(), _LISTED, f"cache entry {path}")
    return entry


# Object names of the entries eviction has read, by (entry path, inode, size): an entry
# is only ever replaced by a rename (a new inode), so eviction after each store parses
# just the new entries, not the whole cache again.
_ENTRY_OBJECTS: dict[tuple[str, int, int], list[str]] = {}
_ENTRY_OBJECTS_LOCK = threading.Lock()


def _entry_objects(path: Path, st: os.stat_result | None = None) -> list[str]:
    """The object names entry `path` uses ([] when it cannot be read); remembered by
    inode and size when `st`, its stat, is given."""
    memo = None if st is None else (str(path), st.st_ino, st.st_size)
    if memo is not None:
        with _ENTRY_OBJECTS_LOCK:
            known = _ENTRY_OBJECTS.get(memo)
        if known is not None:
            return known
    try:
        names = [item["object"] for item in _listed(path)["artifacts"]]
    except (OSError, FormatError):
        return []
    if memo is not None:
        with _ENTRY_OBJECTS_LOCK:
            _ENTRY_OBJECTS[memo] = names
    return names


def _forget_entries_except(entries: Iterable[tuple[Path, os.stat_result]]) -> None:
    """Drop the remembered object names of entries no longer in the cache."""
    keep = {(str(p), st.st_ino, st.st_size) for p, st in entries}
    with _ENTRY_OBJECTS_LOCK:
        for memo in [m for m in _ENTRY_OBJECTS if m not in keep]:
            del _ENTRY_OBJECTS[memo]


def list_entries() -> list[CacheEntry]:
    """Every entry of the cache, most recently used first."""
    objects = _objects()
    out = []
    for path, st in _entries():
        try:
            entry = _listed(path)
            items = entry["artifacts"]
            size = st.st_size + sum(objects[i["object"]].stat().st_size
                                    for i in items if i["object"] in objects)
            out.append(CacheEntry(path.stem, size, st.st_mtime, float(entry.get("created", 0)),
                                  tuple(f"{i['codegen_id']}/{i['file_name']}" for i in items),
                                  str(entry.get("kiln_version", "?"))))
        except (OSError, FormatError):
            continue
    return sorted(out, key=lambda e: e.last_used, reverse=True)


def usage() -> int:
    """Bytes the cache holds on disk (entries and objects)."""
    total = sum(st.st_size for _p, st in _entries())
    for p in _objects().values():
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def info() -> dict[str, Any]:
    """The cache's directory, size cap, entry and object counts and bytes used."""
    return {"dir": str(cache_dir()), "max_bytes": max_bytes(), "entries": len(_entries()),
            "objects": len(_objects()), "bytes": usage(), "enabled": cache_enabled()}


def evict(limit: int, *, used: int | None = None) -> int:
    """Evict least recently used entries until the cache holds at most `limit` bytes
    (`used`: what `usage()` just returned, if the caller has it).

    Then removes objects no entry uses (except very recent ones, which a
    concurrent store may be about to use). Returns the bytes freed.
    """
    before = usage() if used is None else used
    entries = sorted(_entries(), key=lambda e: e[1].st_mtime)
    total = before
    objects = _objects()
    sizes = {n: p.stat().st_size for n, p in objects.items() if p.exists()}
    users: dict[str, int] = {}
    _forget_entries_except(entries)
    for path, st in entries:
        for name in _entry_objects(path, st):
            users[name] = users.get(name, 0) + 1
    evicted: set[str] = set()
    for path, st in entries:
        if total <= limit:
            break
        names = _entry_objects(path, st)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        total -= st.st_size
        for name in names:
            users[name] -= 1
            if users[name] == 0:
                total -= sizes.get(name, 0)
                evicted.add(name)
    now = time.time()
    for name, p in objects.items():
        if users.get(name, 0) == 0:
            with contextlib.suppress(FileNotFoundError):
                # An object no entry ever used may belong to a store still under way.
                if name in evicted or now - p.stat().st_mtime > _GRACE_SECONDS:
                    p.unlink()
    _forget_structures(min((st.st_mtime for path, st in entries if path.exists()),
                           default=now))
    return before - usage()


def _forget_structures(oldest: float) -> None:
    """Remove the structure marks (`structure_known`) untouched since before `oldest`,
    the last use of the least recently used entry left: a mark is touched whenever an
    entry of its structure is stored or looked up, so no entry left needs them."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for p in (_root() / "structures").iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < oldest - _GRACE_SECONDS:
                    p.unlink()


def clear() -> int:
    """Remove every entry and object (and entries of older cache layouts) and the kernel
    cache (kiln.codegen.kernel_cache); bytes freed."""
    root = cache_dir()
    freed = usage()
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(root)
        problem = _unsafe(st, f"directory {root}")
        if problem:
            raise UnsafePathError(f"kiln compile cache: {problem}; refusing to clear it")
    for sub in (root / LAYOUT, root / "artifacts"):  # "artifacts": the version-1 layout
        if sub.is_dir() and not sub.is_symlink():
            shutil.rmtree(sub, ignore_errors=True)
    return freed + kernel_cache.clear()
