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
from kiln.runtime import external_weights, load_module, shared_constants
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


def copy_of(so: Path, folder: Path) -> Path:
    """`so` and its weights file under `folder`: another library image (dlopen maps one
    image per path)."""
    folder.mkdir(exist_ok=True)
    out = folder / so.name
    out.write_bytes(so.read_bytes())
    Path(str(out) + ".weights").write_bytes(Path(str(so) + ".weights").read_bytes())
    return out


def test_shared_constants_are_read_through_one_mapping(builds, tmp_path):
    """The batch-32 library's kernels read the constants it shares with the batch-1
    library at the batch-1 library's addresses (its table's slots point there: one
    mapping of those pages in the process, kiln.runtime.shared_constants); a swap of
    either side, or the lender's close, points them back first, so each library keeps
    computing with its own weights."""
    gc.collect()  # the damaged files of the test above are closed (same content hashes)
    one, many = load_module(builds[1]), load_module(builds[32])
    mine, theirs = shared_constants.tabled(many), shared_constants.tabled(one)
    assert mine is not None and theirs is not None
    assert mine.borrowed and not theirs.borrowed  # the table, not the repacked weight
    for i, (lender, j) in mine.borrowed.items():
        assert lender is theirs and mine.slots[i] == theirs.slots[j] != mine.home[i]
    assert len(mine.borrowed) < len(mine.home)
    want = {b: onnxruntime_outputs(model(), {"ids": ids(b)})[0] for b in BATCHES}
    np.testing.assert_allclose(many["main"](ids(32)), want[32], rtol=1e-5, atol=1e-5)
    one.swap_weights({"table": TABLE * 2, "weight": WEIGHT})  # the lender swaps
    assert not mine.borrowed and all(mine.slots[i] == mine.home[i]
                                     for i in range(len(mine.home)))
    np.testing.assert_allclose(one["main"](ids(1)), 2 * want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(many["main"](ids(32)), want[32], rtol=1e-5, atol=1e-5)
    # A swapped library lends nothing: another batch-32 image borrows from `many`.
    again = load_module(copy_of(builds[32], tmp_path / "again"), verify_weights=True)
    assert again.weights is many.weights
    assert {id(lender) for lender, _j in shared_constants.tabled(again).borrowed.values()} \
        == {id(mine)}
    for lib in (one, many, again):
        lib.close()


def test_the_lenders_close_points_borrowers_home(builds, tmp_path):
    gc.collect()
    one, many = load_module(builds[1]), load_module(builds[32])
    mine = shared_constants.tabled(many)
    assert mine is not None and mine.borrowed
    many.swap_weights({"table": TABLE, "weight": WEIGHT * 3})  # the borrower swaps
    assert not mine.borrowed
    np.testing.assert_allclose(many["main"](ids(32)), 3 * (TABLE[ids(32)] @ WEIGHT),
                               rtol=1e-5, atol=1e-5)
    third = load_module(copy_of(builds[32], tmp_path / "third"))
    assert shared_constants.tabled(third).borrowed  # from the batch-1 library again
    one.close()
    assert not shared_constants.tabled(third).borrowed
    np.testing.assert_allclose(third["main"](ids(32)), TABLE[ids(32)] @ WEIGHT,
                               rtol=1e-5, atol=1e-5)
    many.close()
    third.close()


def test_an_llvm_and_a_c_build_share_constants(builds, tmp_path):
    """The `c` backend's kernels read the same table: a `c` build loaded beside the
    `llvm` one reads the constants they share at the `llvm` library's addresses."""
    gc.collect()
    c_build = kiln.compile(from_onnx(model(), shape_dict={"ids": [1]}), "c").export_library(
        tmp_path / "c_b1.so", weights="external")
    one, c_one = load_module(builds[1]), load_module(c_build)
    mine = shared_constants.tabled(c_one)
    assert mine is not None and mine.borrowed
    assert all(lender is shared_constants.tabled(one) for lender, _j in mine.borrowed.values())
    np.testing.assert_allclose(c_one["main"](ids(1)), TABLE[ids(1)] @ WEIGHT,
                               rtol=1e-5, atol=1e-5)
    one.close()
    c_one.close()
