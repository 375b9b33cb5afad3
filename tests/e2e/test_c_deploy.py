"""examples/c_deploy runs an exported library from plain C: on this machine (.so via
dlopen, .a linked statically) and, cross-built for aarch64, under qemu-aarch64."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.runtime.native import include_dir
from support.graphs import GraphBuilder, value_info
from support.reference import ort_session
from support.toolchains import needs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
IN_SHAPE, OUT_SHAPE = (1, 3, 16, 16), (1, 10)


def _cnn(path: Path) -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    fc = rng.standard_normal((10, 8)).astype(np.float32)
    b = GraphBuilder()
    b.node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    b.node("Relu", ["c"], ["r"])
    b.node("GlobalAveragePool", ["r"], ["p"])
    b.node("Flatten", ["p"], ["f"])
    b.node("Gemm", ["f", "fc"], ["y"], transB=1)
    b.consts({"w": w, "fc": fc})
    onnx.save(b.model([value_info("x", IN_SHAPE)], [value_info("y", OUT_SHAPE)], name="cnn"),
              path)


def _shape(s: tuple[int, ...]) -> str:
    return ",".join(map(str, s))


def _run(cmd: list[str], tmp: Path, x: np.ndarray) -> np.ndarray:
    (tmp / "in.bin").write_bytes(x.tobytes())
    out = tmp / "out.bin"
    out.unlink(missing_ok=True)
    proc = subprocess.run([*cmd, str(tmp / "in.bin"), _shape(IN_SHAPE), str(out),
                           _shape(OUT_SHAPE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.frombuffer(out.read_bytes(), np.float32).reshape(OUT_SHAPE)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    tmp = tmp_path_factory.mktemp("cnn")
    _cnn(tmp / "cnn.onnx")
    x = np.random.default_rng(3).standard_normal(IN_SHAPE).astype(np.float32)
    want = ort_session(tmp / "cnn.onnx").run(None, {"x": x})[0]
    return tmp / "cnn.onnx", x, want


def _compile(onnx_path: Path, target: str) -> kiln.driver.executable.Executable:
    return kiln.compile(kiln.frontend.from_onnx(str(onnx_path)), target)


def test_host_shared_and_static(tmp_path: Path, model: tuple[Path, np.ndarray, np.ndarray],
                                ) -> None:
    onnx_path, x, want = model
    ex = _compile(onnx_path, "llvm")
    so = ex.export_library(tmp_path / "cnn.so")
    exe = tmp_path / "deploy"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", f"-I{include_dir()}", str(EXAMPLE),
                    "-ldl", "-o", str(exe)], check=True)
    np.testing.assert_allclose(_run([str(exe), str(so), "kiln_"], tmp_path, x), want,
                               rtol=1e-4, atol=1e-5)
    a = ex.export_library(tmp_path / "cnn.a")
    static = tmp_path / "deploy_static"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", f"-I{include_dir()}",
                    "-DKILN_STATIC_ENTRY=kiln_main", "-DKILN_STATIC_ERROR=kiln__last_error",
                    str(EXAMPLE), str(a), "-lm", "-lpthread", "-o", str(static)], check=True)
    np.testing.assert_allclose(_run([str(static), "-", "-"], tmp_path, x), want,
                               rtol=1e-4, atol=1e-5)
    # A wrong shape is the library's clear error, from C.
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    proc = subprocess.run([str(exe), str(so), "kiln_", str(tmp_path / "in.bin"), "3,16,16,1",
                           str(tmp_path / "o.bin"), _shape(OUT_SHAPE)], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "main failed:" in proc.stderr and "shape" in proc.stderr


@needs("aarch64-linux-gnu-gcc", "qemu-aarch64", why="make test installs them")
def test_aarch64_under_qemu(tmp_path: Path, model: tuple[Path, np.ndarray, np.ndarray],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    onnx_path, x, want = model
    ex = _compile(onnx_path, "raspberry-pi/4b-aarch64")
    so = ex.export_library(tmp_path / "cnn.so")  # no cc given: the cross compiler
    a = ex.export_library(tmp_path / "cnn.a")
    qemu = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    exe = tmp_path / "deploy"
    subprocess.run(["aarch64-linux-gnu-gcc", f"-I{include_dir()}", str(EXAMPLE), "-ldl",
                    "-o", str(exe)], check=True)
    host = _run([*qemu, str(exe), str(so), "kiln_"], tmp_path, x)
    np.testing.assert_allclose(host, want, rtol=1e-4, atol=1e-5)
    static = tmp_path / "deploy_static"
    subprocess.run(["aarch64-linux-gnu-gcc", f"-I{include_dir()}",
                    "-DKILN_STATIC_ENTRY=kiln_main", "-DKILN_STATIC_ERROR=kiln__last_error",
                    str(EXAMPLE), str(a), "-lm", "-lpthread", "-o", str(static)], check=True)
    np.testing.assert_allclose(_run([*qemu, str(static), "-", "-"], tmp_path, x), want,
                               rtol=1e-4, atol=1e-5)
