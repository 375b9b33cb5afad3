"""A library's streamed weights dropped to be read again in large folios
(kiln.runtime.large_folios), and the ranges they are advised on (kiln.runtime.page_advice)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kiln.runtime import large_folios
from kiln.runtime.page_advice import streamed_ranges

LARGE = 2 << 20
OFFSET = 3 * mmap.PAGESIZE  # the blob's offset in the file: not a large page's multiple

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or
                                large_folios.MADVISE is None, reason="Linux madvise")


def test_the_streamed_ranges_leave_out_the_gathered_pages():
    page = mmap.PAGESIZE
    base = 16 * page
    assert streamed_ranges(base, 8 * page, []) == [(base, base + 8 * page)]
    # whole pages only: a gathered range's partial pages stay streamed
    assert streamed_ranges(base, 8 * page, [(base + page + 8, 3 * page)]) == [
        (base, base + 2 * page), (base + 4 * page, base + 8 * page)]
    assert streamed_ranges(base, 8 * page, [(base, 2 * page), (base + 6 * page, 2 * page)]) == [
        (base + 2 * page, base + 6 * page)]
    assert streamed_ranges(base, 4 * page, [(base, 4 * page)]) == []


@pytest.fixture()
def mapped(tmp_path: Path) -> Iterator[tuple[str, int, int, bytes]]:
    """A file of 8 MiB + a page of random bytes, mapped read-only at a 2 MiB-aligned
    address, its blob from OFFSET: (path, the blob's address, its size, the bytes)."""
    data = np.random.default_rng(61).bytes(4 * LARGE + mmap.PAGESIZE)
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    span = len(data) + 2 * LARGE
    area = libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    address = -(-area // LARGE) * LARGE + OFFSET  # the file at a 2 MiB boundary
    fd = os.open(path, os.O_RDONLY)
    try:
        fixed = libc.mmap(address - OFFSET, len(data), mmap.PROT_READ,
                          mmap.MAP_PRIVATE | 0x10, fd, 0)  # MAP_FIXED
    finally:
        os.close(fd)
    assert fixed == address - OFFSET
    try:
        yield str(path), address, len(data) - OFFSET, data
    finally:
        libc.munmap(area, span)


def dropped(monkeypatch: pytest.MonkeyPatch, pmd: list[int]) -> list[tuple[str, int, int]]:
    """What reread_small_folios writes back and drops, recorded, the kernel's calls made
    as well; `pmd` the FilePmdMapped readings it gets, in order."""
    calls: list[tuple[str, int, int]] = []
    readings = iter(pmd)
    monkeypatch.setenv(large_folios.ENABLE, "1")
    monkeypatch.setattr(large_folios, "pmd_mapped_kib", lambda: next(readings))
    monkeypatch.setattr(large_folios, "_large_page", lambda: LARGE)
    sync, fadvise, advise = large_folios.SYNC_FILE_RANGE, os.posix_fadvise, large_folios.advise
    monkeypatch.setattr(large_folios, "advise", lambda a, n, advice: advice != 25 and advise(
        a, n, advice))  # MADV_COLLAPSE refused, as without CONFIG_READ_ONLY_THP_FOR_FS
    monkeypatch.setattr(large_folios, "SYNC_FILE_RANGE", lambda fd, off, n, flags: (
        calls.append(("write back", off, n)), sync(fd, off, n, flags))[1])
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: (
        calls.append(("drop", off, n)), fadvise(fd, off, n, advice))[1])
    return calls


def test_small_folios_are_dropped_window_by_window_and_read_back_the_same(mapped, monkeypatch):
    path, address, size, data = mapped
    calls = dropped(monkeypatch, [0, 0])  # the probe's window not mapped whole
    base = address - OFFSET
    gathered = [(base + 2 * LARGE + 8, 2 * mmap.PAGESIZE)]  # one whole page of the second
    assert large_folios.reread_small_folios(path, address, size, OFFSET, gathered)
    # the whole 2 MiB windows of the streamed ranges, at their file offsets
    assert calls == [(kind, at, LARGE) for at in (LARGE, 3 * LARGE)
                     for kind in ("write back", "drop")]
    assert ctypes.string_at(address - OFFSET, len(data)) == data  # read again from the file


def test_nothing_is_dropped_where_the_probe_maps_a_large_page(mapped, monkeypatch):
    path, address, size, data = mapped
    calls = dropped(monkeypatch, [0, LARGE >> 10])
    assert not large_folios.reread_small_folios(path, address, size, OFFSET, [])
    calls += dropped(monkeypatch, [])  # offsets that cannot share a large page's alignment
    assert not large_folios.reread_small_folios(path, address, size, OFFSET + 4096, [])
    assert calls == []
    assert ctypes.string_at(address - OFFSET, len(data)) == data


def test_nothing_is_dropped_unless_asked(mapped, monkeypatch):
    path, address, size, _ = mapped
    calls = dropped(monkeypatch, [0, 0])
    monkeypatch.delenv(large_folios.ENABLE)
    assert not large_folios.reread_small_folios(path, address, size, OFFSET, [])
    assert calls == []
