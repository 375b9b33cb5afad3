"""Weights past the small code model's reach (issue 60): kernels address a large pool
through a base pointer read at run time, and the weights go to x86-64's large data
sections (`.lrodata` embedded, `.lbss` for an external weights file's regions), so
nothing folds an offset into a 32-bit relocation and the code and small data stay
within +-2 GiB of each other (kiln.codegen.constants.LARGE_CONSTS_BYTES).

Always on: the path forced on a small model (the threshold lowered), llvm and c, the
library embedded and external, results against onnxruntime. With KILN_FULL_MODELS=1:
two 16384 x 36864 float32 MatMuls (4.5 GiB of weights), built and run for real.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import kiln
from kiln.artifact import safe_tar
from kiln.artifact.elf import SHT_SYMTAB, read_symbols, section_name
from kiln.codegen import constants
from kiln.runtime import load_module
from kiln.runtime.data_object import SHF_X86_64_LARGE
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

FULL = os.environ.get("KILN_FULL_MODELS") == "1"
X86_64 = os.uname().machine == "x86_64"


def matmul_chain(sizes: list[int], seed: int = 60,
                 weights: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """`y = relu(x @ W0) @ W1 ...`, float32, x of shape (4, sizes[0]); `weights`, when
    given, are the initializers as they are (e.g. naming external data)."""
    gb = GraphBuilder(seed)
    last = gb.input("x", [4, sizes[0]])
    for i, (k, n) in enumerate(itertools.pairwise(sizes)):
        w = gb.const(weights[i]) if weights else gb.const(
            gb.rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5), f"w{i}")
        last = gb.op("MatMul", last, w)
        if i + 2 < len(sizes):
            last = gb.op("Relu", last)
    gb.nodes[-1].output[0] = "y"
    gb.output("y", [4, sizes[-1]])
    return gb.model(check=weights is None)


def large_sections(so: Path) -> dict[str, int]:
    """Size of every section of `so` flagged SHF_X86_64_LARGE, by name."""
    with open(so, "rb") as f:
        elf = read_symbols(f.fileno(), str(so), (SHT_SYMTAB,))
        return {section_name(elf, f.fileno(), i): s.size for i, s in enumerate(elf.sections)
                if s.flags & SHF_X86_64_LARGE}


@pytest.fixture(scope="module")
def forced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The small chain compiled with the large path forced, for llvm and c, each exported
    embedded and external; onnxruntime's answer."""
    model = matmul_chain([64, 96, 48])
    x = np.random.default_rng(1).standard_normal((4, 64), dtype=np.float32)
    folder = tmp_path_factory.mktemp("large")
    out: dict[str, object] = {"x": x, "ref": onnxruntime_outputs(model, {"x": x})[0]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "LARGE_CONSTS_BYTES", 0)
        for codegen in ("llvm", "c"):
            ex = kiln.compile(model, codegen)
            out[codegen] = ex
            out[f"{codegen}/embedded"] = Path(ex.export_library(folder / f"{codegen}.so"))
            out[f"{codegen}/external"] = Path(ex.export_library(
                folder / f"{codegen}_ext.so", weights="external"))
    return out


@pytest.mark.parametrize("codegen", ["llvm", "c"])
@pytest.mark.parametrize("weights", ["embedded", "external"])
def test_forced_large_path_matches_onnxruntime(forced, codegen, weights):
    ex = forced[codegen]
    data = [a for a in ex.artifacts if a.file_name == "constants.bin"]  # type: ignore[attr-defined]
    assert data and data[0].metadata.get("large") is True
    so = forced[f"{codegen}/{weights}"]
    with load_module(so, verify_weights=True) as lib:
        np.testing.assert_allclose(lib["main"](forced["x"]), forced["ref"], rtol=1e-5,
                                   atol=1e-5)
    if X86_64:  # the weights sit in a large-data section
        names = large_sections(so)
        assert any(n.startswith(".lrodata" if weights == "embedded" else ".lbss")
                   for n in names), names


def test_small_pools_keep_the_small_path(forced):
    ex = kiln.compile(matmul_chain([64, 96, 48]), "c")
    data = [a for a in ex.artifacts if a.file_name == "constants.bin"]
    assert "large" not in data[0].metadata
    source = next(a for a in ex.artifacts if a.file_name == "kernels.c").content
    assert b"kiln_consts_base" not in bytes(source)


def external_chain(folder: Path, sizes: list[int], seed: int) -> Path:
    """`matmul_chain(sizes)` saved with its weights as external data, written block by
    block (a ModelProto cannot hold 2 GiB, and the test never holds a weight whole)."""
    rng = np.random.default_rng(seed)
    weights = []
    with open(folder / "weights.data", "wb") as f:
        for i, (k, n) in enumerate(itertools.pairwise(sizes)):
            offset = f.tell()
            for start in range(0, k, 1024):
                rows = min(1024, k - start)
                f.write((rng.standard_normal((rows, n), dtype=np.float32)
                         * np.float32(k ** -0.5)).tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[k, n],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.data"), ("offset", str(offset)),
                               ("length", str(k * n * 4))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            weights.append(t)
    path = folder / "chain.onnx"
    onnx.save(matmul_chain(sizes, weights=weights), path)
    return path


@pytest.mark.skipif(not FULL, reason="4.5 GiB of weights: KILN_FULL_MODELS=1")
@pytest.mark.skipif(not X86_64, reason="the large-data sections are x86-64's")
def test_four_and_a_half_gib_of_weights(tmp_path):
    model = external_chain(tmp_path, [16384, 36864, 16384], seed=4)
    x = np.random.default_rng(2).standard_normal((4, 16384), dtype=np.float32)
    options = ort.SessionOptions()  # without prepacking, which would copy the 4.5 GiB
    options.add_session_config_entry("session.disable_prepacking", "1")
    ref = onnxruntime_outputs(model, {"x": x}, options)[0]
    ex = kiln.compile(model, "llvm")
    libraries = [ex.export_library(tmp_path / "big.so"),
                 ex.export_library(tmp_path / "big_ext.so", weights="external")]
    del ex
    for so in libraries:
        with load_module(so) as lib:
            np.testing.assert_allclose(lib["main"](x), ref, rtol=1e-4, atol=1e-4)
    assert ".lrodata.kiln__blob" in large_sections(libraries[0])


def test_an_archive_over_the_readers_limits_is_refused_at_export(forced, tmp_path, monkeypatch):
    monkeypatch.setattr(safe_tar, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(kiln.ExportError, match=r"is \d+ bytes and the artifacts.*export a \.so"):
        forced["llvm"].export_library(tmp_path / "big.tar")  # type: ignore[attr-defined]
    assert not (tmp_path / "big.tar").exists()
