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
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.artifact import safe_tar
from kiln.artifact.elf import SHT_SYMTAB, read_symbols, section_name
from kiln.codegen import constants
from kiln.runtime import load_module
from kiln.runtime.data_object import SHF_X86_64_LARGE
from support.reference import onnxruntime_outputs

FULL = os.environ.get("KILN_FULL_MODELS") == "1"
X86_64 = os.uname().machine == "x86_64"


def matmul_chain(sizes: list[int], seed: int = 60) -> onnx.ModelProto:
    """`y = relu(x @ W0) @ W1 ...`, float32, x of shape (4, sizes[0])."""
    rng = np.random.default_rng(seed)
    inits, nodes, last = [], [], "x"
    for i, (k, n) in enumerate(itertools.pairwise(sizes)):
        w = rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]))
        last = f"m{i}"
        if i + 2 < len(sizes):
            nodes.append(helper.make_node("Relu", [last], [f"r{i}"]))
            last = f"r{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, sizes[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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


@pytest.mark.skipif(not FULL, reason="4.5 GiB of weights: KILN_FULL_MODELS=1")
@pytest.mark.parametrize("weights", ["embedded", "external"])
def test_four_and_a_half_gib_of_weights(tmp_path, weights):
    model = matmul_chain([16384, 36864, 16384], seed=4)
    x = np.random.default_rng(2).standard_normal((4, 16384), dtype=np.float32)
    ref = onnxruntime_outputs(model, {"x": x})[0]
    so = kiln.compile(model, "llvm").export_library(tmp_path / "big.so", weights=weights)
    del model
    with load_module(so) as lib:
        np.testing.assert_allclose(lib["main"](x), ref, rtol=1e-4, atol=1e-4)


def test_an_archive_over_the_readers_limits_is_refused_at_export(forced, tmp_path, monkeypatch):
    monkeypatch.setattr(safe_tar, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(kiln.ExportError, match=r"is \d+ bytes and the artifacts.*export a \.so"):
        forced["llvm"].export_library(tmp_path / "big.tar")  # type: ignore[attr-defined]
    assert not (tmp_path / "big.tar").exists()
