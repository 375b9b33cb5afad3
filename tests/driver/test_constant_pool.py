"""ConstantPool: the weights blob is built with one copy and hashed once, in chunks."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kiln.artifact.integrity import CHUNK_SIZE, chunk_digests, tree_digest
from kiln.codegen.constants import CONST_ALIGN, ConstantPool


@pytest.mark.parametrize("sizes", [[], [3], [5, 7, CHUNK_SIZE // 4, 3],
                                   [CHUNK_SIZE // 4 + 1, CHUNK_SIZE // 2, 17]])
def test_digests_from_the_arrays_equal_digests_of_the_blob(sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    arrays = [rng.random(n, dtype=np.float32) for n in sizes]
    pool, beside = ConstantPool(), ConstantPool()
    offsets = [pool.add(a) for a in arrays]
    streamed = pool.chunk_digests()  # before the blob exists: hashed from the arrays
    for a in arrays:
        beside.add(a)
    beside.hash_in_background()  # the same digests, from threads of their own
    assert beside.chunk_digests() == streamed
    blob = pool.to_bytes()
    assert streamed == chunk_digests(blob)
    # The blob by hand: each array at its aligned offset, zero padding between.
    expected = bytearray(pool.size)
    for off, a in zip(offsets, arrays):
        assert off % CONST_ALIGN == 0
        expected[off:off + a.nbytes] = a.tobytes()
    assert blob == bytes(expected)
    chunks = [blob[i:i + CHUNK_SIZE] for i in range(0, len(blob), CHUNK_SIZE)]
    assert streamed == b"".join(hashlib.sha256(c).digest() for c in chunks)
    assert pool.fingerprint() == tree_digest(streamed, len(blob))


def test_the_same_array_is_stored_once_and_the_artifact_carries_the_hashes() -> None:
    a = np.arange(10, dtype=np.int32)
    pool = ConstantPool()
    assert pool.add(a) == pool.add(a) == 0
    art = pool.artifact("c", "kiln_")
    assert art.content == a.tobytes() and len(pool) == 1
    assert art.metadata["chunk_size"] == CHUNK_SIZE
    assert bytes.fromhex(art.metadata["chunk_sha256"]) == hashlib.sha256(a.tobytes()).digest()
