"""A library given as bytes: an anonymous memory file the dynamic loader can map.

`load_module(data)` takes a `.so` kept in memory (a download, a blob-store
object) as `bytes`, `bytearray`, `memoryview` or `mmap`. The dynamic loader
maps only files, so the bytes are written once into an anonymous memory file
(`memfd_create`, Linux 3.17+, glibc 2.27+; sealed against writes and growth),
loaded as `/proc/self/fd/N`; no file is ever written to disk. The library's
pages, its embedded weights included, are then the memory file's pages, used in
place like a file's page cache: the caller may drop `data` at once. The same
checks run as for a file (blob, CPU, weights). Elsewhere it raises UsageError:
write the bytes to a file and load that.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

from kiln.errors import ArgumentTypeError, FormatError, UsageError

LibraryBytes = bytes | bytearray | memoryview | mmap.mmap
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")


def memory_file(data: LibraryBytes, name: str = "kiln-library.so") -> tuple[int, Path]:
    """(fd, path) of a sealed anonymous memory file holding `data`; the caller closes fd.

    The path (`/proc/self/fd/N`) stays valid while the fd is open.
    """
    if not isinstance(data, (bytes, bytearray, memoryview, mmap.mmap)):
        raise ArgumentTypeError(f"load_module: expected library bytes, got {type(data).__name__}")
    create = getattr(os, "memfd_create", None)
    if create is None or not os.path.isdir("/proc/self/fd"):
        raise UsageError("load_module(bytes) needs memfd_create and /proc (Linux); write the "
                         "library to a file and load its path")
    view = memoryview(data).cast("B")
    if len(view) < 4 or bytes(view[:4]) != b"\x7fELF":
        raise FormatError(f"load_module: the {len(view)} bytes given are not a shared library "
                          "(no ELF header); pass the bytes of a .so written by export_library")
    flags = getattr(os, "MFD_CLOEXEC", 0) | getattr(os, "MFD_ALLOW_SEALING", 0)
    fd = create(name, flags)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(view)
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, Path(f"/proc/self/fd/{fd}")


def _seal(fd: int) -> None:
    """No one changes the memory file once loaded (best effort: seals need Linux 3.17+)."""
    import fcntl  # optional: POSIX only (memfd_create already implies Linux)
    seals = 0
    for name in _SEALS:
        seals |= getattr(fcntl, name, 0)
    add = getattr(fcntl, "F_ADD_SEALS", None)
    if add is not None and seals:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, add, seals)


def is_memory_path(path: Path) -> bool:
    """Whether `path` is a memory file's `/proc/self/fd/N` (no directory beside it)."""
    return str(path).startswith("/proc/self/fd/")


__all__ = ["LibraryBytes", "is_memory_path", "memory_file"]
