"""Model Library Format that fits: the weights go into the archive once, as binary
(`<model>.params`, assembled into .rodata by `<model>_params.S`), so the tar is about
the size of the weights; the model-independent allocator is a real C file
(kiln_mlf.c) that compiles alone with -Werror and, named per model through
KILN_MLF_PREFIX, lets two models link into one program."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_mlf import IN_SHAPE, OUT_SHAPE, _cnn, _compile, _extract, _objects

import kiln
from kiln.runtime.native import include_dir
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

STRICT = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
SRC = str(Path(kiln.__file__).resolve().parents[1])
# A dense layer with 4 MiB of float32 weights: big enough that text would show.
N_IN, N_OUT = 1024, 1024


def _dense(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A MatMul + Add model at `path`; (weights, bias)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N_IN, N_OUT)).astype(np.float32)
    b = rng.standard_normal(N_OUT).astype(np.float32)
    g = GraphBuilder()
    g.node("MatMul", ["x", "w"], ["h"])
    g.node("Add", ["h", "b"], ["y"])
    g.consts({"w": w, "b": b})
    g.input("x", [2, N_IN])
    g.output("y", [2, N_OUT])
    onnx.save(g.model(name="dense"), path)
    return w, b


def test_weights_are_binary_and_the_archive_fits(tmp_path: Path) -> None:
    w, b = _dense(tmp_path / "dense.onnx")
    weights = w.nbytes + b.nbytes
    ex = _compile(tmp_path / "dense.onnx", "c")
    archive = kiln.export_model_library_format(ex, tmp_path / "dense.tar", model_name="dense")
    size = archive.stat().st_size
    print(f"weights {weights} bytes, archive {size} bytes ({size / weights:.3f}x)")
    assert size <= 1.1 * weights + 512 * 1024, (size, weights)
    root = tmp_path / "tree"
    meta = _extract(archive, root)
    params = (root / "parameters/dense.params").read_bytes()
    assert len(params) == meta["memory"]["main"]["constants_bytes"]  # type: ignore[index]
    # the weights as float32 bytes (the kernels' packed layout), not as text
    values = np.frombuffer(params[:len(params) // 4 * 4], np.float32)
    assert np.isin(w, values).all() and np.isin(b, values).all()
    assert not list((root / "parameters").glob("*.c"))
    # assembled, the symbol holds exactly the .params bytes, 64-byte aligned, read-only
    obj = tmp_path / "params.o"
    subprocess.run(["gcc", *STRICT, f"-I{root / 'parameters'}", "-c",
                    str(root / "parameters/dense_params.S"), "-o", str(obj)], check=True)
    dumped = tmp_path / "rodata.bin"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.rodata", str(obj),
                    str(dumped)], check=True)
    assert dumped.read_bytes() == params
    headers = subprocess.run(["objdump", "-h", str(obj)], capture_output=True, text=True,
                             check=True).stdout
    rodata = next(line.split() for line in headers.splitlines() if " .rodata " in line)
    assert rodata[6] == "2**6"  # alignment
    symbols = subprocess.run(["nm", "-S", str(obj)], capture_output=True, text=True,
                             check=True).stdout
    assert f"{len(params):016x} R {ex.prefix}_consts" in symbols, symbols
    x = np.random.default_rng(1).standard_normal((2, N_IN)).astype(np.float32)
    want = onnxruntime_outputs(tmp_path / "dense.onnx", {"x": x})[0]
    model = kiln.mlf.load(archive)
    try:
        np.testing.assert_allclose(model(x)[0], want, rtol=1e-4, atol=1e-3)
    finally:
        model.close()


@pytest.mark.parametrize("cc", ["gcc", "arm-none-eabi-gcc"])
def test_allocator_compiles_alone(tmp_path: Path, cc: str) -> None:
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc} (make test installs gcc-arm-none-eabi)")
    source = Path(include_dir()) / "kiln" / "kiln_mlf.c"
    obj = tmp_path / "kiln_mlf.o"
    subprocess.run([cc, *STRICT, "-pedantic", "-DKILN_MLF_PREFIX=net", f"-I{include_dir()}",
                    "-c", str(source), "-o", str(obj)], check=True)
    defined = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True,
                             text=True, check=True).stdout.split()
    assert {"net_mlf_malloc", "net_mlf_free", "net_mlf_reset"} <= set(defined), defined
    # without a prefix it refuses to build, with a message saying what to define
    done = subprocess.run([cc, "-std=c11", f"-I{include_dir()}", "-c", str(source), "-o",
                           str(obj)], capture_output=True, text=True)
    assert done.returncode != 0 and "KILN_MLF_PREFIX" in done.stderr


TWO_MAIN_C = r"""
#include <stdio.h>
#include <stdint.h>
#include "first.h"
#include "second.h"
static float x[FIRST_INPUT0_BYTES / 4], y1[FIRST_OUTPUT0_BYTES / 4], y2[SECOND_OUTPUT0_BYTES / 4];
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb");
  if (argc != 3 || !f || fread(x, 1, sizeof x, f) != sizeof x) return 2;
  fclose(f);
  if (first_run(x, y1, NULL) != 0 || second_run(x, y2, NULL) != 0) return 1;
  f = fopen(argv[2], "wb");
  if (!f || fwrite(y1, 1, sizeof y1, f) != sizeof y1 || fwrite(y2, 1, sizeof y2, f) != sizeof y2)
    return 3;
  fclose(f);
  return 0;
}
"""


def test_two_models_link_into_one_program(tmp_path: Path) -> None:
    """Two archives (model names and prefixes differ) in one executable: each one's
    allocator, workspace and weights are its own, and both match onnxruntime."""
    _cnn(tmp_path / "cnn.onnx")
    mod = kiln.frontend.from_onnx(str(tmp_path / "cnn.onnx"))
    objs: list[str] = []
    includes: list[str] = []
    for name in ("first", "second"):
        ex = kiln.compile(mod, "c", system_lib_prefix=f"{name}_")
        archive = kiln.export_model_library_format(ex, tmp_path / f"{name}.tar",
                                                   model_name=name)
        root = tmp_path / name
        meta = _extract(archive, root)
        out = tmp_path / f"{name}_obj"
        out.mkdir()
        objs += _objects(root, meta, ["gcc"], [f"-D{name.upper()}_STATIC_WORKSPACE"], out)
        includes.append(f"-I{root / 'codegen/host/include'}")
    (tmp_path / "main.c").write_text(TWO_MAIN_C)
    exe = tmp_path / "app"
    subprocess.run(["gcc", *STRICT, *includes, str(tmp_path / "main.c"), *objs, "-lm", "-o",
                    str(exe)], check=True)
    x = np.random.default_rng(5).standard_normal(IN_SHAPE).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    subprocess.run([str(exe), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], check=True)
    got = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(2, *OUT_SHAPE)
    want = onnxruntime_outputs(tmp_path / "cnn.onnx", {"x": x})[0]
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], want, rtol=1e-4, atol=1e-5)


# Run in a fresh process where the compiler cannot be imported, as on a deploy host.
DEPLOY_HOST = r"""
import importlib.abc, sys
import numpy as np

COMPILER = ("ir", "script", "transform", "codegen", "ops", "frontend", "driver", "target",
            "export")

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if parts[0] in ("llvmlite", "onnx", "onnxruntime") or (
                parts[0] == "kiln" and len(parts) > 1 and parts[1] in COMPILER):
            raise ImportError(f"{name} is not on a deploy host")
        return None

sys.meta_path.insert(0, Blocked())
import kiln.mlf
from kiln.runtime.mlf import load
assert kiln.mlf.load is load
model = load(sys.argv[1])
(y,) = model(np.load(sys.argv[2]))
np.save(sys.argv[3], y)
model.close()
"""


def test_a_deploy_host_reads_an_archive_with_numpy_only(tmp_path: Path) -> None:
    """kiln.runtime.mlf (and its kiln.mlf alias) load and run an archive in a process
    where no compiler package, llvmlite or onnx can be imported."""
    _cnn(tmp_path / "cnn.onnx")
    archive = kiln.export_model_library_format(_compile(tmp_path / "cnn.onnx", "c"),
                                               tmp_path / "cnn.tar", model_name="cnn")
    x = np.random.default_rng(5).standard_normal(IN_SHAPE).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", DEPLOY_HOST, str(archive),
                           str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, env={**os.environ,
                                                               "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr
    want = onnxruntime_outputs(tmp_path / "cnn.onnx", {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)
