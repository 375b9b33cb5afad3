"""Advice to the kernel about how the loaded weights are paged.

A library's weights are a read-only file mapping. With `MADV_HUGEPAGE` on it, Linux
reads the file in large-page folios when the mapping faults on pages not in the page
cache, and maps large folios with one page-table entry each (2 MiB on x86-64) where the
address and the file offset share the large page's alignment (the export aligns the
weights so: kiln.runtime.library). A decode step streams every weight once; with 4 KiB
entries it takes a TLB miss every 4 KiB. Only advice: a kernel without transparent huge
pages, or set to `never`, keeps 4 KiB pages, and the weights' bytes are the same.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

# linux/mman.h; mmap.MADV_HUGEPAGE where Python defines it.
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)


def advise_large_pages(address: int, size: int) -> bool:
    """Ask for large pages on the whole pages of [address, address + size); whether the
    kernel took the advice (False off Linux or when it refused)."""
    if not sys.platform.startswith("linux"):
        return False
    page = mmap.PAGESIZE
    lo = -(-address // page) * page
    hi = (address + size) // page * page
    if hi <= lo:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return int(libc.madvise(lo, hi - lo, _MADV_HUGEPAGE)) == 0


__all__ = ["advise_large_pages"]
