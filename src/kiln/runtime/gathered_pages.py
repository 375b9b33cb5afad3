"""Handing back the pages of gathered constants once the weight check has read them.

The constants artifact of a library lists, as `"gathered"`, the `[offset, bytes]` of
each constant its kernels read only at places that data picks (an embedding table:
docs/format.md "Gathered constants"). The weight check (kiln.runtime.weights.WeightCheck)
reads every page of the weights, which then stay resident; for a gathered constant most
never would be (the rows no token picks). So once a chunk is hashed, the whole pages of
gathered constants inside it are handed back (`GatheredPages.hand_back`), on the
library's read-only file mapping, which no one writes:

- the file's dirty pages of the range are written back first (`sync_file_range`, waiting
  for the writes): a library just exported or copied in is still dirty in the page
  cache, or being written, and reclaim skips such pages, so they stayed cached and a
  row's fault mapped them again (a library exported in the same boot kept 22,000 of
  the 0.49B builder model's 32,000 table pages, docs/performance.md "What a generating
  process holds"). A clean file costs a look-up;
- `MADV_PAGEOUT`: the pages leave the page cache too, where no other process maps
  them (Linux skips shared ones, and files the caller may not write). Otherwise a
  row's fault maps the whole large folio the page cache holds it in (2 MiB measured on
  Linux 6.18, which maps a file's large folios whole): a few hundred tokens mapped
  nearly every page of the table again. Read back from the file, a row comes in with
  the kernel's fault-around (16 pages by default);
- `MADV_DONTNEED`: what is still mapped leaves the resident set.

The load never asks for large pages on these ranges (kiln.runtime.page_advice
`advise_streamed`). Not `MADV_RANDOM` (no readahead: one page read a fault): reading
the whole table then (a swap's private copies) took 4.5 s instead of 0.1 s. Each step
is skipped where the system lacks it. Streamed weights keep the page tables the check
filled: refaulting those made a 1.1B model's decode a third slower (docs/performance.md,
"What a generating process holds").
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
from typing import TYPE_CHECKING, Any

from kiln.errors import FormatError
from kiln.runtime.page_advice import (
    MADVISE,
    SYNC_FILE_RANGE,
    SYNC_WAIT_WRITE_WAIT,
    advise,
    file_identity,
    opened_file,
)

if TYPE_CHECKING:
    from kiln.artifact.blob import BlobContents

Ranges = list[tuple[int, int]]  # (address or offset, bytes), sorted, not overlapping


def gathered_ranges(value: Any, size: int, what: str) -> Ranges:
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


def gathered_in_blob(contents: BlobContents, address: int, symbol_size: int,
                     where: str) -> Ranges:
    """Where the gathered constants of a blob's linked data are mapped, the blob symbol
    (of `symbol_size` bytes) being at `address`: sorted (address, bytes) pairs.
    Linked data running past the symbol is left out (the weight check refuses it)."""
    items = list(contents.artifacts)
    out = []
    for d in contents.linked:
        a = items[d.artifact]
        if "gathered" in a.metadata and d.offset + d.length <= symbol_size:
            what = f"{where}: linked data {a.codegen_id}/{a.file_name}"
            out += [(address + d.offset + off, n)
                    for off, n in gathered_ranges(a.metadata["gathered"], d.length, what)]
    return sorted(out)


class GatheredPages:
    """The gathered constants of a loaded library (`ranges`, absolute addresses), mapped
    from the file at `path`, the byte at address A being the file's byte A - `delta`
    (None: not known, and the file is not written back)."""

    def __init__(self, ranges: Ranges, path: str, delta: int | None) -> None:
        self.ranges = ranges
        self.path = os.path.abspath(path)  # the check may run after a chdir
        self.delta = delta
        self._identity = file_identity(self.path) if ranges and delta is not None else None

    def hand_back(self, start: int, end: int) -> None:
        """Out of the page cache and out of the resident set: the whole pages of the
        gathered constants within [start, end) (the module's docstring; nothing on a
        system without madvise). No kernel may have run on them yet."""
        for address, length in self.ranges:
            lo, hi = max(address, start), min(address + length, end)
            if hi > lo and _HAND_BACK:
                self._write_back(lo, hi - lo)
                for advice in _HAND_BACK:
                    advise(lo, hi - lo, advice)

    def _write_back(self, address: int, length: int) -> None:
        """Write the file's dirty pages of [address, address + length) and wait for them,
        if the path still names the file mapped at load (otherwise nothing)."""
        if SYNC_FILE_RANGE is None or self._identity is None or self.delta is None:
            return
        with opened_file(self.path, self._identity) as fd:
            if fd is not None:
                SYNC_FILE_RANGE(fd, address - self.delta, length, SYNC_WAIT_WRITE_WAIT)


def drop_pages(address: int, length: int) -> None:
    """`madvise(MADV_DONTNEED)` on the whole pages within [address, address + length)
    of a read-only file mapping no one has written: they leave the resident set, and a
    later read maps them again from the file (nothing on a system without it)."""
    if _HAND_BACK:
        advise(address, length, mmap.MADV_DONTNEED)


# MADV_PAGEOUT is 21 in linux/mman.h (Linux 5.4: EINVAL before), where the mmap module
# does not name it; other systems get DONTNEED only.
_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21 if sys.platform.startswith("linux") else None)
_HAND_BACK = tuple(a for a in (_PAGEOUT, getattr(mmap, "MADV_DONTNEED", None))
                   if a is not None) if MADVISE is not None else ()

__all__ = ["GatheredPages", "Ranges", "drop_pages", "gathered_in_blob", "gathered_ranges"]
