"""Chunked SHA-256 of large data (the weights): one hash pass, checked in pieces.

Weights are hashed once, when the constant pool is built, in fixed-size chunks
(`CHUNK_SIZE`, 4 MiB). The list of chunk digests is reused everywhere:

- the compile-cache key and the cache's content address (`tree_digest`),
- the library blob's LINKED_DATA section (docs/format.md), which the runtime
  checks the mapped weights against (`verify`),
- the cache's check of a stored weights file before it is used.

Chunks let the check run on several threads (hashlib releases the GIL) and
name the damaged byte range. Nothing here imports the compiler.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

import numpy as np

from kiln.artifact.segments import Segments
from kiln.errors import FormatError

BytesLike = bytes | bytearray | memoryview

CHUNK_SIZE = 1 << 22
DIGEST_SIZE = 32
MIN_CHUNK_SIZE = 1 << 12
MAX_CHUNK_SIZE = 1 << 30
# Below this, threads cost more than they save.
_PARALLEL_MIN = 4 * CHUNK_SIZE
# Chunks handed to the threads at once.
_PARALLEL_BATCH = 32


def chunk_count(length: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Number of chunks of `length` bytes (the last one may be short)."""
    return -(-length // chunk_size)


def _view(data: BytesLike) -> memoryview:
    view = memoryview(data)
    return view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")


def chunk_digests(data: BytesLike | Segments, chunk_size: int = CHUNK_SIZE, *,
                  threads: int | None = None) -> bytes:
    """The concatenated SHA-256 digests of each `chunk_size` piece of `data` (up to
    `threads` threads, default one per CPU up to 4, hash the chunks of a large one;
    Segments are hashed from their pieces)."""
    if isinstance(data, Segments):
        return _digest_chunks(_chunk_pieces(data.parts(), chunk_size), len(data), threads)
    view = _view(data)
    return _digest_chunks([(view[i:i + chunk_size],) for i in range(0, len(view), chunk_size)],
                          len(view), threads)


def _chunk_pieces(parts: Iterable[BytesLike], chunk_size: int) -> Iterator[list[memoryview]]:
    """The views of `parts` that make up each `chunk_size` chunk of their concatenation."""
    chunk: list[memoryview] = []
    room = chunk_size
    for part in parts:
        piece = _view(part)
        while len(piece):
            chunk.append(piece[:room])
            taken = len(chunk[-1])
            room -= taken
            piece = piece[taken:]
            if not room:
                yield chunk
                chunk, room = [], chunk_size
    if chunk:
        yield chunk


def _digest_chunks(chunks: Iterable[Sequence[memoryview]], length: int,
                   threads: int | None = None) -> bytes:
    """The digests of `chunks` (each a sequence of views hashed as one), on up to `threads`
    threads when the `length` bytes are many (hashlib releases the GIL). The chunks are
    taken a batch at a time: a part that the pieces' producer copies (a strided array made
    contiguous) is held only while its batch is hashed."""

    workers = min(4, os.cpu_count() or 1) if threads is None else threads
    if length < _PARALLEL_MIN or workers < 2:
        return b"".join(map(_sha256_of, chunks))
    out: list[bytes] = []
    pending = iter(chunks)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while batch := list(islice(pending, _PARALLEL_BATCH)):
            out.extend(pool.map(_sha256_of, batch))
    return b"".join(out)


def _sha256_of(pieces: Sequence[memoryview]) -> bytes:
    """The SHA-256 digest of `pieces` one after another."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h.digest()


def stream_digests(parts: Iterable[BytesLike], chunk_size: int = CHUNK_SIZE) -> bytes:
    """`chunk_digests` of the concatenation of `parts`, without building it (one thread,
    one chunk's pieces held at a time)."""
    return b"".join(map(_sha256_of, _chunk_pieces(parts, chunk_size)))


def tree_digest(digests: bytes, length: int, chunk_size: int = CHUNK_SIZE) -> str:
    """Hex SHA-256 naming data by its chunk digests (a content address)."""
    h = hashlib.sha256(f"kiln.chunked-sha256/{chunk_size}/{length}\n".encode())
    h.update(digests)
    return h.hexdigest()


def verify(data: BytesLike, digests: bytes, chunk_size: int, what: str) -> None:
    """FormatError naming `what` and the first damaged byte range unless `data` matches."""
    view = _view(data)
    if len(digests) != chunk_count(len(view), chunk_size) * DIGEST_SIZE:
        raise FormatError(f"{what}: {len(view)} bytes need "
                          f"{chunk_count(len(view), chunk_size)} chunk digests, the record has "
                          f"{len(digests) // DIGEST_SIZE}")
    actual = chunk_digests(view, chunk_size)
    if actual == digests:
        return
    for i in range(0, len(actual), DIGEST_SIZE):
        if actual[i:i + DIGEST_SIZE] != digests[i:i + DIGEST_SIZE]:
            start = i // DIGEST_SIZE * chunk_size
            end = min(start + chunk_size, len(view))
            raise FormatError(f"{what}: SHA-256 mismatch in bytes [{start}, {end}) of "
                              f"{len(view)} (the data is damaged)")
    raise AssertionError("unreachable")


# The check hash (kiln_hash64.c, docs/format.md "The weights check record"): 8 bytes
# per chunk, a bijective mix of each 64-bit lane summed, so it runs at memory
# bandwidth in C. It finds damage; SHA-256 above stays the content hash.
LANE64 = "kiln.lane64/1"
LANE64_SIZE = 8
_LANE_KEY = 0x9E3779B97F4A7C15
_MIX_C1 = 0xFF51AFD7ED558CCD
_MIX_C2 = 0xC4CEB9FE1A85EC53
_MASK = (1 << 64) - 1
_LANES_PER_STEP = 1 << 15  # numpy works on 256 KiB at a time (in the L2 cache)


def _mix_int(z: int) -> int:
    z ^= z >> 33
    z = z * _MIX_C1 & _MASK
    z ^= z >> 33
    z = z * _MIX_C2 & _MASK
    return z ^ (z >> 33)


def _mix_lanes(z: np.ndarray, tmp: np.ndarray) -> None:
    """MurmurHash3's finaliser of every lane of `z`, in place (uint64 wraps around)."""
    for c in (np.uint64(_MIX_C1), np.uint64(_MIX_C2), None):
        np.right_shift(z, np.uint64(33), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        if c is not None:
            np.multiply(z, c, out=z)


def lane64(data: BytesLike) -> int:
    """kiln.lane64 of `data` (kiln_hash64.c's `{prefix}_hash64`), in numpy: each
    little-endian 64-bit lane x_i (the last zero-padded) xor (i + 1) * K, mixed,
    summed mod 2^64; the sum xor the length, mixed."""
    view = _view(data)
    n = len(view)
    padded = view if n % 8 == 0 else memoryview(bytes(view) + bytes(8 - n % 8))
    lanes = np.frombuffer(padded, dtype="<u8")
    step = min(_LANES_PER_STEP, max(len(lanes), 1))
    keys = np.arange(1, step + 1, dtype=np.uint64) * np.uint64(_LANE_KEY)
    z = np.empty(step, np.uint64)
    tmp = np.empty(step, np.uint64)
    total = 0
    for start in range(0, len(lanes), step):
        piece = lanes[start:start + step]
        k = len(piece)
        np.add(keys[:k], np.uint64(start * _LANE_KEY & _MASK), out=z[:k])
        np.bitwise_xor(z[:k], piece, out=z[:k])
        _mix_lanes(z[:k], tmp[:k])
        total += int(z[:k].sum(dtype=np.uint64))
    return _mix_int((total & _MASK) ^ n)


def _chunks(data: BytesLike | Segments, chunk_size: int) -> Iterator[BytesLike]:
    """The `chunk_size` pieces of `data` as views of its memory; only a chunk that spans
    two of a Segments' parts is joined (a copy of one chunk, never of a whole part: the
    pieces are all taken at once by the thread pool, and a part may be gigabytes)."""
    parts = data.parts() if isinstance(data, Segments) else (data,)
    for pieces in _chunk_pieces(parts, chunk_size):
        yield pieces[0] if len(pieces) == 1 else b"".join(pieces)


def lane64_digests(data: BytesLike | Segments, chunk_size: int = CHUNK_SIZE) -> bytes:
    """The kiln.lane64 of each `chunk_size` piece of `data`, 8 little-endian bytes each
    (on several threads for large data: numpy's loops release the GIL)."""
    def one(chunk: BytesLike) -> bytes:
        return lane64(chunk).to_bytes(LANE64_SIZE, "little")

    if len(data) < _PARALLEL_MIN or (os.cpu_count() or 1) < 2:
        return b"".join(map(one, _chunks(data, chunk_size)))
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return b"".join(pool.map(one, _chunks(data, chunk_size)))


__all__ = ["CHUNK_SIZE", "DIGEST_SIZE", "LANE64", "LANE64_SIZE", "chunk_count", "chunk_digests",
           "lane64", "lane64_digests", "stream_digests", "tree_digest", "verify"]
