"""Filling a file's range through a shared mapping on threads (kiln.runtime.mapped_fill):
the bytes a plain write would leave, and nothing written where the range cannot be reserved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kiln.artifact.segments import Segments
from kiln.runtime import mapped_fill

BLOCK = 64 << 10


def _items(rng: np.random.Generator) -> list[tuple[int, bytes | Segments]]:
    """Two pieces of data at unaligned offsets, one of them in parts, spanning windows."""
    a = rng.integers(0, 256, 5 * BLOCK + 123, dtype=np.uint8)
    b = [rng.integers(0, 256, n, dtype=np.uint8) for n in (7, BLOCK, 3 * BLOCK + 9)]
    return [(4096 + 17, a.tobytes()), (4096 + 17 + a.size + 64, Segments(b))]


def test_threads_write_what_a_plain_write_does(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapped_fill, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(mapped_fill, "_threads", lambda: 3)
    items = _items(np.random.default_rng(0))
    size = 12 * BLOCK
    expected = bytearray(b"\xaa" * size)
    for at, content in items:
        data = bytes(content)
        expected[at:at + len(data)] = data
    path = tmp_path / "lib"
    path.write_bytes(b"\xaa" * size)
    with open(path, "r+b") as f:
        assert mapped_fill.fill_mapped(f.fileno(), items, BLOCK)
    assert path.read_bytes() == bytes(expected)


def test_refused_range_is_left_to_the_caller(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No reservation (a filesystem without fallocate, a full disk), or a file that does
    not span the data: False, and the file as it was."""
    items = _items(np.random.default_rng(1))
    path = tmp_path / "lib"
    path.write_bytes(bytes(12 * BLOCK))
    with open(path, "r+b") as f:
        monkeypatch.setattr(mapped_fill, "_reserve", lambda fd, start, length: False)
        assert not mapped_fill.fill_mapped(f.fileno(), items, BLOCK)
        monkeypatch.undo()
        f.truncate(6 * BLOCK)
        assert not mapped_fill.fill_mapped(f.fileno(), items, BLOCK)
    assert path.read_bytes() == bytes(6 * BLOCK)


def test_empty_contents_write_nothing(tmp_path: Path) -> None:
    """A model's empty tensors (zero-size initializers) leave nothing to map: done, the
    file as it was (an empty range once raised from `min()` of no pieces)."""
    path = tmp_path / "lib"
    path.write_bytes(b"\x11" * BLOCK)
    with open(path, "r+b") as f:
        assert mapped_fill.fill_mapped(f.fileno(), [(64, b""), (128, Segments([]))], BLOCK)
    assert path.read_bytes() == b"\x11" * BLOCK
