"""The cuda code generator: a CNN and a 2-layer transformer encoder compiled for
`{"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}` give kernels.cu,
kernels.ptx and kernels.json (loader cuda) next to native host code; ptxas and nvcc
accept the device code; the library exports and loads without a GPU, and calling it
raises kiln's "no CUDA device" error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln.artifact import inspect_artifact
from kiln.errors import CallError, CompileError
from kiln.target import Target
from support.cuda_nets import NETS
from support.processes import child_env
from support.toolchains import needs

CUDA = Target({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}})


@pytest.fixture(scope="module", params=sorted(NETS))
def built(request: pytest.FixtureRequest) -> tuple[str, kiln.Executable]:
    model, _ = NETS[request.param]()
    return request.param, kiln.compile(model, CUDA)


def _device(arts: kiln.artifact.ArtifactSet, name: str) -> kiln.artifact.Artifact:
    """The cuda artifact `name` (its file name is prefixed with the device's target key)."""
    (art,) = [a for a in arts if a.codegen_id == "cuda" and a.file_name.endswith("_" + name)]
    assert isinstance(art, kiln.artifact.Artifact)
    assert art.target_key.startswith("cuda-") and art.file_name == f"{art.target_key}_{name}"
    return art


def _text(ex: kiln.Executable, name: str) -> str:
    return bytes(_device(ex.artifacts, name).content).decode()


def test_device_artifacts_and_native_host_code(built: tuple[str, kiln.Executable]) -> None:
    _, ex = built
    loaders = {a.key: a.loader for a in ex.artifacts}
    for name in ("kernels.cu", "kernels.ptx", "kernels.json"):
        assert _device(ex.artifacts, name).loader == "cuda"
    # The graph function is native host code; the kernels it calls are launch stubs.
    assert loaders[("llvm", "kernels.o")] == "native"
    assert loaders[("host", "host.c")] == "native"
    assert _device(ex.artifacts, "launch.c").loader == "native"
    # Host code carries no target key; every device artifact the same one.
    assert {a.target_key for a in ex.artifacts if a.codegen_id != "cuda"} == {""}
    assert len({a.target_key for a in ex.artifacts if a.codegen_id == "cuda"}) == 1
    assert '"target": ' in ex.ir.script()
    kinds = {n: f.attrs["target"] for n, f in ex.ir.items()}
    assert json.loads(kinds.pop("main"))["kind"] == "llvm"
    assert {json.loads(t)["kind"] for t in kinds.values()} == {"cuda"}


def test_function_table_names_every_entry(built: tuple[str, kiln.Executable]) -> None:
    _, ex = built
    table = json.loads(_text(ex, "kernels.json"))
    ptx, source = _text(ex, "kernels.ptx"), _text(ex, "kernels.cu")
    kernels = {n for n, f in ex.ir.items() if n != "main"}
    assert {k["name"] for k in table["kernels"]} == kernels
    for k in table["kernels"]:
        assert re.search(rf"\.entry {re.escape(k['entry'])}\(", ptx), k["entry"]
        assert f"__launch_bounds__({k['block'][0]}) {k['entry']}(" in source
        assert k["grid"][1:] == [1, 1] and 1 <= k["block"][0] <= 1024
        sig = ex.ir[k["name"]].params
        assert [p["name"] for p in k["params"]] == [p.name for p in sig]
        assert {p["access"] for p in k["params"] if p["kind"] == "buffer"} <= {
            "read", "write", "readwrite"}
    assert sum(k["grid"][0] * k["block"][0] for k in table["kernels"]) > 1000


@needs("ptxas", why="the CUDA toolkit")
def test_ptxas_assembles_the_ptx(built: tuple[str, kiln.Executable], tmp_path: Path) -> None:
    _, ex = built
    ptx = tmp_path / "kernels.ptx"
    ptx.write_text(_text(ex, "kernels.ptx"))
    proc = subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@needs("nvcc", why="the CUDA toolkit")
def test_nvcc_compiles_the_source(built: tuple[str, kiln.Executable], tmp_path: Path) -> None:
    _, ex = built
    source = tmp_path / "kernels.cu"
    source.write_text(_text(ex, "kernels.cu"))
    proc = subprocess.run(["nvcc", "-c", "-arch=sm_90", "-Werror", "all-warnings", str(source),
                           "-o", str(tmp_path / "kernels.o")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


def test_each_artifact_inspects_alone(built: tuple[str, kiln.Executable]) -> None:
    _, ex = built
    assert "__global__" in inspect_artifact(_device(ex.artifacts, "kernels.cu"))
    assert ".entry" in inspect_artifact(_device(ex.artifacts, "kernels.ptx"))
    assert '"kiln-cuda-functions"' in inspect_artifact(_device(ex.artifacts, "kernels.json"))


CALL = """
import sys, numpy as np, kiln
lib = kiln.runtime.load_module(sys.argv[1])
names = sorted(a.file_name.split("_", 1)[1] for a in lib.imports[0].artifacts)
print("cuda", lib.imports[0].kind, ",".join(names))
try:
    lib["main"](np.load(sys.argv[2]))
except kiln.CallError as exc:
    print("error", exc)
"""


def test_export_load_and_call_without_a_gpu(built: tuple[str, kiln.Executable],
                                            tmp_path: Path) -> None:
    name, ex = built
    _, feeds = NETS[name]()
    (x,) = feeds.values()
    with pytest.raises(CallError, match=r"^main: no CUDA device"):
        ex(x)
    path = tmp_path / "model.so"
    ex.export_library(path)
    import numpy as np

    np.save(tmp_path / "x.npy", x)
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", CALL, str(path), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "cuda cuda kernels.cu,kernels.json,kernels.ptx"
    assert lines[1].startswith("error main: no CUDA device")
    # The blob carries the device code and its target key: read back without loading.
    arts = kiln.artifact.load(path)
    assert _device(arts, "kernels.ptx") == _device(ex.artifacts, "kernels.ptx")


def test_inspect_show_prints_one_device_artifact(built: tuple[str, kiln.Executable],
                                                 tmp_path: Path) -> None:
    _, ex = built
    path = tmp_path / "model.so"
    ex.export_library(path)
    env = child_env()
    shown = f"cuda/{_device(ex.artifacts, 'kernels.ptx').file_name}"
    proc = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(path), "--show", shown],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ".entry" in proc.stdout and "__global__" not in proc.stdout


def test_cuda_needs_an_arch_and_a_gpu_schedule() -> None:
    model, _ = NETS["cnn"]()
    with pytest.raises(CompileError, match="needs an 'arch'"):
        kiln.compile(model, {"kind": "cuda", "host": "llvm"})
    with pytest.raises(CompileError, match="bind-gpu-threads"):
        kiln.compile(model, CUDA, tensor_pipeline="simplify")


def test_the_c_printer_follows_the_cuda_dialect() -> None:
    """kernels.cu is the C printer's output in CUDA_DIALECT: helpers are __device__
    functions, written buffers `__restrict__`; the default dialect prints kernels.c."""
    from kiln.codegen.c import emit_kernels
    from kiln.codegen.cfamily.helpers import DIM_HELPERS, Helpers
    from kiln.codegen.constants import ConstantPool
    from kiln.codegen.cuda.source import CUDA_DIALECT
    from kiln.ir import IRBuilder

    ib = IRBuilder()
    with ib.prim_func("halve"):
        x = ib.arg("X", (4,), "int32")
        y = ib.arg("Y", (4,), "int32")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], x[i] // 2)
    mod = ib.get()
    cuda, _ = emit_kernels(mod, prefix="k_", pool=ConstantPool(), dialect=CUDA_DIALECT)
    c, _ = emit_kernels(mod, prefix="k_", pool=ConstantPool())
    assert "static __device__ inline int32_t kiln_floordiv_i32(" in cuda
    assert "int32_t* __restrict__ Y" in cuda and "#define KILN_HIDDEN static __device__" in cuda
    assert "static inline int32_t kiln_floordiv_i32(" in c and "int32_t* restrict Y" in c
    assert c.startswith("/*\n * kernels.c -- ") and cuda.startswith("/*\n * kernels.cu -- ")
    dims = Helpers()
    dims.use(DIM_HELPERS)
    with pytest.raises(CompileError, match="cuda backend cannot size heap buffers"):
        dims.lines(CUDA_DIALECT)
