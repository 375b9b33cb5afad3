"""Reading a library's streamed weights again when the page cache holds them in small folios.

A file mapping gets 2 MiB page-table entries only for 2 MiB folios of the page cache
(kiln.runtime.page_advice). A library read from the disk through the advised mapping
gets them, and so does one kiln exported (written in whole aligned 2 MiB windows); a copy
made just before the load (`cp`, a download) is cached as its writer wrote it, in
folios of the write's size, and stays mapped with 4 KiB entries for as long as those
pages stay cached. `MADV_COLLAPSE` would rebuild them in place, but Linux takes it on a
file mapping only with `CONFIG_READ_ONLY_THP_FOR_FS` (EINVAL otherwise: not on the
kernels we run), so with `$KILN_REREAD_LARGE_PAGES=1` the loader asks it and, when it
is refused, gets the pages read again:

- a probe: one 2 MiB window of the streamed weights is read, and the process's
  `FilePmdMapped` (/proc/self/smaps_rollup) tells whether it was mapped whole; only
  when it was not is anything done;
- the file's dirty pages of the streamed ranges are written back (`sync_file_range`,
  waiting), the mapping's entries dropped (`MADV_DONTNEED`: a read-only mapping no one
  has written) and the file's clean pages dropped from the page cache
  (`POSIX_FADV_DONTNEED`: pages another process maps stay);
- the weight check's reads then fault them in through the advised mapping, in 2 MiB folios.

The cost is the write-back of what the copy left dirty and a read of the weights from the
disk instead of the page cache (docs/performance.md "A copied library's weights in 2 MiB
pages": about 3 s once on a 1.9 GB library, for about 1.1x a float32 decode step's
speed), hence opt-in. All of it is advice: off Linux, without transparent huge pages or
/proc/self/smaps_rollup, or when the probe's window is mapped whole, nothing happens.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

from kiln.runtime.page_advice import (
    MADVISE,
    SYNC_FILE_RANGE,
    SYNC_WAIT_WRITE_WAIT,
    advise,
    opened_file,
    streamed_ranges,
    whole_span,
)

ENABLE = "KILN_REREAD_LARGE_PAGES"
_MADV_COLLAPSE = 25  # linux/mman.h (Linux 6.1)
_THP = "/sys/kernel/mm/transparent_hugepage/"


def _large_page() -> int | None:
    """The size of a PMD-mapped page, if transparent huge pages are on at all."""
    try:
        with open(_THP + "enabled") as f:
            if "[never]" in f.read():
                return None
        with open(_THP + "hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def pmd_mapped_kib() -> int | None:
    """The process's file pages mapped with PMD entries, in KiB (None: not known)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("FilePmdMapped:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _windows(ranges: list[tuple[int, int]], large: int) -> list[tuple[int, int]]:
    """The whole aligned `large` windows of each range, as (start, end)."""
    out = []
    for start, end in ranges:
        first, last = whole_span(start, end, large)
        if last > first:
            out.append((first, last))
    return out


def reread_small_folios(path: str, address: int, size: int, file_offset: int | None,
                        gathered: list[tuple[int, int]]) -> bool:
    """Get the streamed weights in [address, address + size) (the blob mapped from
    `file_offset` of `path`, but for the whole pages of `gathered`) read again in large
    folios where the page cache holds them in small ones (the module's docstring);
    whether they were dropped to be read again (only with `$KILN_REREAD_LARGE_PAGES=1`).
    Call after `advise_streamed`, before the weights are read."""
    if (os.environ.get(ENABLE) != "1" or not sys.platform.startswith("linux")
            or MADVISE is None or file_offset is None):
        return False
    large = _large_page()
    if large is None or (address - file_offset) % large:
        return False  # no large pages, or offsets that cannot share their alignment
    windows = _windows(streamed_ranges(address, size, gathered), large)
    before = pmd_mapped_kib()
    if not windows or before is None:
        return False
    ctypes.string_at(windows[0][0], 1)  # the probe: one read of a window
    after = pmd_mapped_kib()
    if after is None or after > before:
        return False
    if all(advise(start, end - start, _MADV_COLLAPSE) for start, end in windows):
        return False
    with opened_file(path) as fd:
        if fd is None:
            return False
        for start, end in windows:
            offset = start - address + file_offset
            if SYNC_FILE_RANGE is not None:
                SYNC_FILE_RANGE(fd, offset, end - start, SYNC_WAIT_WRITE_WAIT)
            advise(start, end - start, mmap.MADV_DONTNEED)
            os.posix_fadvise(fd, offset, end - start, os.POSIX_FADV_DONTNEED)
    return True


__all__ = ["ENABLE", "pmd_mapped_kib", "reread_small_folios"]
