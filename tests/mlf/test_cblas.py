"""`libs: ["cblas"]`: float32 matrix products call cblas_sgemm, recorded as the external
dependency `cblas`, linked at export, and match the default kernels."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from support.graphs import GraphBuilder
from support.reference import ort_session

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "echo 'int main(void){return 0;}' | cc -x c - -lopenblas "
                    "-o /dev/null"], capture_output=True).returncode != 0,
    reason="needs libopenblas-dev (make test installs it)")


def _model(path: Path) -> None:
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((32, 24)).astype(np.float32)
    w2 = rng.standard_normal((5, 24)).astype(np.float32)
    b2 = rng.standard_normal((5,)).astype(np.float32)
    b = GraphBuilder()
    b.node("MatMul", ["x", "w1"], ["h"])        # [2, 3, 32] @ [32, 24]
    b.node("Relu", ["h"], ["r"])
    b.node("Reshape", ["r", "shape"], ["r2"])
    b.node("Gemm", ["r2", "w2", "b2"], ["y"], transB=1)
    b.consts({"w1": w1, "w2": w2, "b2": b2, "shape": np.array([6, 24], np.int64)})
    b.input("x", [2, 3, 32])
    b.output("y", [6, 5])
    onnx.save(b.model(name="mlp"), path)


CBLAS = {"short_name": "cblas", "url": "https://www.openblas.net", "url_type": "url",
         "version_spec": ">=0.3"}


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_cblas_matches_and_is_recorded(tmp_path: Path, kind: str) -> None:
    _model(tmp_path / "m.onnx")
    x = np.random.default_rng(4).standard_normal((2, 3, 32)).astype(np.float32)
    want = ort_session(tmp_path / "m.onnx").run(None, {"x": x})[0]
    mod = kiln.frontend.from_onnx(str(tmp_path / "m.onnx"))
    ex = kiln.compile(mod, {"kind": kind, "libs": ["cblas"]})
    assert ex.ir.script().count("cblas_matmul") >= 2 or "cblas_sgemm" in ex.ir.script()
    assert ex.metadata["external_dependencies"] == [CBLAS]
    default = kiln.compile(mod, kind)["main"](x)
    lib = ex.export_library(tmp_path / "m.so")
    code = ("import sys, numpy as np, kiln; m = kiln.runtime.load_module(sys.argv[1]); "
            "x = np.load(sys.argv[2]); np.save(sys.argv[3], m['main'](x)); "
            "print(m.metadata['external_dependencies'][0]['short_name'])")
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-c", code, str(lib), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cblas"
    got = np.load(tmp_path / "y.npy")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, default, rtol=1e-4, atol=1e-4)
    shown = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(lib)],
                           capture_output=True, text=True, check=True).stdout
    assert "depends:  cblas >=0.3 (url: https://www.openblas.net)" in shown
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "libopenblas" in needed
    archive = kiln.export_model_library_format(ex, tmp_path / "m.tar", model_name="mlp")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("metadata.json")
        assert member is not None
        meta = json.loads(member.read())
    assert meta["external_dependencies"] == [CBLAS]
