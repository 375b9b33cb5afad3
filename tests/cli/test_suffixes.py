"""The suffixes `kiln compile` writes are one list, complete in every message; a file
given in the wrong place (an array for a model, a model for a library) names the next step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kiln_cli import MODEL

import kiln
from kiln.cli.main import main
from kiln.cli.outputs import compile_outputs
from kiln.runtime.library import SUFFIXES


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_unknown_suffix_error_lists_every_output(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert list(compile_outputs()) == [*SUFFIXES, ".wasm"]
    line = _error(capsys, "compile", str(MODEL), "-o", str(tmp_path / "m.dylib"))
    for suffix, what in compile_outputs().items():
        assert f"{suffix} ({what})" in line, line
    assert "cannot write a .dylib file" in line
    assert not (tmp_path / "m.dylib").exists()


def test_the_help_names_every_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = capsys.readouterr().out
    for suffix in compile_outputs():
        assert suffix in text, suffix


def test_an_array_given_as_the_model_or_the_library(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    array = tmp_path / "x.npy"
    np.save(array, np.zeros((1, 64), np.float32))
    line = _error(capsys, "compile", str(array), "-o", str(tmp_path / "m.so"))
    assert "NumPy .npy array" in line and ".onnx" in line and "--input NAME=FILE.npy" in line
    line = _error(capsys, "run", str(array))
    assert "cannot load a .npy file" in line and ".onnx" in line and "kiln compile" in line
    line = _error(capsys, "run", str(MODEL))
    assert "kiln compile MODEL.onnx -o MODEL.so" in line and "InferenceSession" in line
    with pytest.raises(kiln.FormatError, match=r"\.onnx model is compiled first"):
        kiln.runtime.load_module(MODEL)
