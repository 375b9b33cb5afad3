"""A loaded library's bytes read from its file, beside the dynamic loader's mapping.

The weight check reads every byte of the weights once. Read in the library's own
mapping, every page it touches stays in the process's resident set, including the
ones no kernel ever reads (an embedding table's unused rows: 48 MiB of a 0.49B
decoder). `LibraryFile` reads them through short-lived mappings of its own instead:
each chunk is mapped, hashed and unmapped, so the check leaves the page cache
filled (the kernels map what they read from it) and nothing resident in the
process, and the library's mapping is never touched or advised (its page tables
are the kernels' alone, as with the check off).

The file is opened again by path and kept only if it is the very file the library
is mapped from (the device and inode of the mapping in /proc/self/maps): a library
file replaced on disk after loading, a mapping from memory, or a host without
/proc reads the weights in place as before (`LibraryFile.of` returns None).
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np


class LibraryFile:
    """The file a library's bytes [address, address + length) are mapped from, open."""

    def __init__(self, fd: int, delta: int) -> None:
        self._fd = fd
        self._delta = delta  # a mapped address minus its offset in the file
        self.close = weakref.finalize(self, os.close, fd)
        """Close the file (once; also when this object goes)."""

    @classmethod
    def of(cls, path: str | os.PathLike[str], address: int, length: int,
           maps: str = "/proc/self/maps") -> LibraryFile | None:
        """The file at `path` if bytes [address, address + length) of this process are
        one private mapping of it (None otherwise, or when that cannot be told)."""
        try:
            found = _mapping_of(Path(maps).read_text(), address, length)
            if found is None:
                return None
            delta, device, inode = found
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except (OSError, ValueError):
            return None
        status = os.fstat(fd)
        if (os.major(status.st_dev), os.minor(status.st_dev), status.st_ino) != (*device, inode):
            os.close(fd)  # another file at that path now
            return None
        return cls(fd, delta)

    def hash(self, hash64: Callable[[int, int], int], address: int, length: int) -> int:
        """`hash64(data, n)` of the file's bytes that are mapped at [address, address +
        length), read through a mapping made for it and unmapped after."""
        offset = address - self._delta
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(self._fd, offset - start + length, access=mmap.ACCESS_READ,
                       offset=start) as mapped:
            view = np.frombuffer(mapped, np.uint8)
            try:
                return int(hash64(view.ctypes.data + offset - start, length))
            finally:
                del view  # the mapping cannot close while a view exports it


def _mapping_of(maps: str, address: int, length: int
                ) -> tuple[int, tuple[int, int], int] | None:
    """(address minus file offset, (major, minor) device, inode) of the one private file
    mapping in the /proc/<pid>/maps text `maps` that holds [address, address + length)."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        span, perms, offset, device, inode = fields[:5]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= address < hi:
            if address + length > hi or perms[3] != "p" or int(inode) == 0:
                return None
            major, minor = (int(x, 16) for x in device.split(":"))
            return lo - int(offset, 16), (major, minor), int(inode)
    return None


__all__ = ["LibraryFile"]
