"""The kernel cache: the object code of each part of an LLVM module, on disk.

A part (kiln.codegen.llvm.split: a kernel with its loop bodies) compiled once is
not compiled again, in this build or a later one: another model with the same
kernel, a rebuild after a weight change. Its key is a SHA-256 over everything that
decides the code: the part's LLVM IR text (the kernel's op, shapes, tile and the
declarations it calls; for a kernel's part the text with its functions named by
their place, not by the model: kiln.codegen.llvm.part_names), the machine (triple,
CPU, features, opt-level, fast-math, vector width, relocation model), the LLVM and
llvmlite versions, and the sources of kiln's LLVM backend (the optimisation pipeline
lives there).

Layout: `$KILN_CACHE_DIR/kernels/v2/<aa>/<key>` (else `~/.cache/kiln/kernels/...`,
next to the compile cache of docs/compile.md), one file per part: a magic line, the
SHA-256 of the rest and two sizes, then the object, the optimised bitcode and the
declarations of the part's functions as LLVM optimised them (what a caller's part
is compiled with). A file that is not ours (another owner, writable by group or
others, a symbolic link) or whose checksum fails is never used: a damaged one is
removed, and the part compiled again, with a KernelCacheWarning. Writes go to a
temporary name and are renamed. `KILN_CACHE=0` (or `KILN_KERNEL_CACHE=0` for this
level alone) or `PassContext(config={"kiln.cache": False})` turns it off;
`clear()` (also `kiln.driver.cache.clear()`, `kiln cache clear`) empties it.

A hit of that key still lowers the kernel to LLVM IR and prints it. So the parts path
also keys each kernel before its lowering (kiln.codegen.llvm.kernel_keys: the kernel's
kiln IR, the lowering options, the machine and the codegen's sources) and keeps, under
that key, a small index entry in the same file format: the part key its lowering gave
and how the part's functions map onto the kernel's (`lookup_index`, `store_index`). A
build that finds both the index entry and the part's object skips the kernel's
lowering, printing and LLVM work; the object is the one a miss compiled.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.target.host import llvmlite_version

# v2 (2026-11-28): a kernel's part is stored under names made from its key
FORMAT = "v2"
_MAGIC = b"kiln kernel object v2\n"
_OFF = ("0", "false", "no", "off")
_HEADER = struct.Struct("<32sQQ")  # SHA-256 of what follows, object and bitcode sizes

# Parts found, compiled and stored since the process started (tests, bench/compile.py).
STATS = {"hits": 0, "misses": 0, "refused": 0, "index_hits": 0, "index_misses": 0}

# False while a build runs with the compile cache turned off by its PassContext.
enabled_in_build: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kiln_kernel_cache", default=True)


class KernelCacheWarning(UserWarning):
    """A kernel cache file was refused (damaged, not ours) or could not be written."""


def cache_root() -> Path:
    """Where part objects live: `$KILN_CACHE_DIR/kernels/v2` (else ~/.cache/kiln/...)."""
    base = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kiln")
    return Path(base) / "kernels" / FORMAT


def enabled() -> bool:
    """Whether the kernel cache is used now (environment and the build's setting)."""
    for var in ("KILN_CACHE", "KILN_KERNEL_CACHE"):
        if os.environ.get(var, "").strip().lower() in _OFF:
            return False
    return enabled_in_build.get()


@functools.cache
def codegen_fingerprint() -> str:
    """What besides a part's text decides its code: LLVM, llvmlite and the sources of
    kiln's LLVM backend (the optimisation pipeline lives there)."""
    h = hashlib.sha256()
    h.update((llvmlite_version() or "llvmlite ?").encode())
    h.update(__version__.encode() + b"\0")
    for path in sorted((Path(__file__).resolve().parent / "llvm").glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def part_key(text: str, machine: dict[str, Any], llvm_version: str) -> str:
    """The key of a part: its IR text, the machine's configuration, the codegen."""
    h = hashlib.sha256()
    for field in (FORMAT, codegen_fingerprint(), llvm_version, repr(sorted(machine.items()))):
        h.update(field.encode() + b"\0")
    h.update(text.encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_root() / key[:2] / key


def _warn(message: str) -> None:
    warnings.warn(f"kiln kernel cache: {message}", KernelCacheWarning, stacklevel=4)


def _ours(st: os.stat_result) -> bool:
    owner = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return stat.S_ISREG(st.st_mode) and owner and not st.st_mode & 0o022


def lookup(key: str) -> tuple[bytes, bytes, str] | None:
    """(object, bitcode, declarations) stored under `key`, or None (a refused file is
    removed)."""
    return _read(key, "hits", "misses")


def _read(key: str, hit: str, miss: str) -> tuple[bytes, bytes, str] | None:
    path = _path(key)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        STATS[miss] += 1
        return None  # absent, or a symbolic link (O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not _ours(os.fstat(f.fileno())):
            STATS["refused"] += 1
            _warn(f"{path} is not a private file of yours; compiling instead")
            return None
        raw = f.read()
    body = raw[len(_MAGIC) + _HEADER.size:]
    if raw.startswith(_MAGIC) and len(raw) >= len(_MAGIC) + _HEADER.size:
        digest, size, bc_size = _HEADER.unpack_from(raw, len(_MAGIC))
        if hashlib.sha256(body).digest() == digest and size + bc_size <= len(body):
            with contextlib.suppress(UnicodeDecodeError):
                found = (body[:size], body[size:size + bc_size],
                         body[size + bc_size:].decode("utf-8"))
                STATS[hit] += 1
                return found
    STATS["refused"] += 1
    _warn(f"{path} is damaged (checksum); removed, compiling the kernel again")
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def store(key: str, obj: bytes, bitcode: bytes, declarations: str) -> None:
    """Keep (object, bitcode, declarations) under `key`; a filesystem error only warns."""
    path = _path(key)
    body = obj + bitcode + declarations.encode("utf-8")
    data = _MAGIC + _HEADER.pack(hashlib.sha256(body).digest(), len(obj), len(bitcode)) + body
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).replace(path)
    except OSError as err:
        _warn(f"cannot write {path}: {err.strerror or err}")


def _index_name(key: str) -> str:
    """Where the index entry of a kernel key lives: a name no part key can take."""
    return hashlib.sha256(b"kiln kernel index\0" + key.encode()).hexdigest()


def lookup_index(key: str) -> dict[str, Any] | None:
    """The index entry stored under the kernel key `key` (kiln.codegen.llvm.kernel_keys),
    or None; a damaged or malformed one is refused with a KernelCacheWarning."""
    found = _read(_index_name(key), "index_hits", "index_misses")
    if found is None:
        return None
    try:
        entry = json.loads(found[2])
    except ValueError:
        entry = None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        STATS["index_hits"] -= 1
        STATS["refused"] += 1
        _warn(f"the index entry {_index_name(key)} is malformed; lowering the kernel")
        return None
    return entry


def store_index(key: str, entry: dict[str, Any]) -> None:
    """Keep the index entry `entry` (JSON) under the kernel key `key`."""
    store(_index_name(key), b"", b"", json.dumps({**entry, "format": FORMAT}, sort_keys=True))


def clear() -> int:
    """Remove every stored part; the bytes freed."""
    root = cache_root().parent
    freed = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) \
        if root.is_dir() else 0
    if root.is_dir() and not root.is_symlink():
        shutil.rmtree(root, ignore_errors=True)
    return freed


__all__ = ["STATS", "KernelCacheWarning", "cache_root", "clear", "codegen_fingerprint", "enabled",
           "enabled_in_build", "lookup", "lookup_index", "part_key", "store", "store_index"]
