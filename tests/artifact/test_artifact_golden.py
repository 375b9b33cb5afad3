"""Dated golden files: kiln must keep reading every format version it ever wrote.

The files in tests/golden were written once by tests/golden/make_golden.py and
are never regenerated. The expected contents below are written out by hand,
not produced by the code under test.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from kiln.artifact import Artifact, ArtifactSet, blob, load_with_metadata
from kiln.artifact.blob import ModuleNode

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
BLOB_V1 = GOLDEN / "blob_v1_2026-11-21.bin"
BLOB_V2 = GOLDEN / "blob_v2_2026-11-22.bin"
BLOB_V3 = GOLDEN / "blob_v3_2026-11-22.bin"
ARCHIVE_V1 = GOLDEN / "archive_v1_2026-11-21.tar"
ARCHIVE_V2 = GOLDEN / "archive_v2_2026-11-22.tar"

EXPECTED_BLOB_ARTIFACTS = [
    ("host", "native", "host.c", b"int kiln__x = 1;\n", {"cflags": ["-O2"]}),
    ("llvm", "native", "kernels.o", b"", {"linked": True, "size": 1234}),
    ("llvm", "native", "constants.bin", b"",
     {"symbol": "kiln__consts", "align": 64, "count": 2, "linked": True, "size": 4096}),
    ("llvm", "none", "kernels.bc", b"BC\xc0\xde\x00\x01\x02\x03", {}),
    ("jit", "llvmjit", "kernels.bc", b"BC\xc0\xde\xff", {"opt": 3}),
    ("jit", "llvmjit", "constants.bin",
     b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f", {"align": 64}),
    ("dsp", "dsp_loader", "cmd.stream", b"\x01\x00\x00\x00RUN\x00",
     {"device": "dsp0", "ratio": 0.5, "nested": {"a": [1, None, True]}}),
]
EXPECTED_BLOB_METADATA = {
    "format": "kiln.library", "version": 1, "kiln_version": "0.1.0", "prefix": "kiln_",
    "functions": {"add_one": {"name": "add_one", "symbol": "kiln_add_one", "kind": "tensor",
                              "params": [], "results": [], "tuple_result": False}},
    "note": "golden \u00e9\u2713",
}


def test_blob_v1_golden_file_reads_back():
    data = BLOB_V1.read_bytes()
    assert len(data) == 1096
    c = blob.unpack(data)
    got = [(a.codegen_id, a.loader, a.file_name, a.content, a.metadata) for a in c.artifacts]
    assert got == EXPECTED_BLOB_ARTIFACTS
    assert c.modules == (ModuleNode("native", (0, 1, 2)), ModuleNode("none", (3,)),
                         ModuleNode("llvmjit", (4, 5)), ModuleNode("dsp_loader", (6,)))
    assert c.row_ptr == (0, 2, 2, 3, 3)
    assert c.child_indices == (1, 2, 3)
    assert c.children(0) == (1, 2) and c.children(2) == (3,)
    assert c.metadata == EXPECTED_BLOB_METADATA
    # And through the file-level entry point.
    arts, meta = load_with_metadata(BLOB_V1)
    assert arts == c.artifacts and meta == EXPECTED_BLOB_METADATA


def test_blob_v1_golden_header_by_hand():
    """The header fields where docs/format.md says they are."""
    data = BLOB_V1.read_bytes()
    assert data[:8] == b"KILNBLOB"
    assert struct.unpack_from("<IIQII", data, 8) == (1, 0, 1096, 4, 0)
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    table = [struct.unpack_from("<IIQQ", data, 32 + 24 * i) for i in range(4)]
    assert table == [(1, 0, 128, 566), (2, 0, 696, 91), (3, 0, 792, 40), (4, 0, 832, 228)]


def test_blob_v1_golden_has_no_linked_data():
    assert blob.unpack(BLOB_V1.read_bytes()).linked == ()


# Version 2 (2026-11-22): the same library plus a LINKED_DATA record for the
# 4096 zero bytes of constants.bin (artifact 2), placed 64-byte aligned after
# the 1184-byte blob, hashed as one 4096-byte chunk.
ZEROS_4096_SHA256 = bytes.fromhex(
    "ad7facb2586fc6e966c004d7d1d16b024f5805ff7cb47c7a85dabd8b48892ca7")


def test_blob_v2_golden_file_reads_back():
    data = BLOB_V2.read_bytes()
    assert len(data) == 1184
    c = blob.unpack(data)
    got = [(a.codegen_id, a.loader, a.file_name, a.content, a.metadata) for a in c.artifacts]
    assert got == EXPECTED_BLOB_ARTIFACTS
    assert c.modules == (ModuleNode("native", (0, 1, 2)), ModuleNode("none", (3,)),
                         ModuleNode("llvmjit", (4, 5)), ModuleNode("dsp_loader", (6,)))
    assert (c.row_ptr, c.child_indices) == ((0, 2, 2, 3, 3), (1, 2, 3))
    assert c.metadata == EXPECTED_BLOB_METADATA
    assert c.linked == (blob.LinkedData(2, 1216, 4096, 4096, ZEROS_4096_SHA256),)


def test_blob_v2_golden_header_by_hand():
    data = BLOB_V2.read_bytes()
    assert data[:8] == b"KILNBLOB"
    assert struct.unpack_from("<IIQII", data, 8) == (2, 0, 1184, 5, 0)
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    table = [struct.unpack_from("<IIQQ", data, 32 + 24 * i) for i in range(5)]
    assert table == [(1, 0, 152, 566), (2, 0, 720, 91), (3, 0, 816, 40), (4, 0, 856, 228),
                     (5, 0, 1088, 60)]
    # LINKED_DATA: u32 count, then u32 artifact, u32 chunk size, u64 offset, u64 length,
    # one 32-byte SHA-256 per chunk.
    assert data[1088:1148] == (struct.pack("<IIIQQ", 1, 2, 4096, 1216, 4096)
                               + ZEROS_4096_SHA256)


# Version 3 (2026-11-22): the same library, each artifact record with a target key;
# the dsp artifact is a device's ("dsp-0123abcd", its file name prefixed with it).
EXPECTED_V3_ARTIFACTS = [(*row, "") for row in EXPECTED_BLOB_ARTIFACTS[:6]] + [
    ("dsp", "dsp_loader", "dsp-0123abcd_cmd.stream", b"\x01\x00\x00\x00RUN\x00",
     {"device": "dsp0", "ratio": 0.5, "nested": {"a": [1, None, True]}}, "dsp-0123abcd")]


def _v3_contents() -> blob.BlobContents:
    return blob.BlobContents(
        ArtifactSet(Artifact(*row[:5], target_key=row[5]) for row in EXPECTED_V3_ARTIFACTS),
        (ModuleNode("native", (0, 1, 2)), ModuleNode("none", (3,)),
         ModuleNode("llvmjit", (4, 5)), ModuleNode("dsp_loader", (6,))),
        (0, 2, 2, 3, 3), (1, 2, 3), EXPECTED_BLOB_METADATA,
        (blob.LinkedData(2, 1280, 4096, 4096, ZEROS_4096_SHA256),))


def test_blob_v3_golden_file_reads_back():
    data = BLOB_V3.read_bytes()
    assert len(data) == 1240
    c = blob.unpack(data)
    got = [(a.codegen_id, a.loader, a.file_name, a.content, a.metadata, a.target_key)
           for a in c.artifacts]
    assert got == EXPECTED_V3_ARTIFACTS
    assert c.metadata == EXPECTED_BLOB_METADATA
    assert c.linked == (blob.LinkedData(2, 1280, 4096, 4096, ZEROS_4096_SHA256),)


def test_blob_v3_golden_header_by_hand():
    data = BLOB_V3.read_bytes()
    assert struct.unpack_from("<IIQII", data, 8) == (3, 0, 1240, 5, 0)
    table = [struct.unpack_from("<IIQQ", data, 32 + 24 * i) for i in range(5)]
    # ARTIFACTS (566 bytes in v2) grows by one target_key length word per artifact
    # (7 x 4), the key "dsp-0123abcd" (12) and its file-name prefix (13): 619.
    assert table[0] == (1, 0, 152, 619)
    # The first artifact record: codegen_id, loader, file_name, target_key "" (v3).
    assert data[152:156] == struct.pack("<I", 7)
    assert data[156 + 4:156 + 8 + 4 + 6 + 4 + 6 + 4] == (
        b"host" + struct.pack("<I", 6) + b"native" + struct.pack("<I", 6) + b"host.c"
        + struct.pack("<I", 0))


def test_blob_writer_produces_the_v3_golden_bytes():
    """The writer is fully specified by docs/format.md: same input, same bytes."""
    assert blob.pack(_v3_contents()) == BLOB_V3.read_bytes()


def test_archive_v1_golden_file_reads_back():
    arts, meta = load_with_metadata(ARCHIVE_V1)
    got = [(a.codegen_id, a.loader, a.file_name, a.content, a.metadata) for a in arts]
    assert got == [
        ("c", "native", "kernels.c", b"int kiln__kernel_f(float *x) { return 0; }\n",
         {"cflags": ["-O2", "-ffast-math"]}),
        ("host", "native", "host.c", b"/* host */\n", {}),
        ("c", "native", "constants.bin", b"\x00\x00\x80\x3f" * 4,
         {"symbol": "kiln__consts", "align": 64, "count": 1}),
        ("llvm", "none", "kernels.bc", b"BC\xc0\xde\x35\x14\x00\x00", {}),
    ]
    assert meta == {"format": "kiln.library", "version": 1, "prefix": "kiln_", "functions": {}}


def test_archive_v2_golden_file_reads_back():
    arts, meta = load_with_metadata(ARCHIVE_V2)
    got = [(a.codegen_id, a.file_name, a.target_key) for a in arts]
    assert got == [("c", "kernels.c", ""), ("host", "host.c", ""), ("c", "constants.bin", ""),
                   ("llvm", "kernels.bc", ""),
                   ("cuda", "cuda-0123abcd_kernels.ptx", "cuda-0123abcd")]
    assert arts.get("cuda", "cuda-0123abcd_kernels.ptx").content == b"// PTX\n"
    assert meta == {"format": "kiln.library", "version": 1, "prefix": "kiln_", "functions": {}}
