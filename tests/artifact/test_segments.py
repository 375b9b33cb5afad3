"""Segments: artifact content made of pieces, equal to and written like the joined bytes."""

from __future__ import annotations

import hashlib
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from kiln.artifact import Artifact, ArtifactSet, archive, integrity
from kiln.artifact.integrity import chunk_digests, lane64_digests, stream_digests
from kiln.artifact.segments import Segments, write_content_in_blocks

RNG = np.random.default_rng(7)
DATA = RNG.integers(0, 256, 10_000, dtype=np.uint8).tobytes()


def _split(data: bytes, cuts: list[int]) -> Segments:
    edges = [0, *cuts, len(data)]
    return Segments(memoryview(data)[a:b] for a, b in pairwise(edges))


@pytest.mark.parametrize("cuts", [[], [1], [4096, 4097, 9000], [0, 5000, 5000, 10_000]])
def test_segments_equal_the_joined_bytes(cuts: list[int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seg = _split(DATA, cuts)
    assert len(seg) == len(DATA) and bytes(seg) == DATA
    assert seg == DATA and seg == _split(DATA, [3, 7000])
    assert list(seg) == list(DATA) and seg[-1] == DATA[-1] and seg[4095] == DATA[4095]
    for part in (slice(None), slice(4000, 4200), slice(-5, None), slice(10, 3), slice(1, 99, 7)):
        assert seg[part] == DATA[part]
    changed = bytearray(DATA)
    changed[-1] ^= 1
    assert seg != bytes(changed) and seg != DATA[:-1]
    # Hashed chunk by chunk from the pieces, on threads as large data is.
    monkeypatch.setattr(integrity, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(integrity, "_PARALLEL_BATCH", 2)
    by_chunk = [DATA[i:i + 4096] for i in range(0, len(DATA), 4096)]
    assert chunk_digests(seg, 4096) == b"".join(hashlib.sha256(c).digest() for c in by_chunk)
    assert chunk_digests(seg, 4096) == chunk_digests(DATA, 4096) == stream_digests(
        seg.parts(), 4096)
    assert lane64_digests(seg, 4096) == b"".join(
        integrity.lane64(c).to_bytes(8, "little") for c in by_chunk)
    art = Artifact("c", "native", "w.bin", seg, {"symbol": "w"})
    assert art.size == len(DATA)
    assert art.sha256() == hashlib.sha256(DATA).hexdigest()


def test_pieces_are_views_not_copies() -> None:
    array = np.arange(16, dtype=np.float32)
    seg = Segments([array.data, b"\0" * 3])
    (first, pad) = seg.parts()
    assert first.readonly and np.shares_memory(np.frombuffer(first, np.uint8), array)
    assert bytes(pad) == b"\0" * 3
    array[0] = 5.0  # a view: the content follows the array (the pool keeps its arrays)
    assert bytes(seg)[:4] == np.float32(5.0).tobytes()


def test_a_segmented_artifact_round_trips_through_the_archive(tmp_path: Path) -> None:
    seg = _split(DATA, [10, 4096, 8000])
    arts = ArtifactSet([Artifact("c", "none", "w.bin", seg)])
    path = tmp_path / "m.tar"
    archive.write_tar(path, arts, {})
    back, _ = archive.read_tar(path)
    assert back.get("c", "w.bin").content == DATA


class _Recorder:
    """A binary file that records where each write() call starts and how long it is."""

    def __init__(self, start: int) -> None:
        self.pos, self.data, self.calls = start, bytearray(), []

    def tell(self) -> int:
        return self.pos

    def write(self, part: bytes | memoryview) -> int:
        self.calls.append((self.pos, len(part)))
        self.data += part
        self.pos += len(part)
        return len(part)


@pytest.mark.parametrize("start,cuts", [(0, []), (100, [1, 2, 3000, 3001]),
                                        (1024, [5000]), (999, [1024, 2048, 9999])])
def test_writes_in_blocks_cover_whole_aligned_windows(start: int, cuts: list[int]) -> None:
    """Every write but the first and last spans whole 1 KiB-aligned windows, whatever the
    pieces: the page cache then holds the data in window-sized folios."""
    f = _Recorder(start)
    write_content_in_blocks(f, _split(DATA, cuts), 1024)  # type: ignore[arg-type]
    assert bytes(f.data) == DATA
    ends = [pos + n for pos, n in f.calls]
    assert all(pos % 1024 == 0 for pos, _n in f.calls[1:])
    assert all(end % 1024 == 0 for end in ends[:-1])
