"""The int8 dot-product kernels built for aarch64 (`sdot`, `usdot` with i8mm), exported
as a shared library with aarch64-linux-gnu-gcc and run under qemu-aarch64: a QDQ model
(onnxruntime's quantizer) of a 3x3 convolution, a strided 1x1 convolution and a matrix
product gives exactly onnxruntime's output on this host (x86-64): the same integers. With
`sdot` the 3x3 layer's channels tile writes its output as words of 4 channels, which the
1x1 layer reads in place (kiln.transform.quant_layout)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from quantized_models import quantize_static_model

import kiln
from kiln.runtime.native import include_dir
from kiln.script import print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs, onnxruntime_saturates
from support.toolchains import needs

pytest.importorskip("onnxruntime")

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
IN_SHAPE, OUT_SHAPE = (1, 8, 20, 20), (1, 10)
QEMU = ["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"]
AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod"


def _float_model() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    consts = {"w1": rng.standard_normal((16, 8, 3, 3)) * 0.2, "b1": rng.standard_normal(16) * 0.1,
              "w2": rng.standard_normal((16, 16, 1, 1)) * 0.3, "fc": rng.standard_normal(
                  (16 * 10 * 10, 10)) * 0.1}
    b = GraphBuilder()
    b.consts({k: np.asarray(v, np.float32) for k, v in consts.items()})
    b.node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1])
    b.node("Relu", ["c1"], ["r1"])
    b.node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2])
    b.node("Flatten", ["c2"], ["f"])
    b.node("MatMul", ["f", "fc"], ["y"])
    b.input("x", list(IN_SHAPE))
    b.output("y", list(OUT_SHAPE))
    return b.model(opset=13, name="int8_cnn")


@pytest.fixture(scope="module")
def quantized() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    model = quantize_static_model(_float_model(), "QDQ")
    x = np.random.default_rng(3).standard_normal(IN_SHAPE).astype(np.float32)
    return model, x, onnxruntime_outputs(model, {"x": x})[0]


def _run(exe: Path, so: Path, tmp: Path, x: np.ndarray) -> np.ndarray:
    (tmp / "in.bin").write_bytes(x.tobytes())
    out = tmp / "out.bin"
    shape = ",".join(map(str, IN_SHAPE)), ",".join(map(str, OUT_SHAPE))
    proc = subprocess.run([*QEMU, str(exe), str(so), "kiln_", str(tmp / "in.bin"), shape[0],
                           str(out), shape[1]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.frombuffer(out.read_bytes(), np.float32).reshape(OUT_SHAPE)


@needs("aarch64-linux-gnu-gcc", "qemu-aarch64", why="make test installs them")
@pytest.mark.parametrize("mattr", ["", ",+i8mm"], ids=["sdot", "usdot"])
def test_int8_conv_and_gemm_under_qemu_match(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mattr: str,
        quantized: tuple[onnx.ModelProto, np.ndarray, np.ndarray]) -> None:
    monkeypatch.delenv("CC", raising=False)
    model, x, want = quantized
    target = AARCH64 + mattr
    assert isa_for(Target(target)).int8_dot == ("i8mm" if mattr else "sdot")
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    so = ex.export_library(tmp_path / "int8.so")  # no cc given: the cross compiler
    asm = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(so)], capture_output=True,
                         text=True).stdout
    assert ("usdot" if mattr else "sdot") in asm
    assert ("out_words4" in print_module(ex.ir)) == (not mattr)
    exe = tmp_path / "deploy"
    subprocess.run(["aarch64-linux-gnu-gcc", f"-I{include_dir()}", str(DEPLOY), "-ldl", "-o",
                    str(exe)], check=True)
    if not onnxruntime_saturates():
        np.testing.assert_array_equal(_run(exe, so, tmp_path, x), want)
        return
    # this host's onnxruntime saturates its pairs (quantized_models.like_onnxruntime):
    # the exact build equals the host's exact build, the saturating one onnxruntime
    exact = np.asarray(kiln.compile(kiln.frontend.from_onnx(model), "llvm")["main"](x))
    np.testing.assert_array_equal(_run(exe, so, tmp_path, x), exact)
    ex = kiln.compile(kiln.frontend.from_onnx(model), like_onnxruntime(target))
    saturating = ex.export_library(tmp_path / "int8_saturating.so")
    np.testing.assert_array_equal(_run(exe, saturating, tmp_path, x), want)
