"""The digest of kiln's own sources that the caches key builds by, and a cheap key to
remember it under.

The compile cache and the session cache key every build by kiln's sources (SHA-256 over
the Python, the C and the headers of the package: a source checkout changes the code
generators under one version number). Reading and hashing them (about 490 files, 5.7 MB)
costs a process about 17 ms of CPU; `stat_key` names the same files by their paths, sizes
and modification times (in nanoseconds) for 3 ms, so a digest computed once can be found
again (kiln.driver.cache.kiln_source_fingerprint) once no file changed in the last two
seconds (`settled`). Python's own bytecode cache trusts the same facts, more coarsely
(whole seconds): a source whose size and time are unchanged runs from its old bytecode,
so a remembered digest is stale only where the code that runs would be too.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

SUFFIXES = (".py", ".c", ".h")
SETTLE_NS = 2_000_000_000


def source_files(root: Path) -> list[str]:
    """The files under `root` the digest covers, as paths relative to it, in the digest's
    order (that of their parts); the bytecode folders, which hold none, are not walked."""
    found = []
    top = len(str(root)) + 1
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        below = folder[top:]
        found += [f"{below}/{f}" if below else f for f in files if f.endswith(SUFFIXES)]
    return sorted(found, key=lambda rel: rel.split("/"))


def content_digest(root: Path, files: list[str]) -> str:
    """Hex SHA-256 over each file's path below `root` and its bytes."""
    h = hashlib.sha256()
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def stat_key(root: Path, files: list[str]) -> tuple[str, int]:
    """Hex SHA-256 over each file's path below `root`, size and modification time; and
    the newest of those times (ns)."""
    h = hashlib.sha256()
    newest = 0
    for rel in files:
        st = os.stat(os.path.join(root, rel))
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        newest = max(newest, st.st_mtime_ns)
    return h.hexdigest(), newest


def settled(newest_ns: int) -> bool:
    """Whether files last modified at `newest_ns` may be remembered by `stat_key`: the
    kernel stamps a file with a coarse clock (a few ms), so a file written twice within
    one tick keeps its time; only files older than `SETTLE_NS` are remembered, and a
    change after the digest was remembered then gets a later time (as git treats
    "racily clean" files)."""
    return time.time_ns() - newest_ns > SETTLE_NS


def is_digest(text: str) -> bool:
    """Whether `text` has the form of a `content_digest`."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


__all__ = ["SETTLE_NS", "content_digest", "is_digest", "settled", "source_files", "stat_key"]
