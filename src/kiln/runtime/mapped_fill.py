"""Writing a library's weights into its reserved hole through a shared mapping, on threads.

The weights reach the page cache in large-page folios (2 MiB on x86-64), which a
mapping aligned the same maps with large-page entries (kiln.runtime.page_advice).
Filling fresh folios that large is most of what writing a model's weights costs (VGG-19's
776 MiB: 1.3-1.7 CPU s on AMD EPYC Zen 5 in a VM, ten times as much as in 64 KiB
windows, whose small folios would be mapped with 4 KiB entries), and a buffered `write`
holds the file's lock, so one thread did all of it. Copies into a shared mapping of the
file take each folio's fault on the thread that touches it: a few threads, each given
whole large-page windows, fill them at once (docs/performance.md, "Compile time, round
seventeen").

`fill_mapped` first reserves the range's blocks (`fallocate`), so a full disk is an
error here and never a SIGBUS on a write through the mapping; where it cannot (no
`fallocate`, a filesystem without it, too little space, no mapping) it writes nothing
and says so, and the caller writes the usual way.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np

from kiln.artifact.segments import Content, content_parts
from kiln.runtime.libc import libc_function

# Below this many bytes one thread writes (the threads' start costs more than it saves).
PARALLEL_MIN_BYTES = 32 << 20
MAX_THREADS = 4

_FALLOCATE_ARGS = (ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
# 64-bit offsets: fallocate64 (glibc), else fallocate where off_t is 64 bits (musl, LP64).
_FALLOCATE = libc_function("fallocate64", *_FALLOCATE_ARGS) or (
    libc_function("fallocate", *_FALLOCATE_ARGS) if ctypes.sizeof(ctypes.c_void_p) == 8
    else None)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _threads() -> int:
    """The CPUs this process may run on, at most MAX_THREADS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


def _reserve(fd: int, start: int, length: int) -> bool:
    """Whether the file's blocks of [start, start + length) are allocated (`fallocate`,
    which leaves the file's size and bytes as they were)."""
    return _FALLOCATE is not None and int(_FALLOCATE(fd, 0, start, length)) == 0


def _copy_window(dest: np.ndarray, pieces: Sequence[tuple[int, memoryview]],
                 first: int, last: int) -> None:
    """Copy the bytes of `pieces` ((offset in `dest`, bytes)) that fall in [first, last)."""
    for at, piece in pieces:
        lo, hi = max(at, first), min(at + len(piece), last)
        if lo < hi:  # numpy copies without the GIL: the threads copy at once
            dest[lo:hi] = np.frombuffer(piece[lo - at:hi - at], dtype=np.uint8)


def fill_mapped(fd: int, items: Sequence[tuple[int, Content]], block: int) -> bool:
    """Write each (file offset, content) of `items` into the open file `fd` (which already
    spans them) through a shared mapping, threads taking whole `block`-aligned windows;
    False, having written nothing, where the blocks cannot be reserved or the file mapped."""
    pieces: list[tuple[int, memoryview]] = []
    for start, content in items:
        for part in content_parts(content):
            view = memoryview(part)
            view = view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")
            if len(view):
                pieces.append((start, view))
            start += len(view)
    if not pieces:  # empty tensors only: nothing to write
        return True
    begin = min(at for at, _ in pieces) // mmap.ALLOCATIONGRANULARITY \
        * mmap.ALLOCATIONGRANULARITY
    end = max(at + len(p) for at, p in pieces)
    if os.fstat(fd).st_size < end or not _reserve(fd, begin, end - begin):
        return False
    try:
        mapping = mmap.mmap(fd, end - begin, offset=begin)
    except (OSError, ValueError):
        return False
    try:
        if _MADV_HUGEPAGE is not None:
            with contextlib.suppress(OSError):  # advice: a kernel without large pages
                mapping.madvise(_MADV_HUGEPAGE)
        _copy_all(mapping, [(at - begin, p) for at, p in pieces], block, begin)
    finally:
        mapping.close()
    return True


def _copy_all(mapping: mmap.mmap, pieces: Sequence[tuple[int, memoryview]],
              block: int, begin: int) -> None:
    """Copy `pieces` ((offset in `mapping`, bytes)) into `mapping`, which maps the file
    from offset `begin`, each thread a run of whole `block`-aligned windows of the file."""
    dest = np.frombuffer(mapping, dtype=np.uint8)
    size = len(dest)
    threads = _threads() if size >= PARALLEL_MIN_BYTES else 1
    share = -(-size // block // threads) * block
    cuts = [0, *range((-begin) % block + share, size, share), size]
    if threads == 1 or len(cuts) < 3:
        _copy_window(dest, pieces, 0, size)
        return
    with ThreadPoolExecutor(max_workers=len(cuts) - 1) as pool:
        for done in [pool.submit(_copy_window, dest, pieces, lo, hi)
                     for lo, hi in pairwise(cuts)]:
            done.result()


__all__ = ["MAX_THREADS", "PARALLEL_MIN_BYTES", "fill_mapped"]
