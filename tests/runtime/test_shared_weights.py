"""Two builds of one model whose packed weights differ in part (a batch-1 and a batch-32
build: the MatMul's weight is packed for a GEMV at batch 1, in GEMM panels at batch 32)
loaded together: the library loaded second maps the chunks that its weights file shares
with the first one's (equal SHA-256s in both indexes) from that file, its own file only
for the rest (kiln.runtime.external_weights.lend_chunks, docs/runtime.md "One copy per
process"). Results equal onnxruntime's.

One model (an embedding table of 256 KiB, gathered, then a 256 x 32 MatMul) compiled at
two batch sizes, once for the module.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.artifact.integrity import DIGEST_SIZE
from kiln.artifact.weights_file import read_header
from kiln.errors import FormatError
from kiln.frontend.onnx import from_onnx
from kiln.runtime import external_weights, load_module
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

RNG = np.random.default_rng(60)
TABLE = RNG.standard_normal((1024, 64)).astype(np.float32)
WEIGHT = RNG.standard_normal((64, 32)).astype(np.float32)
BATCHES = (1, 32)


def model() -> onnx.ModelProto:
    """y = Gather(TABLE, ids) @ WEIGHT, the batch (ids' length) symbolic."""
    b = GraphBuilder()
    b.consts({"table": TABLE, "weight": WEIGHT})
    b.input("ids", ["batch"], TensorProto.INT64)
    b.node("Gather", ["table", "ids"], ["rows"])
    b.node("MatMul", ["rows", "weight"], ["y"])
    b.output("y", ["batch", 32])
    return b.model(name="shared")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The model pinned to each of BATCHES, exported with external weights."""
    tmp = tmp_path_factory.mktemp("shared_weights")
    return {b: Path(kiln.compile(from_onnx(model(), shape_dict={"ids": [b]}), "llvm")
                    .export_library(tmp / f"b{b}.so", weights="external"))
            for b in BATCHES}


def chunks(so: Path) -> list[bytes]:
    """The chunk SHA-256s of a library's weights file (its only tensor)."""
    fd = os.open(str(so) + ".weights", os.O_RDONLY)
    try:
        (tensor,) = read_header(fd, str(so)).tensors
    finally:
        os.close(fd)
    return [tensor.digests[i:i + DIGEST_SIZE] for i in range(0, len(tensor.digests),
                                                              DIGEST_SIZE)]


def ids(batch: int) -> np.ndarray:
    return (np.arange(batch, dtype=np.int64) * 37) % len(TABLE)


def test_two_builds_share_the_chunks_their_weights_files_have_in_common(builds):
    first, second = chunks(builds[1]), chunks(builds[32])
    equal = sum(a == b for a, b in zip(first, second))
    assert 0 < equal < len(second)  # the table is equal, the packed weight is not
    one, many = load_module(builds[1]), load_module(builds[32])
    assert one.weights is not many.weights  # two files, each opened once
    assert {one.weights.content_hash, many.weights.content_hash} <= set(
        external_weights.mapped_hashes())
    assert external_weights.lent_chunks(one) == []  # loaded first: its own file whole
    lent = external_weights.lent_chunks(many)
    assert all(part.source is one.weights for part in lent)
    assert sum(part.length for part in lent) == equal * external_weights.SHARE_CHUNK
    for lib, batch in ((one, 1), (many, 32)):
        feed = {"ids": ids(batch)}
        np.testing.assert_allclose(lib["main"](feed["ids"]),
                                   onnxruntime_outputs(model(), feed)[0], rtol=1e-5, atol=1e-5)
    lender = one.weights.content_hash
    one.close()
    del one, lent, lib
    gc.collect()
    # The batch-32 library still maps the batch-1 library's file: it holds it meanwhile.
    assert lender in external_weights.mapped_hashes()
    np.testing.assert_allclose(many["main"](ids(32)), TABLE[ids(32)] @ WEIGHT,
                               rtol=1e-5, atol=1e-5)
    many.close()
    del many
    gc.collect()
    assert lender not in external_weights.mapped_hashes()


def test_a_damaged_lent_chunk_never_reaches_a_result(builds, tmp_path):
    """The borrowing library checks the bytes it maps (its own kiln.lane64 table), so a
    damaged chunk of the lending file is refused by both."""
    copies = {}
    for b, so in builds.items():
        copies[b] = Path(tmp_path / so.name)
        copies[b].write_bytes(so.read_bytes())
        Path(str(copies[b]) + ".weights").write_bytes(Path(str(so) + ".weights").read_bytes())
    weights = Path(str(copies[1]) + ".weights")
    fd = os.open(weights, os.O_RDONLY)
    try:
        (tensor,) = read_header(fd, str(weights)).tensors
    finally:
        os.close(fd)
    # A chunk both files hold (the index still names it: the second build borrows it).
    k = next(k for k, (a, b) in enumerate(zip(chunks(copies[1]), chunks(copies[32]))) if a == b)
    data = bytearray(weights.read_bytes())
    data[tensor.offset + k * external_weights.SHARE_CHUNK + 5] ^= 0xFF
    weights.write_bytes(bytes(data))
    gc.collect()  # the undamaged files of the test above (same content hashes) are closed
    with load_module(copies[1]) as one, load_module(copies[32]) as many:
        assert any(part.start <= k * external_weights.SHARE_CHUNK < part.start + part.length
                   for part in external_weights.lent_chunks(many))
        for lib, batch in ((one, 1), (many, 32)):
            with pytest.raises(FormatError, match="mismatch"):
                lib["main"](ids(batch))
