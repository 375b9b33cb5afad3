"""A greedy-decode loop with an if, scripted with torch.jit.script and exported by the
TorchScript exporter (`torch.onnx.export(..., dynamo=False)`): an ONNX Loop whose trip
count is an input and whose body holds an If. kiln against onnxruntime and torch, on llvm
and c, exported and loaded in a fresh process."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from support.reference import ort_session

torch = pytest.importorskip("torch", reason="torch is not installed (kiln-tensor[torch])")

RUNNER = """
import sys
import numpy as np
from kiln.runtime import load_module
feeds = np.load(sys.argv[2])
total, tok = load_module(sys.argv[1])["main"](feeds["h"], feeds["n"])
np.savez(sys.argv[3], total=total, tok=tok)
"""


class Decode(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(11, 6, generator=gen))
        self.u = torch.nn.Parameter(torch.randn(6, 6, generator=gen) * 0.5)
        self.out = torch.nn.Parameter(torch.randn(6, 11, generator=gen))

    def forward(self, h: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tok = torch.zeros((), dtype=torch.long)
        total = torch.zeros(6)
        for _ in range(int(n)):
            h = torch.tanh(self.emb[tok] + h @ self.u)
            tok = torch.argmax(h @ self.out)
            if bool(tok % 2 == 0):
                total = total + h
            else:
                total = total - h
        return total, tok


@pytest.fixture(scope="module")
def exported() -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # torch deprecates torch.jit.script and the TorchScript exporter; both still work
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.script(Decode())
        torch.onnx.export(module, (torch.zeros(6), torch.tensor(3)), buf, dynamo=False,
                          input_names=["h", "n"], output_names=["total", "tok"],
                          opset_version=17)
    model = onnx.load_from_string(buf.getvalue())
    assert any(node.op_type == "Loop" for node in model.graph.node)
    return model


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_scripted_decode_loop_matches_onnxruntime_and_torch(exported, target: str,
                                                            tmp_path: Path) -> None:
    sess = ort_session(exported)
    exe = kiln.compile(from_onnx(exported), target)
    module = Decode()
    rng = np.random.default_rng(3)
    for steps in (0, 1, 7):
        h = rng.normal(0, 1, 6).astype(np.float32)
        n = np.array(steps, np.int64)
        ref = sess.run(None, {"h": h, "n": n})
        with torch.no_grad():
            eager = [v.numpy() for v in module(torch.from_numpy(h), torch.from_numpy(n))]
        for got in (exe["main"](h, n), ref):
            for a, b in zip(got, eager):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    exe.export_library(tmp_path / "decode.so")
    h = rng.normal(0, 1, 6).astype(np.float32)
    n = np.array(5, np.int64)
    np.savez(tmp_path / "feeds.npz", h=h, n=n)
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "decode.so"),
                           str(tmp_path / "feeds.npz"), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = np.load(tmp_path / "out.npz")
    ref = sess.run(None, {"h": h, "n": n})
    np.testing.assert_allclose(out["total"], ref[0], rtol=1e-4, atol=1e-5)
    assert out["tok"] == ref[1]
