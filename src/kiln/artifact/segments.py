"""Segments: read-only bytes made of pieces that are never joined unless asked.

A large model's weight blob is the importer's arrays plus the arrays the
compiler packed (kiln.codegen.constants). Joining them into one buffer would
hold a second full copy of the weights; an artifact's content can instead be
a `Segments`, which every writer (the library, the .tar archive, the compile
cache) streams piece by piece. `bytes(segments)` still joins them, for the
few readers that need one buffer (the JIT, MLF, inspection).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeAlias, overload

import numpy as np


class Segments:
    """Read-only bytes given as an ordered list of byte pieces (views are kept, not copied)."""

    __slots__ = ("_parts", "_size")

    def __init__(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        views = []
        for part in parts:
            view = memoryview(part)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            if len(view):
                views.append(view.toreadonly())
        self._parts: tuple[memoryview, ...] = tuple(views)
        self._size = sum(len(v) for v in views)

    def parts(self) -> Iterator[memoryview]:
        """The pieces in order (read-only byte views)."""
        return iter(self._parts)

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __bytes__(self) -> bytes:
        return b"".join(self._parts)

    def __iter__(self) -> Iterator[int]:
        """The byte values, like iterating bytes."""
        for part in self._parts:
            yield from part

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> bytes: ...

    def __getitem__(self, index: int | slice) -> int | bytes:
        """A byte value, or a slice as bytes (only the pieces it covers are copied)."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self._size)
            if step != 1:
                return bytes(self)[index]
            out, pos = [], 0
            for part in self._parts:
                end = pos + len(part)
                if end > start and pos < stop:
                    out.append(part[max(start - pos, 0):min(stop, end) - pos])
                pos = end
            return b"".join(out)
        i = index + self._size if index < 0 else index
        if not 0 <= i < self._size:
            raise IndexError("Segments index out of range")
        for part in self._parts:
            if i < len(part):
                return int(part[i])
            i -= len(part)
        raise AssertionError("unreachable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Segments):
            other_parts: Iterable[Any] = other.parts()
        elif isinstance(other, (bytes, bytearray, memoryview)):
            other_parts = (other,)
        else:
            return NotImplemented
        return len(self) == _length(other) and _same_bytes(self.parts(), other_parts)

    __hash__ = None  # type: ignore[assignment]  # compared by value, like a memoryview

    def __repr__(self) -> str:
        return f"Segments(<{self._size} bytes in {len(self._parts)} pieces>)"


Content: TypeAlias = bytes | memoryview | Segments


def _length(data: Any) -> int:
    return memoryview(data).nbytes if not isinstance(data, Segments) else len(data)


def _flat(parts: Iterable[Any]) -> Iterator[memoryview]:
    for part in parts:
        view = memoryview(part)
        yield view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")


def _same_bytes(a: Iterable[Any], b: Iterable[Any]) -> bool:
    """Whether two piece sequences of equal total length hold the same bytes."""
    right = _flat(b)
    y = memoryview(b"")
    for x in _flat(a):
        while len(x):
            while not len(y):
                y = next(right)
            n = min(len(x), len(y))
            if x[:n] != y[:n]:
                return False
            x, y = x[n:], y[n:]
    return True


def content_parts(content: Content) -> Iterator[bytes | memoryview]:
    """An artifact's content as pieces to write one after another (one piece unless Segments)."""
    if isinstance(content, Segments):
        yield from content.parts()
    else:
        yield content


def write_content(f: IO[bytes], content: Content) -> None:
    """Write `content` to the binary file `f`, piece by piece (nothing joined)."""
    for part in content_parts(content):
        f.write(part)


def write_content_in_blocks(f: IO[bytes], content: Content, block: int) -> None:
    """`write_content`, but every write() call (the first and last aside) covers whole
    `block`-aligned windows of the file, `block` a power of two.

    A filesystem with large folios (ext4, xfs) caches a buffered write in folios no larger
    than the aligned window the call covers: writing the weights this way leaves them in
    the page cache as `block`-sized folios, which a mapping aligned the same can map with
    large-page entries. Pieces smaller than a window are gathered into one (a copy of at
    most `block` bytes at a time); whole windows are written from the content's memory.
    A short write (an unbuffered file) is continued.
    """
    pos = f.tell()
    pending = bytearray()
    for view in _flat(content_parts(content)):
        while len(view):
            if not pending and pos % block == 0 and len(view) >= block:
                whole = len(view) // block * block
                _write_all(f, view[:whole])
                pos, view = pos + whole, view[whole:]
                continue
            take = min(block - (pos + len(pending)) % block, len(view))
            pending += view[:take]
            view = view[take:]
            if (pos + len(pending)) % block == 0:
                _write_all(f, pending)
                pos += len(pending)
                pending.clear()
    if pending:
        _write_all(f, pending)


def _write_all(f: IO[bytes], data: bytearray | memoryview) -> None:
    view = memoryview(data)  # gone on return: `data` may be resized again
    while len(view):
        view = view[f.write(view):]


__all__ = ["Content", "Segments", "content_parts", "write_content", "write_content_in_blocks"]


def aligned_buffer(size: int, align: int) -> memoryview:
    """`size` writable bytes starting at a multiple of `align` in memory (a constants
    blob read from a file, which a library linked in this process reads in place:
    kiln.runtime.jit_constants); the view keeps its memory alive."""
    raw = np.empty(size + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + size].data.cast("B")
