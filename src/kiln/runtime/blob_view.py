"""The library blob through a read-only mapping of its own, dropped after reading.

`load_module` checks the whole blob's SHA-256 (kiln.artifact.blob.unpack), which
makes every page of it resident: for a large model the blob is megabytes of
generated C and bitcode kept only for inspection. Reading it through the
dlopen'ed library would keep those pages in the process's resident set for its
whole life. Here the blob's byte range of the file is mapped privately and
read-only instead; once it is unpacked, `drop` hands its pages back
(`madvise(MADV_DONTNEED)`: for a read-only file mapping the kernel reads a page
back from the file if it is used again). The library's own mapping, where the
kernels read the weights that follow the blob, is never touched.

The inspection artifacts unpacked from it are views of this mapping, not copies
(`unpack(..., copy=False)`): `inspect_source` reads them from the file on demand.
A view keeps the mapping alive, so they stay valid after the library is closed.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from kiln.errors import FormatError


class BlobView:
    """A read-only mapping of bytes [offset, offset + length) of the file at `path`."""

    def __init__(self, path: Path, offset: int, length: int) -> None:
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset + length > size:  # a mapping past the end would fault on reading
                raise FormatError(f"the blob [{offset}, {offset + length}) runs past the end "
                                  f"of the file ({size} bytes; truncated?)")
            self._map = mmap.mmap(f.fileno(), offset + length - start,
                                  access=mmap.ACCESS_READ, offset=start)
        self.view = memoryview(self._map)[offset - start:offset - start + length]

    def drop(self) -> None:
        """Hand the mapping's resident pages back (they are read again when used)."""
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)


__all__ = ["BlobView"]
