"""Handing back the pages of gathered constants once the weight check has read them.

The constants artifact of a library lists, as `"gathered"`, the `[offset, bytes]` of
each constant its kernels read only at places that data picks (an embedding table:
docs/format.md "Gathered constants"). The weight
check (kiln.runtime.weights.WeightCheck) reads every page of the weights, which then
stay resident; for a gathered constant most never would be (the rows no token picks).
So once a chunk is hashed, the whole pages of gathered constants inside it are handed
back (`hand_back`), on the library's read-only file mapping, which no one writes:

- `MADV_NOHUGEPAGE`: the load asked for large pages on the whole blob
  (kiln.runtime.page_advice); left so, a row's fault would read the file back in a
  large-page folio and map it whole, 2 MiB a row;
- `MADV_PAGEOUT`: the pages leave the page cache too, where no other process maps
  them (Linux skips shared ones, and files the caller may not write). Otherwise a
  row's fault maps the whole large folio the page cache holds it in (2 MiB measured on
  Linux 6.18, which maps a file's large folios whole): a few hundred tokens mapped
  nearly every page of the table again. Read back from the file, a row comes in with
  the kernel's fault-around (16 pages by default);
- `MADV_DONTNEED`: what is still mapped leaves the resident set.

Not `MADV_RANDOM` (no readahead: one page read a fault): reading the whole table then (a
swap's private copies) took 4.5 s instead of 0.1 s. Each is skipped where the system
lacks it. Streamed weights keep the page tables the check filled: refaulting those
made a 1.1B model's decode a third slower (docs/performance.md, "What a generating
process holds").
"""

from __future__ import annotations

import itertools
import mmap
import sys
from typing import Any

from kiln.errors import FormatError
from kiln.runtime.page_advice import MADVISE, advise


def gathered_ranges(value: Any, size: int, what: str) -> list[tuple[int, int]]:
    """The `"gathered"` metadata `value` of a data artifact of `size` bytes as sorted
    (offset, bytes) pairs; FormatError naming `what` if malformed, overlapping or out
    of the artifact."""
    ok = isinstance(value, list) and all(
        isinstance(e, list) and len(e) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in e)
        and e[0] >= 0 and e[1] > 0 and e[0] + e[1] <= size for e in value)
    pairs = sorted((e[0], e[1]) for e in value) if ok else []
    if not ok or any(a[0] + a[1] > b[0] for a, b in itertools.pairwise(pairs)):
        raise FormatError(f"{what}: its 'gathered' metadata is malformed, overlapping or "
                          f"out of its {size} bytes (damaged file)")
    return pairs


def drop_within(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    """`hand_back` the whole pages of `ranges` (absolute addresses, bytes) that lie
    within [start, end)."""
    for address, length in ranges:
        lo, hi = max(address, start), min(address + length, end)
        if hi > lo:
            hand_back(lo, hi - lo)


def hand_back(address: int, length: int) -> None:
    """Out of the page cache and out of the resident set: the whole pages within
    [address, address + length) of a read-only file mapping no one has written (the
    module's docstring; nothing on a system without madvise)."""
    for advice in _HAND_BACK:
        advise(address, length, advice)


def drop_pages(address: int, length: int) -> None:
    """`madvise(MADV_DONTNEED)` on the whole pages within [address, address + length)
    of a read-only file mapping no one has written: they leave the resident set, and a
    later read maps them again from the file (nothing on a system without it)."""
    if _HAND_BACK:
        advise(address, length, mmap.MADV_DONTNEED)


# MADV_PAGEOUT is 21 in linux/mman.h (Linux 5.4: EINVAL before), where the mmap module
# does not name it; other systems get DONTNEED only.
_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21 if sys.platform.startswith("linux") else None)
_HAND_BACK = tuple(a for a in (getattr(mmap, "MADV_NOHUGEPAGE", None), _PAGEOUT,
                                getattr(mmap, "MADV_DONTNEED", None))
                   if a is not None) if MADVISE is not None else ()

__all__ = ["drop_pages", "drop_within", "gathered_ranges", "hand_back"]
