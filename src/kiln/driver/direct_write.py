"""Writing a large file past the page cache (`O_DIRECT`), where the file system allows it.

A buffered write of a model's weights fills as many fresh page-cache pages as it writes,
and on a host whose free memory is fragmented the kernel's allocation of those pages
(large folios, compaction) costs more CPU time than the copy: 570 MiB took 1.35 CPU s
into fresh pages, 0.08 s past them (docs/performance.md, "Compile time, round
fifteen"). The compile cache's objects are read back by a later build at most, so they
go to the disk straight from a small aligned buffer instead (`O_DIRECT` needs the
buffer, the file offset and the length aligned to the device's blocks): the copy into
the buffer is all the CPU they cost, and the page cache keeps the pages a build maps
(its library's).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Iterable
from typing import Any

#: Bytes gathered into the aligned buffer per write.
BUFFER = 4 << 20
#: What a direct write's offset and length are multiples of: a page, which covers the
#: logical block size of the devices Linux runs on. The file's last bytes past a whole
#: multiple are written through the page cache.
ALIGN = 4096


def write_direct(fd: int, parts: Iterable[Any]) -> None:
    """Write `parts` (bytes-like objects, one after another) to `fd`, an empty file opened
    for writing at offset 0, past the page cache where its file system takes `O_DIRECT`
    (else, or from the first refused write on, through it as `os.write` does).
    OSError as a buffered write raises it."""
    direct = _set_direct(fd, True)
    buf = mmap.mmap(-1, BUFFER)  # page-aligned, as O_DIRECT wants
    try:
        with memoryview(buf) as window:
            fill = 0
            for part in parts:
                view = memoryview(part)
                view = view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")
                while len(view):
                    take = min(BUFFER - fill, len(view))
                    window[fill:fill + take] = view[:take]
                    fill, view = fill + take, view[take:]
                    if fill == BUFFER:
                        direct = _flush(fd, window[:fill], direct)
                        fill = 0
            whole = fill // ALIGN * ALIGN
            if whole:
                direct = _flush(fd, window[:whole], direct)
            if direct:
                _set_direct(fd, False)
            _write_all(fd, window[whole:fill])
    finally:
        buf.close()


def _flush(fd: int, data: memoryview, direct: bool) -> bool:
    """Write `data` (whole ALIGN blocks) directly if `direct`; whether the next write may
    be direct too (False once the file system refused one: the rest goes buffered)."""
    if direct:
        try:
            done = os.write(fd, data)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            done = 0  # alignment the device refuses: write it buffered
        if done == len(data):
            return True
        _set_direct(fd, False)
        data = data[done:]
    _write_all(fd, data)
    return False


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data):]


def _set_direct(fd: int, on: bool) -> bool:
    """Turn `O_DIRECT` on or off for `fd`; whether it is on now (never where the system or
    the file system has no such mode)."""
    flag = getattr(os, "O_DIRECT", 0)  # Linux and the BSDs
    if not flag:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)
