"""A model compiled for wasm32 (the web/wasm32 tag) runs under Node and matches the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_c_deploy import IN_SHAPE, OUT_SHAPE, _cnn

import kiln
from kiln.export.wasm import export_wasm
from support.reference import ort_session
from support.toolchains import needs

RUNNER = Path(__file__).resolve().parents[2] / "examples" / "wasm" / "run.mjs"


@needs("node", ("wasm-ld", "wasm-ld-14"), why="make test installs lld")
def test_wasm32_under_node_matches_host(tmp_path: Path) -> None:
    _cnn(tmp_path / "cnn.onnx")
    mod = kiln.frontend.from_onnx(str(tmp_path / "cnn.onnx"))
    x = np.random.default_rng(9).standard_normal(IN_SHAPE).astype(np.float32)
    host = kiln.compile(mod, "llvm")["main"](x)
    want = ort_session(tmp_path / "cnn.onnx").run(None, {"x": x})[0]
    wasm = export_wasm(kiln.compile(mod, "web/wasm32"), tmp_path / "cnn.wasm")
    assert wasm.read_bytes()[:4] == b"\0asm"
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    proc = subprocess.run(["node", str(RUNNER), str(wasm), "kiln_", str(tmp_path / "x.bin"),
                           str(tmp_path / "y.bin"), str(int(np.prod(OUT_SHAPE)))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(OUT_SHAPE)
    np.testing.assert_allclose(got, host, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_export_wasm_refuses_other_targets(tmp_path: Path) -> None:
    _cnn(tmp_path / "cnn.onnx")
    ex = kiln.compile(kiln.frontend.from_onnx(str(tmp_path / "cnn.onnx")), "llvm")
    with pytest.raises(kiln.ExportError, match="wasm32"):
        export_wasm(ex, tmp_path / "x.wasm")
