"""`kiln inspect model.onnx`, `kiln compile -o model.wasm`, and the compile line naming
the real target (a tag, or the kind with its triple and CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kiln_cli import MODEL

from kiln.cli.main import main


def run_kiln(*args: str, cwd: Path, capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """`kiln ARGS` in this process (cheaper than a fresh one): code, stdout, stderr."""
    monkeypatch.chdir(cwd)
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _model_with_unknown_op(path: Path) -> Path:
    import onnx

    from support.graphs import GraphBuilder

    b = GraphBuilder()
    b.node("Frobnicate", ["x"], ["y"], domain="acme")
    b.node("Relu", ["x"], ["z"])
    b.input("x", ["batch", None])
    b.output("y")
    b.output("z", ["batch", 3])
    # No check: the checker refuses the unknown op this test inspects.
    onnx.save(b.model(opset={"": 17, "acme": 1}, ir_version=None, check=False), str(path))
    return path


def test_inspect_an_onnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    def kiln(*args: str) -> tuple[int, str, str]:
        return run_kiln(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)

    code, out, err = kiln("inspect", str(MODEL))
    assert code == 0, err
    assert "x: float32[1, 64]" in out and "probs: float32[1, 10]" in out
    assert "every op type is supported by kiln" in out

    odd = str(_model_with_unknown_op(tmp_path / "odd.onnx"))
    text = kiln("inspect", odd)[1]
    assert "opsets: ai.onnx 17, acme 1" in text
    assert "x: float32[batch, ?]" in text and "z: float32[batch, 3]" in text
    assert "y: float32 (shape unknown)" in text
    assert "not supported by kiln (1 op types" in text and "acme.Frobnicate x1" in text
    facts = json.loads(kiln("inspect", odd, "--format", "json")[1])
    assert facts["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", None]}]
    assert facts["ops"] == {"acme.Frobnicate": 1, "Relu": 1}
    assert list(facts["unsupported"]) == ["acme.Frobnicate"]
    # compiling it fails on the op inspect listed
    code, _, err = kiln("compile", odd, "-o", "odd.so")
    assert code == 2 and "acme.Frobnicate x1" in err
    code, _, err = kiln("inspect", odd, "--report", "r.html")
    assert code == 2 and "--report" in err and len(err.splitlines()) == 1


def test_compile_names_the_real_target(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln as kiln_api
    from kiln.target.describe import summarize

    def kiln(*args: str) -> tuple[int, str, str]:
        return run_kiln(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)

    code, out, err = kiln("compile", str(MODEL), "-t", "host", "-o", "mlp.tar")
    assert code == 0, err
    host = kiln_api.Target.from_host()
    assert out.startswith(f"compiled {MODEL} for {summarize(host)} -> mlp.tar")
    assert f"({host.get('mcpu')})" in out
    code, out, err = kiln("compile", str(MODEL), "-t", "raspberry-pi/4b-aarch64", "-o", "a.tar")
    assert code == 0, err
    assert "for raspberry-pi/4b-aarch64 -> a.tar" in out


@pytest.mark.skipif(shutil.which("wasm-ld") is None, reason="wasm-ld (lld) is not installed")
def test_compile_to_wasm(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    def kiln(*args: str) -> tuple[int, str, str]:
        return run_kiln(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)

    code, out, err = kiln("compile", str(MODEL), "-o", "mlp.wasm")
    assert code == 0, err
    assert " for web/wasm32 -> mlp.wasm" in out
    assert (tmp_path / "mlp.wasm").read_bytes()[:4] == b"\0asm"
    code, _, err = kiln("compile", str(MODEL), "-t", "c", "-o", "x.wasm")
    assert code == 2 and "wasm32" in err
