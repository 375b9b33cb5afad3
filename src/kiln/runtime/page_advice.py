"""Advice to the kernel about how the loaded weights are paged.

A library's weights are a read-only file mapping. With `MADV_HUGEPAGE` on it, Linux
reads the file in large-page folios when the mapping faults on pages not in the page
cache, and maps large folios with one page-table entry each (2 MiB on x86-64) where the
address and the file offset share the large page's alignment (the export aligns the
weights so: kiln.runtime.library). A decode step streams every weight once; with 4 KiB
entries it takes a TLB miss every 4 KiB. Only advice: a kernel without transparent huge
pages, or set to `never`, keeps 4 KiB pages, and the weights' bytes are the same.

Not on the gathered constants (an embedding table, read a row a token: docs/format.md
"Gathered constants"), whose pages the weight check hands back
(kiln.runtime.gathered_pages): there a fault would read and map 2 MiB a row.
`advise_streamed` asks for large pages on the rest and `MADV_NOHUGEPAGE` on them, as
transparent huge pages set to `always` would otherwise give them large pages too.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kiln.runtime.libc import libc_function

# linux/mman.h; mmap.MADV_HUGEPAGE where Python defines it.
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)


def whole_span(start: int, end: int, unit: int = mmap.PAGESIZE) -> tuple[int, int]:
    """The `unit`-aligned (first, last) within [start, end); last <= first when it holds
    no whole unit."""
    return -(-start // unit) * unit, end // unit * unit


MADVISE = (libc_function("madvise", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
           if hasattr(mmap, "MADV_DONTNEED") else None)  # None where there is no madvise


def advise(address: int, length: int, advice: int) -> bool:
    """`madvise(advice)` on the whole pages within [address, address + length); whether
    the kernel took it (False without madvise, or when there is no whole page)."""
    first, last = whole_span(address, address + length)
    if last <= first or MADVISE is None:
        return False
    return int(MADVISE(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice)) == 0


def streamed_ranges(address: int, size: int,
                    gathered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (start, end) ranges of [address, address + size) outside the whole pages of
    `gathered` (sorted, not overlapping (address, bytes) pairs within it)."""
    ranges, at = [], address
    for start, length in gathered:
        first, last = whole_span(start, start + length)
        if last > first:
            if first > at:
                ranges.append((at, first))
            at = last
    if address + size > at:
        ranges.append((at, address + size))
    return ranges


def advise_streamed(address: int, size: int, gathered: list[tuple[int, int]]) -> None:
    """Large pages on [address, address + size) but for the whole pages of `gathered`
    (sorted, not overlapping (address, bytes) pairs within it), which are asked not to
    have them (nothing off Linux)."""
    if not sys.platform.startswith("linux"):
        return
    ranges = streamed_ranges(address, size, gathered)
    for start, end in ranges:
        advise(start, end - start, _MADV_HUGEPAGE)
    bounds = [address, *(at for pair in ranges for at in pair), address + size]
    for start, end in zip(bounds[::2], bounds[1::2]):  # the gathered pages between
        advise(start, end - start, _MADV_NOHUGEPAGE)


# linux/fs.h: SYNC_FILE_RANGE_WAIT_BEFORE | _WRITE | _WAIT_AFTER (the pages written and
# clean when it returns).
SYNC_WAIT_WRITE_WAIT = 1 | 2 | 4
SYNC_FILE_RANGE = (libc_function("sync_file_range", ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.c_uint)
                   if sys.platform.startswith("linux") else None)  # None off Linux




def file_identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) `path` names now, or None where it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextmanager
def opened_file(path: str, identity: tuple[int, int] | None = None) -> Iterator[int | None]:
    """A read-only descriptor of `path` for page-cache calls (`sync_file_range`,
    `posix_fadvise`), closed after; None where it cannot be opened or, given `identity`
    (`file_identity` at load), where the path names another file now (the library was
    replaced since: its pages are not the mapped ones)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield fd if identity is None or (st.st_dev, st.st_ino) == identity else None
    finally:
        os.close(fd)


__all__ = ["MADVISE", "SYNC_FILE_RANGE", "SYNC_WAIT_WRITE_WAIT", "advise", "advise_streamed",
           "file_identity", "opened_file", "streamed_ranges", "whole_span"]
