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
