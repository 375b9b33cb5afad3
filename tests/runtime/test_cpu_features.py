"""A library compiled for CPU features this machine lacks is refused at load,
naming them, instead of dying with SIGILL at its first call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln.codegen.cpu_requirements import required_features
from kiln.ir import IRBuilder
from kiln.runtime.cpu_features import (
    checkable_features,
    cpuinfo_flags,
    machine_arch,
    missing_features,
)

pytestmark = pytest.mark.skipif(machine_arch() != "x86_64" or cpuinfo_flags() is None,
                                reason="needs Linux on x86-64 (/proc/cpuinfo flags)")


def test_missing_features_uses_linux_flag_names() -> None:
    flags = frozenset({"sse4_2", "avx2", "fma", "avx512_vnni", "pni"})
    need = ["sse3", "sse4.2", "avx2", "fma", "avx512vnni", "avx512f", "avx512fp16",
            "evex512", "rdseed"]  # the last two are not compared
    assert missing_features(need, "x86_64", flags) == ["avx512f", "avx512fp16"]
    assert missing_features(["sve2", "neon"], "aarch64", frozenset({"asimd", "fp"})) == ["sve2"]
    assert missing_features(["avx512f"], "riscv64", frozenset()) == []


def _target_this_machine_lacks() -> tuple[dict[str, object], list[str]]:
    """A target (by CPU name where one fits) needing features absent here."""
    triple = "x86_64-unknown-linux-gnu"
    for cpu in ("sapphirerapids", "graniterapids", "znver4", "icelake-server",
                "skylake-avx512", "haswell"):
        lacks = missing_features(required_features(triple, cpu, ""), "x86_64", cpuinfo_flags())
        if lacks:
            return {"kind": "llvm", "mtriple": triple, "mcpu": cpu}, lacks
    absent = sorted(checkable_features("x86_64") - {
        f for f in checkable_features("x86_64") if not missing_features([f], "x86_64",
                                                                          cpuinfo_flags())})
    assert absent, "this machine has every feature kiln checks"
    return {"kind": "llvm", "mtriple": triple, "mattr": [f"+{absent[0]}"]}, absent[:1]


def _module() -> kiln.ir.IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (64,), "float32")
        ib.ret(ib.emit(kiln.ops.call("relu", x), "y"))
    return ib.get()


def _library(tmp_path: Path, target: object, suffix: str) -> Path:
    return kiln.compile(_module(), target).export_library(tmp_path / f"m{suffix}")


_LOAD = ("import sys, numpy as np, kiln\n"
         "try:\n"
         "    m = kiln.runtime.load_module(sys.argv[1])\n"
         "except kiln.errors.KilnError as e:\n"
         "    print(type(e).__name__ + ':', e); sys.exit(3)\n"
         "print('loaded')\n")


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_foreign_features_refused_at_load(tmp_path: Path, suffix: str) -> None:
    target, lacks = _target_this_machine_lacks()
    lib = _library(tmp_path, target, suffix)
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(lib)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.startswith("CPUFeatureError:")
    assert all(f in proc.stdout for f in lacks), proc.stdout
    # The documented escape hatch loads it (nothing is called).
    env = dict(os.environ, KILN_SKIP_CPU_CHECK="1")
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(lib)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.stdout.strip() == "loaded", proc.stderr


def test_host_library_records_and_passes(tmp_path: Path) -> None:
    """Code for this host records its features (the vector units among them) and loads."""
    import numpy as np

    ex = kiln.compile(_module(), kiln.Target.from_host())
    kernels = next(a for a in ex.artifacts if a.file_name == "kernels.o")
    need = kernels.metadata["requires_features"]
    assert "sse2" in need and missing_features(need, "x86_64", cpuinfo_flags()) == []
    lib = kiln.runtime.load_module(ex.export_library(tmp_path / "m.so"))
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(lib["main"](x), np.maximum(x, 0))


def test_c_entry_checks_features_on_first_call(tmp_path: Path) -> None:
    """Plain C callers get the same protection: host.c checks the features on the first
    call of any entry (x86, GCC/clang builtins)."""
    import numpy as np

    from kiln.codegen.host import C_CHECKABLE_X86
    from kiln.runtime.native import include_dir

    ex = kiln.compile(_module(), {"kind": "llvm", "mcpu": "skylake-avx512"})
    host_c = bytes(next(a for a in ex.artifacts if a.file_name == "host.c").content).decode()
    assert 'X("avx512f")' in host_c and 'X("avx2")' in host_c
    absent = [f for f in C_CHECKABLE_X86 if missing_features([f], "x86_64", cpuinfo_flags())]
    if not absent:
        pytest.skip("this CPU has every feature the C entry check knows")
    lib = kiln.compile(_module(), {"kind": "llvm", "mattr": [f"+{absent[0]}"]}) \
        .export_library(tmp_path / "m.so")
    example = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
    exe = tmp_path / "deploy"
    subprocess.run(["cc", f"-I{include_dir()}", str(example), "-ldl", "-o", str(exe)],
                   check=True)
    (tmp_path / "in.bin").write_bytes(np.ones(64, np.float32).tobytes())
    proc = subprocess.run([str(exe), str(lib), "kiln_", str(tmp_path / "in.bin"), "64",
                           str(tmp_path / "out.bin"), "64"], capture_output=True, text=True)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert f"this CPU lacks the '{absent[0]}' feature" in proc.stderr
