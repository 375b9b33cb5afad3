"""Model Library Format: a CNN exported for `c` builds with gcc -std=c11 -Wall -Werror
into a program that matches onnxruntime and calls neither malloc nor free; kiln.mlf.load
round-trips it; a Cortex-M4 build prints its size report."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import ExportError, FormatError
from kiln.export.mlf import MLF_VERSION
from support.graphs import GraphBuilder, value_info
from support.reference import ort_session
from support.toolchains import needs

IN_SHAPE, OUT_SHAPE = (1, 3, 16, 16), (1, 10)


def _cnn(path: Path) -> None:
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    fc = rng.standard_normal((10, 8)).astype(np.float32)
    b = GraphBuilder()
    b.node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1])
    b.node("Relu", ["c1"], ["r1"])
    b.node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2])
    b.node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1])
    b.node("Relu", ["c2"], ["r2"])
    b.node("GlobalAveragePool", ["r2"], ["g"])
    b.node("Flatten", ["g"], ["f"])
    b.node("Gemm", ["f", "fc"], ["y"], transB=1)
    b.consts({"w1": w1, "w2": w2, "fc": fc})
    onnx.save(b.model([value_info("x", IN_SHAPE)], [value_info("y", OUT_SHAPE)], name="cnn"),
              path)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    tmp = tmp_path_factory.mktemp("mlf")
    _cnn(tmp / "cnn.onnx")
    x = np.random.default_rng(5).standard_normal(IN_SHAPE).astype(np.float32)
    want = ort_session(tmp / "cnn.onnx").run(None, {"x": x})[0]
    return tmp / "cnn.onnx", x, want


MAIN_C = r"""
#include <stdio.h>
#include <stdint.h>
#include "cnn.h"
static _Alignas(64) uint8_t workspace[CNN_WORKSPACE_BYTES];
static float x[CNN_INPUT0_BYTES / 4], y[CNN_OUTPUT0_BYTES / 4];
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb");
  if (argc != 3 || !f || fread(x, 1, sizeof x, f) != sizeof x) return 2;
  fclose(f);
  if (cnn_run(x, y, workspace) != 0) { fprintf(stderr, "%s\n", kiln__last_error()); return 1; }
  f = fopen(argv[2], "wb");
  if (!f || fwrite(y, 1, sizeof y, f) != sizeof y) return 3;
  fclose(f);
  return 0;
}
"""


def _compile(onnx_path: Path, target: str) -> kiln.driver.executable.Executable:
    return kiln.compile(kiln.frontend.from_onnx(str(onnx_path)), target)


def _extract(archive: Path, into: Path) -> dict[str, object]:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return json.loads((into / "metadata.json").read_text())


def _objects(root: Path, meta: dict[str, object], cc: list[str], extra: list[str],
             out: Path) -> list[str]:
    build = meta["build"]
    assert isinstance(build, dict)
    includes = [f"-I{root / d}" for d in build["include_dirs"]]
    objs = [str(p) for p in (root / "codegen/host/lib").glob("*.o")]
    for member, flags in build["cflags"].items():
        obj = out / (member.replace("/", "_") + ".o")
        subprocess.run([*cc, *flags, "-std=c11", "-Wall", "-Werror", *extra, *includes, "-c",
                        str(root / member), "-o", str(obj)], check=True)
        objs.append(str(obj))
    return objs


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_mlf_builds_runs_and_matches(tmp_path: Path, cnn: tuple[Path, np.ndarray, np.ndarray],
                                     target: str) -> None:
    onnx_path, x, want = cnn
    ex = _compile(onnx_path, target)
    archive = kiln.export_model_library_format(ex, tmp_path / "cnn.tar", model_name="cnn")
    root = tmp_path / "tree"
    meta = _extract(archive, root)
    assert meta["version"] == MLF_VERSION and meta["model_name"] == "cnn"
    assert meta["inputs"] == [{"name": "x", "shape": list(IN_SHAPE), "dtype": "float32"}]
    mem = meta["memory"]["main"]  # type: ignore[index]
    params = (root / "parameters/cnn.params").read_bytes()
    assert mem["constants_bytes"] == len(params) > 0
    # each weight's place and SHA-256 (MLF version 4), recomputed from the file
    table = meta["parameters"]  # type: ignore[index]
    assert sorted(t["name"] for t in table) == ["fc", "w1", "w2"]
    for t in table:
        piece = params[t["offset"]:t["offset"] + t["bytes"]]
        assert len(piece) == t["bytes"] > 0
        assert t["sha256"] == hashlib.sha256(piece).hexdigest()
    assert mem["io_bytes"] == 4 * (int(np.prod(IN_SHAPE)) + int(np.prod(OUT_SHAPE)))
    assert not (root / "src").exists()  # the DSL source only on request (source=True)
    assert (root / "runtime/include/kiln/kiln.h").is_file()
    assert (root / ("codegen/host/src/kernels.c" if target == "c" else
                    "codegen/host/lib/kernels.o")).is_file()
    objs = _objects(root, meta, ["gcc"], [], tmp_path)
    (tmp_path / "main.c").write_text(MAIN_C)
    exe = tmp_path / "app"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", f"-I{root}/codegen/host/include",
                    f"-I{root}/runtime/include", str(tmp_path / "main.c"), *objs, "-lm",
                    "-o", str(exe)], check=True)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    subprocess.run([str(exe), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], check=True)
    got = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(OUT_SHAPE)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if target == "c":
        undefined = subprocess.run(["nm", "-u", *objs], capture_output=True, text=True,
                                   check=True).stdout.split()
        assert "malloc" not in undefined and "free" not in undefined, undefined
    model = kiln.mlf.load(archive)
    try:
        (y,) = model(x)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    finally:
        model.close()


def test_mlf_rejects_damage(tmp_path: Path, cnn: tuple[Path, np.ndarray, np.ndarray]) -> None:
    onnx_path, _, _ = cnn
    ex = _compile(onnx_path, "c")
    with pytest.raises(ExportError, match="model_name"):
        kiln.export_model_library_format(ex, tmp_path / "a.tar", model_name="bad name")
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../escape.c")
        tar.addfile(info)
    with pytest.raises(FormatError, match=r"member '../escape.c' contains '\.\.'"):
        kiln.mlf.load(evil)
    archive = kiln.export_model_library_format(ex, tmp_path / "cnn.tar", model_name="cnn")
    root = tmp_path / "t"
    meta = _extract(archive, root)
    meta["version"] = 99
    (root / "metadata.json").write_text(json.dumps(meta))
    newer = tmp_path / "newer.tar"
    with tarfile.open(newer, "w") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
    with pytest.raises(FormatError, match="version 99"):
        kiln.mlf.load(newer)


@needs("arm-none-eabi-gcc", why="make test installs gcc-arm-none-eabi")
def test_cortex_m4_size_report(tmp_path: Path, cnn: tuple[Path, np.ndarray, np.ndarray]) -> None:
    onnx_path, _, _ = cnn
    ex = _compile(onnx_path, "arm/cortex-m4")
    archive = kiln.export_model_library_format(ex, tmp_path / "cnn.tar", model_name="cnn")
    root = tmp_path / "tree"
    meta = _extract(archive, root)
    cc = ["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard",
          "-mfpu=fpv4-sp-d16", "-O2"]
    objs = _objects(root, meta, cc, ["-DCNN_STATIC_WORKSPACE"], tmp_path)
    report = subprocess.run(["arm-none-eabi-size", "-A", *objs], capture_output=True,
                            text=True, check=True).stdout
    print(report)  # the size report: text / rodata / bss per object
    sizes: dict[str, dict[str, int]] = {}
    current = ""
    for line in report.splitlines():
        if line.rstrip().endswith(":"):
            current = line.rstrip().rstrip(":").strip()
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(".") and parts[1].isdigit():
            sizes.setdefault(current, {})[parts[0]] = int(parts[1])
    total = {sec: sum(v.get(sec, 0) for v in sizes.values()) for sec in (".text", ".rodata",
                                                                         ".data", ".bss")}
    print("Cortex-M4 size report (bytes):", total)
    params = next(v for k, v in sizes.items() if "params" in k)
    consts = meta["memory"]["main"]["constants_bytes"]  # type: ignore[index]
    assert params.get(".rodata", 0) >= consts and params.get(".bss", 0) == 0
    iface = next(v for k, v in sizes.items() if "cnn_mlf" in k)
    assert iface.get(".bss", 0) >= meta["memory"]["main"]["workspace_bytes"]  # type: ignore[index]
