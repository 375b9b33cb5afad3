"""The external weights file (kiln.artifact.weights_file, docs/format.md "The weights
file"): the golden file of each version reads back as written out here by hand."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from kiln.artifact import weights_file
from kiln.artifact.integrity import chunk_digests, tree_digest
from kiln.artifact.segments import Segments
from kiln.errors import FormatError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "weights_v1_2026-11-27.weights"
TENSORS = {"constants.bin": bytes(range(256)) * 20, "extra.bin": b"\x01" * 100}


def test_the_version_1_golden_file_reads_back():
    data = GOLDEN.read_bytes()
    magic, version, count, size, index_at, index_size, digest = \
        weights_file.PREAMBLE.unpack_from(data)
    assert (magic, version, count, size, index_at) == (b"KILNWTS\0", 1, 2, 131172, 72 + 32)
    table, index = data[72:index_at], data[index_at:index_at + index_size]
    assert struct.unpack("<4Q", table) == (65536, 5120, 131072, 100)
    assert digest == hashlib.sha256(b"kiln.weights/1\n" + table + index).digest()
    fd = os.open(GOLDEN, os.O_RDONLY)
    try:
        header = weights_file.read_header(fd, str(GOLDEN))
    finally:
        os.close(fd)
    assert header.content_hash == digest.hex() and header.file_size == len(data)
    for t in header.tensors:
        content = TENSORS[t.name]
        assert data[t.offset:t.offset + t.size] == content
        assert t.chunk_size == 4096 and t.digests == chunk_digests(content, 4096)
        assert t.sha256 == tree_digest(t.digests, t.size, 4096)


def test_a_newer_version_names_both(tmp_path):
    data = bytearray(GOLDEN.read_bytes())
    data[8:12] = struct.pack("<I", 2)
    path = tmp_path / "w.weights"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="version 2; this kiln reads version 1"):
            weights_file.read_header(fd, str(path))
    finally:
        os.close(fd)


def test_a_tensor_of_2_mib_or_more_starts_at_a_2_mib_multiple(tmp_path):
    """Large tensors sit at multiples of HUGE_ALIGN (so a 2 MiB folio maps with one
    page-table entry), small ones at multiples of ALIGN; pieces of any size are
    written in HUGE_ALIGN blocks and read back unchanged."""
    huge = weights_file.HUGE_ALIGN
    pieces = [bytes([i % 251]) * n for i, n in enumerate((7, huge - 3, 2 * huge + 5, 100))]
    big = Segments(pieces)
    small = b"\x02" * 5000
    items = [("a.bin", small, 4096, chunk_digests(small, 4096)),
             ("b.bin", big, 1 << 16, chunk_digests(big, 1 << 16))]
    header = weights_file.write_weights(tmp_path / "w.weights", items)
    a, b = header.tensors
    assert a.offset % weights_file.ALIGN == 0 and a.offset < huge
    assert b.offset % huge == 0
    data = (tmp_path / "w.weights").read_bytes()
    assert data[a.offset:a.offset + a.size] == small
    assert data[b.offset:b.offset + b.size] == b"".join(pieces)
    fd = os.open(tmp_path / "w.weights", os.O_RDONLY)
    try:
        assert weights_file.read_header(fd, "w").tensors == header.tensors
    finally:
        os.close(fd)
