"""An int8 CNN exported as Model Library Format and built for a Cortex-M4.

The QDQ ResNet-18 test model (quantized by onnxruntime) and its float32 original are
exported for `arm/cortex-m4` and compiled with arm-none-eabi-gcc; the size report
(.text/.rodata/.bss) of both is printed. The int8 weights stay int8 in the params
object's .rodata: its constants are at most 0.3x the float32 build's.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import onnx
from quantized_models import quantize_static_model

import kiln
from support import small_models as builders
from support.toolchains import needs

CC = ["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard",
      "-mfpu=fpv4-sp-d16", "-O2", "-std=c11", "-Wall", "-Werror", "-DNET_STATIC_WORKSPACE"]


def _build(model: onnx.ModelProto, tmp: Path) -> tuple[dict[str, dict[str, int]], dict]:
    """Per-object section sizes of `model` built for a Cortex-M4, and the MLF metadata."""
    ex = kiln.compile(kiln.frontend.from_onnx(model), "arm/cortex-m4")
    archive = kiln.export_model_library_format(ex, tmp / "net.tar", model_name="net")
    root = tmp / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    meta = json.loads((root / "metadata.json").read_text())
    includes = [f"-I{root / d}" for d in meta["build"]["include_dirs"]]
    objs = []
    for member, flags in meta["build"]["cflags"].items():
        obj = tmp / (member.replace("/", "_") + ".o")
        subprocess.run([*CC, *flags, *includes, "-c", str(root / member), "-o", str(obj)],
                       check=True)
        objs.append(str(obj))
    report = subprocess.run(["arm-none-eabi-size", "-A", *objs], capture_output=True,
                            text=True, check=True).stdout
    # `size -A`: one block per object, "<file>  :" then "<section> <size> <addr>" rows
    sizes: dict[str, dict[str, int]] = {}
    for block in report.strip().split("\n\n"):
        head, *rows = block.strip().splitlines()
        fields = (row.split() for row in rows)
        sizes[head.split(":")[0].strip()] = {f[0]: int(f[1]) for f in fields
                                              if len(f) >= 2 and f[1].isdigit()}
    return sizes, meta


def _total(sizes: dict[str, dict[str, int]], section: str) -> int:
    return sum(v.get(section, 0) for v in sizes.values())


@needs("arm-none-eabi-gcc", why="make test installs gcc-arm-none-eabi")
def test_int8_cnn_mlf_for_cortex_m4(tmp_path: Path) -> None:
    float_model = builders.resnet18()
    int8_model = quantize_static_model(float_model, "QDQ")
    (tmp_path / "f").mkdir()
    (tmp_path / "q").mkdir()
    f_sizes, f_meta = _build(float_model, tmp_path / "f")
    q_sizes, q_meta = _build(int8_model, tmp_path / "q")
    for name, sizes in (("float32", f_sizes), ("int8", q_sizes)):
        print(f"Cortex-M4 {name}: " + ", ".join(f"{s} {_total(sizes, s)}" for s in
                                                  (".text", ".rodata", ".data", ".bss")))
    f_consts = f_meta["memory"]["main"]["constants_bytes"]
    q_consts = q_meta["memory"]["main"]["constants_bytes"]
    params = next(v for k, v in q_sizes.items() if "params" in k)
    # the weights are int8 in .rodata, never copied to RAM
    assert params.get(".rodata", 0) >= q_consts and params.get(".bss", 0) == 0
    assert q_consts <= 0.3 * f_consts, (q_consts, f_consts)
