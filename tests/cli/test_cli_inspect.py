"""`kiln inspect`: functions, format, target, artifacts and weights of a .so and of a .a."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from kiln_cli import MODEL, one_line_error, run_kiln


def _initializer_bytes() -> int:
    graph = onnx.load(str(MODEL)).graph
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer)


@pytest.mark.parametrize("library", ["mlp.so", "mlp.a"])
def test_json_report(built: Path, library: str) -> None:
    proc = run_kiln("inspect", library, "--format", "json", cwd=built)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["kind"] == ("shared library" if library.endswith(".so") else "static library")
    assert info["format"] == "kiln.library" and isinstance(info["format_version"], int)
    main = info["functions"]["main"]
    assert main["inputs"] == [{"name": "x", "shape": [1, 64], "dtype": "float32"}]
    assert main["outputs"] == [{"name": "probs", "shape": [1, 10], "dtype": "float32"}]
    assert info["targets"][0]["triple"].startswith("x86_64")
    names = {(a["codegen"], a["name"]) for a in info["artifacts"]}
    assert ("llvm", "kernels.o") in names and ("host", "host.c") in names
    assert all(a["size"] > 0 for a in info["artifacts"])
    # the weights are stored once, at least as many bytes as the model's initializers
    assert info["weight_bytes"] >= _initializer_bytes()


def test_text_report(built: Path) -> None:
    proc = run_kiln("inspect", "mlp.so", cwd=built)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "format:   kiln.library version" in out and "weights:" in out
    assert "input  x" in out and "(1, 64)" in out and "output probs" in out
    assert "kernels.o" in out and "(linked)" in out


def test_not_a_kiln_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "junk.so").write_bytes(b"hello world, not a library")
    line = one_line_error(run_kiln("inspect", "junk.so", cwd=tmp_path))
    assert "junk.so" in line and "not a kiln library" in line
    (tmp_path / "other.a").write_bytes(b"!<arch>\n")
    line = one_line_error(run_kiln("inspect", "other.a", cwd=tmp_path))
    assert "no kiln blob" in line
