"""`kiln inspect`'s weights section: where a library's or MLF archive's weights live
(embedded, or a weights file found or not, its hash matching or not), tensors, bytes,
their SHA-256s (`--weights`), and the transforms the file can replay (its replay record:
none for a library compiled from IR, or for an MLF archive; those of an ONNX model's).

One small model (x @ W) is compiled once for `c` and exported three ways; every hash
the report shows is recomputed here from the files' bytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.artifact.integrity import CHUNK_SIZE, chunk_digests, tree_digest
from kiln.artifact.weights_file import read_header, write_weights
from kiln.cli.inspect import cmd_inspect
from kiln.cli.main import main
from kiln.errors import UsageError
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.runtime.external_weights import SHARE_CHUNK

W = np.arange(32, dtype=np.float32).reshape(4, 8) / 7
GOLDEN_V3 = Path(__file__).resolve().parents[1] / "golden" / "mlf_v3_2026-11-27.tar"
NOT_YET = "transforms replayable: none (no replay record: new weights need a compile)"
MLF_NOT = "transforms replayable: none (an MLF archive: new weights need a new archive)"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("inspect_weights")
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (2, 4), "float32")
        ib.ret(ib.emit(kiln.ops.call("matmul", x, g.Constant(W, "w")), "y"))
    ex = kiln.compile(ib.get(), "c")
    return {"embedded": ex.export_library(tmp / "emb.so"),
            "external": ex.export_library(tmp / "ext.so", weights="external"),
            "mlf": kiln.export_model_library_format(ex, tmp / "m.tar", model_name="m")}


def _weights(path: Path) -> dict[str, Any]:
    section: dict[str, Any] = json.loads(cmd_inspect(str(path), None, "json"))["weights"]
    return section


def _blob_digest(weights_file: Path, chunk: int | None = None) -> str:
    """The chunked SHA-256 of the one tensor of a weights file, from its bytes, by the
    blob's 4 MiB chunks, or by `chunk` (the file's index's: 64 KiB)."""
    with open(weights_file, "rb") as f:
        (t,) = read_header(f.fileno(), str(weights_file)).tensors
        f.seek(t.offset)
        data = f.read(t.size)
    size = chunk or CHUNK_SIZE
    return tree_digest(chunk_digests(data, size), len(data), size)


def test_embedded_and_external_libraries(files: dict[str, Path]) -> None:
    ext_file = Path(str(files["external"]) + ".weights")
    digest = _blob_digest(ext_file)
    indexed = _blob_digest(ext_file, SHARE_CHUNK)
    emb, ext = _weights(files["embedded"]), _weights(files["external"])
    assert emb["where"] == "embedded" and emb["count"] == 1 and emb["bytes"] >= W.nbytes
    assert [t["chunked_sha256"] for t in emb["tensors"]] == [digest]
    assert emb["transforms_replayable"] == [] == ext["transforms_replayable"]
    with open(ext_file, "rb") as f:
        content = read_header(f.fileno(), str(ext_file)).content_hash
    assert ext == {**ext, "where": "external", "file": str(ext_file.resolve()), "found": True,
                   "hash_matches": True, "problem": None, "content_sha256": content,
                   "count": 1, "bytes": emb["bytes"]}
    # The file's index hashes 64 KiB chunks (the unit libraries share pages by).
    assert [t["chunked_sha256"] for t in ext["tensors"]] == [indexed]
    text = cmd_inspect(str(files["external"]), None, None)
    assert f"external: {ext_file.resolve()} (found, content sha256 {content} matches" in text
    assert f"tensors:  1, {emb['bytes']} bytes" in text and NOT_YET in text
    assert indexed not in text and indexed in cmd_inspect(str(files["external"]), None, None,
                                                        weights=True)
    assert "where:    embedded in the shared library" in cmd_inspect(
        str(files["embedded"]), None, None)


def test_a_weights_file_missing_other_or_damaged_is_named(files: dict[str, Path],
                                                          tmp_path: Path) -> None:
    lib = Path(shutil.copy(files["external"], tmp_path / "ext.so"))
    beside = tmp_path / "ext.so.weights"
    found = _weights(lib)
    assert (found["found"], found["hash_matches"]) == (False, None)
    assert found["problem"].startswith("not found")
    other = b"\x01" * 128
    write_weights(beside, [("constants.bin", other, CHUNK_SIZE, chunk_digests(other))])
    found = _weights(lib)
    assert (found["found"], found["hash_matches"]) == (True, False)
    assert "found, but holds other weights: content sha256 " in cmd_inspect(str(lib), None,
                                                                            None)
    beside.write_bytes(bytes(100))
    found = _weights(lib)
    assert found["hash_matches"] is False and "not a kiln weights file" in found["problem"]


def test_mlf_weights_with_their_sha256(files: dict[str, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with tarfile.open(files["mlf"]) as tar:
        member = tar.extractfile("parameters/m.params")
        assert member is not None
        params = member.read()
    info = _weights(files["mlf"])
    assert info["where"] == "embedded" and info["file"] == "parameters/m.params"
    assert info["per_tensor_sha256"] and info["count"] == len(info["tensors"]) >= 1
    for t in info["tensors"]:
        piece = params[t["offset"]:t["offset"] + t["bytes"]]
        assert t["sha256"] == hashlib.sha256(piece).hexdigest()
    assert sum(t["bytes"] for t in info["tensors"]) == info["bytes"] >= W.nbytes
    assert main(["inspect", str(files["mlf"]), "--weights"]) == 0
    out = capsys.readouterr().out
    t = info["tensors"][0]
    assert (f"tensor   {t['name']}: float32{t['shape']} at {t['offset']}, {t['bytes']} bytes, "
            f"sha256 {t['sha256']}") in out
    assert MLF_NOT in out and "embedded in the archive: parameters/m.params" in out


def test_an_mlf_before_version_4_has_no_per_tensor_hashes() -> None:
    info = _weights(GOLDEN_V3)
    assert (info["per_tensor_sha256"], info["count"], info["bytes"]) == (False, None, 16)
    assert "tensors:  not recorded (this MLF version has no per-tensor SHA-256s" in \
        cmd_inspect(str(GOLDEN_V3), None, None)


def test_weights_goes_with_the_report(files: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match="--weights goes with the report"):
        cmd_inspect(str(files["embedded"]), "c/host.c", None, weights=True)
