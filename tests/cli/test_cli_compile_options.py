"""kiln compile --mlf, --mlf-source and --timings; kiln.compile takes an ONNX path or ModelProto."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from support.graphs import GraphBuilder


def _model(path: Path) -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Relu", ["x"], ["y"])
    b.input("x", [4])
    b.output("y", [4])
    model = b.model(ir_version=None)
    onnx.save(model, path)
    return model


def test_mlf_and_timings(tmp_path: Path) -> None:
    _model(tmp_path / "m.onnx")
    out = tmp_path / "m.tar"
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))  # a cold compile
    proc = subprocess.run([sys.executable, "-m", "kiln", "compile", str(tmp_path / "m.onnx"),
                           "-t", "c", "-o", str(out), "--mlf", "relu", "--mlf-source",
                           "--timings"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert "metadata.json" in names and "codegen/host/include/relu.h" in names
    assert "src/relu.py" in names  # --mlf-source: the DSL text (left out by default)
    assert "fuse-ops" in proc.stdout and "codegen" in proc.stdout  # the timing report


def test_compile_takes_onnx(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    x = np.array([-1, 2, -3, 4], np.float32)
    for source in (str(tmp_path / "m.onnx"), tmp_path / "m.onnx", model):
        np.testing.assert_array_equal(kiln.compile(source, "llvm")["main"](x), np.maximum(x, 0))
    with pytest.raises(kiln.CompileError, match="from_onnx"):
        kiln.compile(3.5, "llvm")
