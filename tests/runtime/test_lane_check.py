"""kiln_hash64.c and kiln_check.c, the weights' check at memory bandwidth
(kiln.runtime.weights_check): the C hash equals kiln.artifact.integrity.lane64 (numpy,
which export writes the table with), the files compile with every warning an error,
its entries find a damaged chunk, and a change within one 64-bit lane always changes
the hash. The loaders' use of it (embedded and external, Python and a C program) is in
test_weight_check.py and test_external_weights.py."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from kiln.artifact import Artifact
from kiln.artifact.integrity import LANE64, lane64, lane64_digests
from kiln.artifact.segments import Segments
from kiln.runtime.library import static_header
from kiln.runtime.weights_check import check_artifact, lane_regions
from support.toolchains import c_compiler

SIZE = 5 * 4096 + 3  # a short last lane


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> tuple[ctypes.CDLL, bytes]:
    """kiln_hash64.c and kiln_check.c as export writes them for one 20 KiB region
    `m_consts`, linked with a writable definition of that region."""
    tmp = tmp_path_factory.mktemp("kiln_check")
    data = np.random.default_rng(60).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    made = check_artifact([Artifact("llvm", "native", "constants.bin", data,
                                    {"symbol": "m_consts", "align": 64})], "m")
    assert made is not None
    sources, entry = made
    assert entry["hash"] == LANE64 and entry["chunks"] == 1
    assert entry["regions"] == [{"artifact": "llvm/constants.bin", "symbol": "m_consts",
                                 "size": SIZE}]
    for source in sources:
        (tmp / source.file_name).write_bytes(bytes(source.content))
    init = ", ".join(str(b) for b in data)
    (tmp / "data.c").write_text("#include <stdint.h>\n__attribute__((visibility(\"hidden\"))) "
                                f"uint8_t m_consts[{SIZE}] = {{{init}}};\n"
                                "uint8_t *m_region(void) { return m_consts; }\n")
    so = tmp / "check.so"
    subprocess.run([c_compiler(), "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC",
                    "-shared", *(str(tmp / s.file_name) for s in sources), str(tmp / "data.c"),
                    "-o", str(so)],
                   check=True, timeout=120)
    lib = ctypes.CDLL(str(so))
    lib.m_hash64.restype, lib.m_hash64.argtypes = ctypes.c_uint64, [ctypes.c_void_p,
                                                                     ctypes.c_uint64]
    lib.m_check_weights.restype = ctypes.c_int64
    lib.m_check_weights.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.m_weights_chunks.restype = ctypes.c_int64
    lib.m_rehash_weights.restype = ctypes.c_int64
    lib.m_rehash_weights.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32]
    lib.m_region.restype = ctypes.c_void_p
    return lib, data


def test_the_c_hash_is_the_numpy_hash(checker):
    lib, _data = checker
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 4096, (1 << 16) + 5):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        assert lib.m_hash64(buf.ctypes.data, n) == lane64(buf.tobytes()), n


def test_the_check_entry_finds_a_damaged_chunk(checker):
    lib, data = checker
    assert lib.m_weights_chunks() == 1
    assert lib.m_check_weights(0, 1) == -1
    assert lib.m_check_weights(0, 2) == -2 and lib.m_check_weights(-1, 1) == -2
    region = (ctypes.c_uint8 * SIZE).from_address(lib.m_region())
    for at in (0, 4097, SIZE - 1):  # a flipped bit anywhere, the short last lane included
        region[at] ^= 0x40
        assert lib.m_check_weights(0, 1) == 0, at
        region[at] ^= 0x40
    assert lib.m_check_weights(0, 1) == -1
    assert bytes(region) == data


def test_a_change_within_one_lane_always_changes_the_hash():
    rng = np.random.default_rng(2)
    data = bytearray(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    base = lane64(data)
    for _ in range(200):
        lane, value = int(rng.integers(0, 512)), int(rng.integers(1, 1 << 63))
        changed = bytearray(data)
        word = int.from_bytes(changed[8 * lane:8 * lane + 8], "little") ^ value
        changed[8 * lane:8 * lane + 8] = word.to_bytes(8, "little")
        assert lane64(changed) != base
    swapped = data[8:16] + data[:8] + data[16:]  # lanes are keyed by their place
    assert lane64(swapped) != base
    assert lane64_digests(bytes(data), 1024) == b"".join(
        lane64(data[i:i + 1024]).to_bytes(8, "little") for i in range(0, 4096, 1024))


def test_segments_hash_as_their_bytes_joined():
    """A Segments' chunks are views of its parts, joined only across a part's end."""
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (3000, 10, 5000, 1)]
    for chunk in (8, 1024, 4096, 1 << 20):
        assert lane64_digests(Segments(parts), chunk) == lane64_digests(b"".join(parts), chunk)


def test_the_table_follows_a_swap_and_keeps_older_damage(checker):
    """`{prefix}_rehash_weights(data, size, phase)`: phase 0 notes the intact chunks of the
    range, 1 after the write hashes them again; a chunk damaged before keeps its hash."""
    lib, data = checker
    region = lib.m_region()
    new = bytes(range(100))
    try:
        assert lib.m_rehash_weights(region + 50, len(new), 0) == 0
        ctypes.memmove(region + 50, new, len(new))
        assert lib.m_check_weights(0, 1) == 0  # not told yet: the old table
        assert lib.m_rehash_weights(region + 50, len(new), 1) == 1
        assert lib.m_check_weights(0, 1) == -1
        ctypes.memmove(region + 7, b"\xff", 1)  # damage, then another swap
        assert lib.m_rehash_weights(region + 50, 4, 0) == 0
        ctypes.memmove(region + 50, b"abcd", 4)
        assert lib.m_rehash_weights(region + 50, 4, 1) == 0  # not re-hashed
        assert lib.m_check_weights(0, 1) == 0
        assert lib.m_rehash_weights(region + SIZE - 2, 4, 0) == -2  # past the weights
        assert lib.m_rehash_weights(region, 4, 2) == -2
    finally:  # back to the exported bytes and table, through the bytes the table holds
        ctypes.memmove(region, data, SIZE)
        ctypes.memmove(region + 50, new, len(new))
        lib.m_rehash_weights(region, SIZE, 0)
        ctypes.memmove(region, data, SIZE)
        lib.m_rehash_weights(region, SIZE, 1)
        assert lib.m_check_weights(0, 1) == -1


def test_a_record_of_another_hash_falls_back_to_the_sha256s():
    assert lane_regions(None, {"hash": "kiln.lane64/2"}, "x.so") is None
    assert lane_regions(None, None, "x.so") is None


def test_the_static_header_declares_the_check():
    text = static_header({"weights_check": {"hash": LANE64}}, "m_", "m.h", "m.a")
    assert "int64_t m__check_weights(int64_t first, int64_t count);" in text
    assert "int64_t m__weights_chunks(void);" in text
    assert "int64_t m__rehash_weights(const void *data, uint64_t size, int32_t phase);" in text
