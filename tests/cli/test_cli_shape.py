"""kiln compile --shape: bind an input's shape by input name; bad values are one line."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from kiln_cli import MODEL, one_line_error, run_kiln

from support.graphs import GraphBuilder


def _relu_batch(tmp_path: Path) -> None:
    """relu.onnx: a Relu whose batch dimension is symbolic."""
    b = GraphBuilder()
    b.node("Relu", ["x"], ["y"])
    b.input("x", ["batch", 64])
    b.output("y", ["batch", 64])
    onnx.save(b.model(opset=None, name="relu", ir_version=None),
              tmp_path / "relu.onnx")


def test_shape_by_input_name_reaches_the_signature(tmp_path: Path) -> None:
    _relu_batch(tmp_path)
    done = run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so", "--shape", "x=3,64",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_kiln("inspect", "m.so", "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    main = json.loads(shown.stdout)["functions"]["main"]
    assert main["inputs"] == [{"name": "x", "shape": [3, 64], "dtype": "float32"}]


def test_non_integer_shape_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(run_kiln("compile", str(MODEL), "-t", "llvm", "-o", "m.so",
                                   "--shape", "x=1,abc", cwd=tmp_path))
    assert "--shape x=1,abc" in line and "integers" in line
    assert not (tmp_path / "m.so").exists()


def test_shape_by_dimension_name_pins_it(tmp_path: Path) -> None:
    _relu_batch(tmp_path)
    done = run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so", "--shape", "batch=5",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_kiln("inspect", "m.so", "--format", "json", cwd=tmp_path)
    main = json.loads(shown.stdout)["functions"]["main"]
    assert main["inputs"] == [{"name": "x", "shape": [5, 64], "dtype": "float32"}]


def test_bad_dimension_entries_are_one_line(tmp_path: Path) -> None:
    _relu_batch(tmp_path)
    line = one_line_error(run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so",
                                   "--shape", "btach=5", cwd=tmp_path))
    assert "'btach', which is neither an input nor a dimension" in line
    assert "did you mean 'batch'?" in line
    line = one_line_error(run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so",
                                   "--shape", "batch=1:x", cwd=tmp_path))
    assert "--shape batch=1:x" in line and "MIN:MAX" in line
    line = one_line_error(run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so",
                                   "--shape", "x=?,32", cwd=tmp_path))
    assert "shape_dict gives input 'x' shape (None, 32), but the model declares" in line
    assert not (tmp_path / "m.so").exists()


def test_a_bound_past_int64_is_one_line(tmp_path: Path) -> None:
    """Sizes cross the C ABI as int64_t; a range past it once died in len(range)."""
    _relu_batch(tmp_path)
    line = one_line_error(run_kiln("compile", "relu.onnx", "-t", "llvm", "-o", "m.so",
                                   "--shape", f"batch=1:{10**20}", cwd=tmp_path))
    assert line.startswith("kiln compile: error: shape_dict['batch'] = range(1, "), line
    assert "the largest size must fit int64 (at most 9223372036854775807)" in line
