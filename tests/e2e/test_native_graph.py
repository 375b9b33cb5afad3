"""A graph `main` (5 kernels, 2 embedded weights) compiled natively, run from Python and C."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact import Artifact, ArtifactSet
from kiln.driver import Executable
from kiln.errors import ExportError
from kiln.runtime import include_dir, load_artifacts, load_module
from support import ir_samples
from support.ir_samples import N
from support.processes import child_env

NATIVE_TARGETS = ["llvm", "c"]


@pytest.fixture(scope="module", params=NATIVE_TARGETS)
def native(request: pytest.FixtureRequest) -> Executable:
    return kiln.compile(ir_samples.chain_module(), request.param)


@pytest.fixture(scope="module")
def exported(native: Executable, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(f"lib-{native.target.kind.name}") / "chain.so"
    native.export_library(path)
    return path


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    # The same values the C program below computes.
    i = np.arange(N, dtype=np.float32)
    return (i * np.float32(0.25) - np.float32(1.0), np.float32(0.5) - i * np.float32(0.125))


def test_main_from_python(native: Executable) -> None:
    x, y = _inputs()
    want = ir_samples.chain_reference(x, y)
    np.testing.assert_allclose(native["main"](x, y), want, rtol=1e-6)
    np.testing.assert_allclose(native(x, y), want, rtol=1e-6)
    out = np.empty(N, np.float32)
    assert native["main"](x, y, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6)
    # Kernels stay callable by their own names.
    buf = np.empty(N, np.float32)
    native["add"](x, y, buf)
    np.testing.assert_array_equal(buf, x + y)
    assert native.metadata["workspace_bytes"] == {"main": 128}


def test_jit_loads_a_real_shared_library(native: Executable) -> None:
    mod = native.jit()
    assert mod.kind == "library"
    path = Path(mod.path)  # type: ignore[attr-defined]
    assert path.is_file() and path.suffix == ".so"
    with open("/proc/self/maps") as f:
        assert str(path) in f.read()
    assert native.jit() is mod


def test_jit_with_compiler_and_workspace(tmp_path: Path) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "c")
    mod = ex.jit(fcompile="gcc", workspace_dir=tmp_path / "ws")  # a string is the compiler
    path = Path(mod.path)  # type: ignore[attr-defined]
    assert path.is_relative_to(tmp_path / "ws") and path.is_file()
    x, y = _inputs()
    np.testing.assert_allclose(ex["main"](x, y), ir_samples.chain_reference(x, y), rtol=1e-6)
    assert ex.jit(force_recompile=True) is not mod


def test_main_from_a_c_program(exported: Path, tmp_path: Path) -> None:
    source = tmp_path / "main.c"
    source.write_text(textwrap.dedent(r"""
        #include <dlfcn.h>
        #include <stdio.h>
        #include <string.h>
        #include <kiln/kiln.h>

        int main(int argc, char **argv) {
          if (argc != 2) return 2;
          void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
          if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
          KilnPackedFunc f = (KilnPackedFunc)dlsym(lib, "kiln_main");
          KilnStringFunc err = (KilnStringFunc)dlsym(lib, "kiln__last_error");
          if (!f || !err) { fprintf(stderr, "dlsym failed\n"); return 4; }
          float x[8], y[8], out[8];
          int64_t shape[1] = {8};
          for (int i = 0; i < 8; ++i) {
            x[i] = (float)i * 0.25f - 1.0f;
            y[i] = 0.5f - (float)i * 0.125f;
            out[i] = -12345.0f;
          }
          DLTensor tx = kiln_tensor(x, 1, shape, KILN_FLOAT32);
          DLTensor ty = kiln_tensor(y, 1, shape, KILN_FLOAT32);
          DLTensor to = kiln_tensor(out, 1, shape, KILN_FLOAT32);
          KilnValue args[3];
          int32_t codes[3];
          kiln_set_tensor(args, codes, 0, &tx);
          kiln_set_tensor(args, codes, 1, &ty);
          kiln_set_tensor(args, codes, 2, &to);
          if (f(args, codes, 3) != 0) { fprintf(stderr, "call: %s\n", err()); return 5; }
          for (int i = 0; i < 8; ++i) printf("%.9g\n", out[i]);
          /* A wrong call reports an error instead of crashing. */
          if (f(args, codes, 2) == 0) return 6;
          printf("error: %s\n", err());
          return 0;
        }
    """))
    exe = tmp_path / "main"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}",
                    str(source), "-o", str(exe), "-ldl"], check=True, capture_output=True,
                   text=True)
    proc = subprocess.run([str(exe), str(exported)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    got = np.array([float(v) for v in lines[:N]], dtype=np.float32)
    np.testing.assert_allclose(got, ir_samples.chain_reference(*_inputs()), rtol=1e-6)
    assert lines[N] == "error: main: expected 3 arguments, got 2"


BAD_ARGS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from kiln.errors import KilnError
    from kiln.runtime import load_module

    main = load_module(sys.argv[1])["main"]
    x = np.zeros(8, np.float32)
    cases = {
        "count": lambda: main(x, x, x),
        "dtype": lambda: main(x, x.astype(np.float64)),
        "shape": lambda: main(np.zeros(9, np.float32), x),
        "layout": lambda: main(x, x, out=np.zeros(16, np.float32)[::2]),
        "kind": lambda: main(x, 3.0),
    }
    for name, call in cases.items():
        try:
            call()
        except KilnError as exc:
            print(name, "|", exc)
        else:
            print(name, "| no error")
""")


def test_bad_arguments_raise_kiln_error_in_a_fresh_process(exported: Path) -> None:
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", BAD_ARGS_SCRIPT, str(exported)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert got["count"] == "main: expected 2 arguments, got 3"
    assert got["dtype"] == "main: argument 1 'y': expected dtype float32, got float64"
    assert got["shape"] == "main: argument 0 'x': expected shape [8], got [9]"
    # A strided input is copied; a strided buffer the function writes is refused.
    assert got["layout"] == "main: argument 2 'out0': expected a contiguous tensor"
    assert got["kind"].startswith("main: argument 1 'y': expected a tensor")


def test_exported_tar_loads_back(native: Executable, tmp_path: Path) -> None:
    path = tmp_path / "chain.tar"
    native.export_library(path)
    lib = load_module(path)
    x, y = _inputs()
    np.testing.assert_allclose(lib["main"](x, y), ir_samples.chain_reference(x, y), rtol=1e-6)


def test_python_backend_cannot_be_exported(tmp_path: Path) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "python")
    with pytest.raises(ExportError, match="cannot be exported"):
        ex.export_library(tmp_path / "x.so")


def test_llvmjit_bitcode_saved_and_reloaded(tmp_path: Path) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "llvmjit")
    x, y = _inputs()
    first = ex["main"](x, y)
    np.testing.assert_allclose(first, ir_samples.chain_reference(x, y), rtol=1e-6)
    arts = list(ex.artifacts)
    assert {a.loader for a in arts} == {"llvmjit"}
    assert any(a.file_name.endswith(".bc") for a in arts)
    # Save every artifact's bytes, read them back as fresh Artifacts, load through
    # the llvmjit loader again: the same results.
    saved = []
    for a in arts:
        path = tmp_path / f"{a.codegen_id}__{a.file_name}"
        path.write_bytes(bytes(a.content))  # weights may be Segments
        saved.append((a, path))
    reloaded = ArtifactSet(Artifact(a.codegen_id, a.loader, a.file_name, p.read_bytes(),
                                    dict(a.metadata)) for a, p in saved)
    mod = load_artifacts(reloaded, metadata=ex.metadata, prefix=ex.prefix)
    np.testing.assert_array_equal(mod["main"](x, y), first)
    assert mod.get_function("square") is not None
