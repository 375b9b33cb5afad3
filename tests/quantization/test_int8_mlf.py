"""An int8 CNN exported as Model Library Format and linked into Cortex-M firmware.

A small MobileNet-like CNN (3x3, depthwise and 1x1 convolutions, ReLU6, a classifier),
quantized by onnxruntime (QDQ, per-channel int8 weights), and its float32 original are
exported for `arm/cortex-m4` and `arm/cortex-m55`, compiled with arm-none-eabi-gcc and
linked with a `main` calling `net_run` (`--gc-sections`, as firmware is linked); the size
report (.text/.rodata/.bss of the firmware) is printed. The int8 weights stay int8 in the
params object's .rodata, and the firmware's flash (.text + .rodata) is at most 0.3x the
float32 firmware's. The same kernels built for the host's C compiler (target `c`) equal
onnxruntime's integer outputs.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from quantized_models import integer_outputs, quantize_static_model

import kiln
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs
from support.toolchains import needs

FLAGS = ["-mthumb", "-mfloat-abi=hard", "-O2", "-std=c11", "-Wall", "-Werror",
         "-ffunction-sections", "-fdata-sections", "-DNET_STATIC_WORKSPACE"]
MAIN = """#include "net.h"
static float in0[NET_INPUT0_BYTES / 4];
static float out0[NET_OUTPUT0_BYTES / 4];
int main(void) { return (int)net_run(in0, out0, 0); }
"""
SIZE = 16  # input height and width


def small_cnn() -> onnx.ModelProto:
    """3x3 stem, a depthwise block (stride 2), a 3x3 convolution, a classifier: ~100k
    weights, so the weights (not the code) fill most of the float32 firmware."""
    b = GraphBuilder(seed=7)
    x = b.relu6(b.conv("x", 3, 32, 3))
    x = b.relu6(b.conv(b.relu6(b.conv(x, 32, 32, 3, stride=2, group=32)), 32, 64, 1))
    x = b.relu6(b.conv(x, 64, 128, 3, stride=2))
    x = b.relu6(b.conv(x, 128, 128, 1))
    x = b.op("Flatten", b.op("GlobalAveragePool", x))
    b.linear(x, 128, 10)  # its output renamed "y" below
    b.nodes[-1].output[0] = "y"
    return b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], 13,
                   "small_cnn")


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    float_model = small_cnn()
    return {"float32": float_model, "int8": quantize_static_model(float_model, "QDQ")}


def firmware(model: onnx.ModelProto, cpu: str, tmp: Path) -> tuple[dict[str, int], int, int]:
    """The linked firmware's section sizes, the params object's .rodata and the MLF
    constants' bytes of `model` built for `arm/<cpu>`."""
    ex = kiln.compile(from_onnx(model), f"arm/{cpu}")
    archive = kiln.export_model_library_format(ex, tmp / "net.tar", model_name="net")
    root = tmp / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    meta = json.loads((root / "metadata.json").read_text())
    includes = [f"-I{root / d}" for d in meta["build"]["include_dirs"]]
    (tmp / "main.c").write_text(MAIN)
    cc = ["arm-none-eabi-gcc", f"-mcpu={cpu}", *FLAGS]
    objs, params = [], 0
    for member, flags in {**meta["build"]["cflags"], "main.c": []}.items():
        src = root / member if member != "main.c" else tmp / "main.c"
        obj = tmp / (member.replace("/", "_") + ".o")
        subprocess.run([*cc, *flags, *includes, "-c", str(src), "-o", str(obj)], check=True)
        objs.append(str(obj))
        if "params" in member:
            params = _sizes(obj).get(".rodata", 0)
    elf = tmp / "firmware.elf"
    subprocess.run([*cc, "--specs=nosys.specs", "--specs=nano.specs", "-Wl,--gc-sections",
                    "-Wl,--no-warn-execstack", *objs, "-lm", "-o", str(elf)], check=True)
    return _sizes(elf), params, meta["memory"]["main"]["constants_bytes"]


def _sizes(path: Path) -> dict[str, int]:
    """`arm-none-eabi-size -A`: "<section> <size> <addr>" rows."""
    report = subprocess.run(["arm-none-eabi-size", "-A", str(path)], capture_output=True,
                            text=True, check=True).stdout
    rows = (line.split() for line in report.splitlines())
    return {r[0]: int(r[1]) for r in rows if len(r) >= 2 and r[1].isdigit()}


def _cpu_supported(cpu: str) -> bool:
    probe = subprocess.run(["arm-none-eabi-gcc", f"-mcpu={cpu}", "-mthumb", "-x", "c", "-c",
                            "-o", "/dev/null", "-"], input="int x;\n", capture_output=True,
                           text=True)
    return probe.returncode == 0


@needs("arm-none-eabi-gcc", "arm-none-eabi-size", why="make test installs gcc-arm-none-eabi")
@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
def test_int8_cnn_firmware_flash(models: dict[str, onnx.ModelProto], cpu: str,
                                 tmp_path: Path) -> None:
    if not _cpu_supported(cpu):
        pytest.skip(f"this arm-none-eabi-gcc does not accept -mcpu={cpu}")
    built = {}
    for name, model in models.items():
        (tmp_path / name).mkdir()
        built[name] = firmware(model, cpu, tmp_path / name)
        sizes = built[name][0]
        print(f"{cpu} {name} firmware: " + ", ".join(
            f"{s} {sizes.get(s, 0)}" for s in (".text", ".rodata", ".data", ".bss")))
    flash = {k: v[0][".text"] + v[0].get(".rodata", 0) for k, v in built.items()}
    print(f"{cpu} flash int8 / float32: {flash['int8'] / flash['float32']:.3f}")
    _, params, consts = built["int8"]
    # the weights are int8 constants in .rodata (never copied to RAM), a quarter of float32
    assert params >= consts and built["int8"][0].get(".data", 0) < 1024
    assert consts <= 0.3 * built["float32"][2], (consts, built["float32"][2])
    assert flash["int8"] <= 0.3 * flash["float32"], flash


def test_int8_cnn_c_kernels_equal_onnxruntime(models: dict[str, onnx.ModelProto]) -> None:
    # the C the firmware compiles, built for this host: onnxruntime's integer outputs
    model = integer_outputs(models["int8"])
    x = np.random.default_rng(1).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    got = kiln.compile(from_onnx(model), like_onnxruntime("c"))["main"](x)
    np.testing.assert_array_equal(got, onnxruntime_outputs(model, {"x": x})[0])
