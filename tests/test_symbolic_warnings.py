"""Kernels left on their generic loops by a symbolic size are reported, never silent:
kiln.compile warns (GenericKernelWarning) naming the node and the pin, the library
metadata keeps them (kiln inspect of the exported library lists them), `kiln compile`
prints them, and kiln.InferenceSession exposes them and warns once. A pinned build
reports nothing."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.cli.inspect import cmd_inspect
from kiln.cli.main import main as kiln_cli
from kiln.errors import GenericKernelWarning
from kiln.kernels.specialisation import GenericKernel, pins
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target


def _lrn_model() -> onnx.ModelProto:
    """LRN over a symbolic image height: its hand-built kernel (kiln.kernels.lrn) takes a
    symbolic batch but static channel and image axes, so this build runs the
    tensor-expression loops."""
    gb = GraphBuilder()
    gb.node("LRN", [gb.input("x", (1, 8, "height", 5))], ["y"], size=3, name="norm1")
    gb.output("y", (1, 8, "height", 5))
    return gb.model()


def _compile(model: onnx.ModelProto, target: object = "llvm",
             shape_dict: dict[str, int] | None = None
             ) -> tuple[kiln.Executable, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = kiln.compile(kiln.frontend.from_onnx(model, shape_dict=shape_dict), target)
    return exe, [w for w in caught if issubclass(w.category, GenericKernelWarning)]


@pytest.mark.parametrize("kind", NATIVE_TARGETS)
def test_compile_warns_with_node_and_pin(kind: str) -> None:
    model = _lrn_model()
    exe, caught = _compile(model, native_target(kind))
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "node 'norm1' (LRN), kiln's lrn of [1, 8, height, 5]" in text
    assert 'shape_dict={"height": HEIGHT}' in text and "--shape height=HEIGHT" in text
    [entry] = exe.metadata["generic_kernels"]
    assert entry["op"] == "lrn" and entry["pins"] == [{"name": "height", "size": None}]
    # the generic loops are still right, at every size
    for height in (5, 3):
        data = np.random.default_rng(height).standard_normal((1, 8, height, 5)).astype(
            np.float32)
        [expected] = onnxruntime_outputs(model, {"x": data})
        np.testing.assert_allclose(exe["main"](data), expected, rtol=1e-5, atol=1e-5)


def test_pinned_build_is_silent() -> None:
    exe, caught = _compile(_lrn_model(), shape_dict={"height": 5})
    assert caught == []
    assert "generic_kernels" not in exe.metadata


def test_inspect_lists_them_from_the_exported_library(tmp_path: Path) -> None:
    exe, _ = _compile(_lrn_model())
    lib = tmp_path / "lrn.so"
    exe.export_library(str(lib))
    text = cmd_inspect(str(lib), None, None)
    assert "generic kernels: 1 run their generic loops" in text
    assert ("node 'norm1' (LRN), kiln's lrn of [1, 8, height, 5] -> lrn with "
            'shape_dict={"height": HEIGHT}') in text
    assert '"generic_kernels"' in cmd_inspect(str(lib), None, "json")


def test_cli_compile_prints_the_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    src = tmp_path / "lrn.onnx"
    onnx.save(_lrn_model(), str(src))
    assert kiln_cli(["compile", str(src), "-o", str(tmp_path / "lrn.so")]) == 0
    out = capsys.readouterr().out
    assert "warning: 1 kernel(s) run their generic loops" in out
    assert "--shape height=HEIGHT" in out


def test_session_exposes_them_and_warns_once(tmp_path: Path) -> None:
    src = tmp_path / "lrn.onnx"
    onnx.save(_lrn_model(), str(src))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = kiln.InferenceSession(str(src))
    assert [issubclass(w.category, GenericKernelWarning) for w in caught].count(True) == 1
    [entry] = session.generic_kernels
    assert entry["node"] == "lrn" and 'shape_dict={"height": HEIGHT}' in entry["hint"]
    data = np.ones((1, 8, 4, 5), np.float32)
    [expected] = onnxruntime_outputs(_lrn_model(), {"x": data})
    np.testing.assert_allclose(session.run(None, {"x": data})[0], expected, rtol=1e-5)


def test_pins_are_sizes_that_make_sense() -> None:
    # a batch: 1; a bounded variable: its bound; otherwise no made-up number
    assert pins(["batch", "seq", "past"], {"seq": (1, 512), "past": (0, None)}) == (
        ("batch", 1), ("seq", 512), ("past", None))
    k = GenericKernel("h", "conv2d", "conv2d_nchwc", ("[1, 3, height, 8]",),
                      (("height", None),))
    assert k.pin_text() == ('shape_dict={"height": HEIGHT} '
                            "(CLI: kiln compile ... --shape height=HEIGHT)")
