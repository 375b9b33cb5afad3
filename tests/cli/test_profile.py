"""Per-kernel profiling: `kiln compile --profile`, `kiln run --profile`, `Module.profile()`.

The CNN is compiled with timers on both native backends and run in fresh
processes; the table's kernels must be the lowered `main`'s CallFunc callees,
and their times must add up to the library-timed whole call.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kiln_cli import ROOT, one_line_error, run_kiln

import kiln
from kiln.ir.tensor import CallFunc
from kiln.ir.visitor import iter_stmts

CNN = ROOT / "models" / "tiny_cnn.onnx"
ROW = re.compile(r"^(\S+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%$")


def lowered_callees() -> list[str]:
    """The kernels the lowered graph `main` calls, in call order."""
    ex = kiln.compile(str(CNN), "llvm")
    return [s.func for s in iter_stmts(ex.ir["main"].body) if isinstance(s, CallFunc)]


def table(stdout: str) -> tuple[dict[str, tuple[int, float]], float, float]:
    """({kernel: (calls, total ms)}, kernels total ms, whole call ms) of a profile table."""
    kernels: dict[str, tuple[int, float]] = {}
    summed = whole = -1.0
    for line in stdout.splitlines()[stdout.splitlines().index(next(
            x for x in stdout.splitlines() if x.startswith("profile of main"))) + 2:]:
        if line.startswith("kernels total"):
            summed = float(line.split()[2])
        elif line.startswith("whole call"):
            whole = float(line.split()[3])
        else:
            m = ROW.match(line)
            assert m, line
            kernels[m.group(1)] = (int(m.group(2)), float(m.group(3)))
    return kernels, summed, whole


@pytest.mark.parametrize("backend", ["llvm", "c"])
def test_run_profile_sums_to_the_whole_call(tmp_path: Path, backend: str) -> None:
    done = run_kiln("compile", str(CNN), "-t", backend, "--profile", "-o", "cnn.so",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ran = run_kiln("run", "cnn.so", "--fill", "random", "--repeat", "30", "--warmup", "3",
                   "--profile", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    kernels, summed, whole = table(ran.stdout)
    assert list(kernels) == lowered_callees()
    shown = run_kiln("inspect", "cnn.so", cwd=tmp_path)
    assert f"profile:  {len(kernels) + 1} timer sites" in shown.stdout
    assert all(calls == 30 for calls, _ in kernels.values())
    assert summed == pytest.approx(sum(ms for _, ms in kernels.values()), abs=1e-3)
    assert 0.8 * whole <= summed <= 1.2 * whole, ran.stdout


@pytest.mark.parametrize("backend", ["llvm", "c"])
def test_python_profile_in_a_fresh_process(tmp_path: Path, backend: str) -> None:
    """profile() rows from Python; the whole call is timed in ns (a fraction of the wall
    time around the same calls, which adds Python's argument packing; a busy machine may
    stretch the wall time, hence the loose bound); reset zeroes."""
    lib = tmp_path / "cnn.so"
    kiln.compile(str(CNN), backend, profile=True).export_library(lib)
    script = textwrap.dedent(f"""
        import time, numpy as np
        from kiln.runtime import load_module
        lib = load_module({str(lib)!r})
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        lib["main"](x)
        lib.profile_reset()
        assert all(r.calls == 0 and r.total_ns == 0 for r in lib.profile())
        t0 = time.perf_counter_ns()
        for _ in range(200):
            lib["main"](x)
        wall = time.perf_counter_ns() - t0
        rows = lib.profile()
        whole = [r for r in rows if r.kernel is None]
        assert len(whole) == 1 and whole[0].calls == 200, rows
        # Nanoseconds: inside the wall time, and not 1000 times too small (microseconds).
        assert 0.01 * wall < whole[0].total_ns < wall, (whole, wall)
        print(",".join(r.kernel for r in rows if r.kernel))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split(",") == lowered_callees()


def test_no_timer_code_without_profile(built: Path) -> None:
    import ctypes

    lib = ctypes.CDLL(str(built / "mlp.so"))
    assert hasattr(lib, "kiln_main") and not hasattr(lib, "kiln__profile_read")
    for backend in ("llvm", "c"):
        ex = kiln.compile(str(CNN), backend)
        assert "profile" not in ex.metadata
        host = next(a for a in ex.artifacts if a.file_name == "host.c")
        assert not re.search(r"^#define KILN_HOST_PROFILE \d", bytes(host.content).decode(),
                             re.M)
        kernels = [a for a in ex.artifacts if a.codegen_id == backend]
        assert all(b"profile_start" not in bytes(a.content) for a in kernels)


def test_profiled_host_c_compiles_warning_free(tmp_path: Path) -> None:
    ex = kiln.compile(str(CNN), "c", profile=True)
    for name in ("host.c", "kernels.c"):
        art = next(a for a in ex.artifacts if a.file_name == name)
        (tmp_path / name).write_bytes(bytes(art.content))
        done = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-c",
                               name, "-o", name + ".o"], cwd=tmp_path, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr


def test_run_profile_without_timers_is_one_clear_line(built: Path) -> None:
    line = one_line_error(run_kiln("run", "mlp.so", "--fill", "random", "--profile",
                                   cwd=built))
    assert "built without profiling timers" in line and "--profile" in line


DEPLOY_C = r"""
#include <stdio.h>
#include <string.h>
#include "cnn.h"

int main(void) {
  static float image[1 * 3 * 16 * 16];
  static float logits[10];
  int64_t in_shape[4] = {1, 3, 16, 16}, out_shape[2] = {1, 10};
  DLTensor in = kiln_tensor(image, 4, in_shape, KILN_FLOAT32);
  DLTensor out = kiln_tensor(logits, 2, out_shape, KILN_FLOAT32);
  DLTensor *tensors[2] = {&in, &out};
  const char *function, *kernel;
  uint64_t calls, total_ns, kernels_ns = 0, whole_ns = 0;
  int32_t site;
  for (int i = 0; i < 5; ++i) {
    if (kiln_call_tensors(kiln_main, tensors, 2) != 0) {
      printf("error %s\n", kiln__last_error());
      return 1;
    }
  }
  for (site = 0; kiln__profile_read(site, &function, &kernel, &calls, &total_ns) == 0; ++site) {
    printf("%s %s %llu\n", function, kernel[0] ? kernel : "-", (unsigned long long)calls);
    if (kernel[0]) kernels_ns += total_ns; else whole_ns = total_ns;
  }
  kiln__profile_reset();
  kiln__profile_read(0, NULL, NULL, &calls, NULL);
  printf("sites %d kernels<=whole %d after-reset %llu\n", (int)site,
         kernels_ns <= whole_ns && kernels_ns > 0, (unsigned long long)calls);
  return 0;
}
"""


def test_profile_from_c_through_the_static_library_header(tmp_path: Path) -> None:
    """The .a's generated header declares the profiling accessors; a C program reads them."""
    from kiln.runtime import include_dir

    done = run_kiln("compile", str(CNN), "-t", "c", "--profile", "-o", "cnn.a", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "deploy.c").write_text(DEPLOY_C)
    header = (tmp_path / "cnn.h").read_text()
    link = re.search(r"Link with: (.*)", header)
    assert link and "kiln__profile_read(" in header
    built = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{include_dir()}",
                            "deploy.c", *link.group(1).split(), "-o", "deploy"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(["./deploy"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    callees = lowered_callees()
    assert lines[:-1] == [f"main {c} 5" for c in callees] + ["main - 5"]
    assert lines[-1] == f"sites {len(callees) + 1} kernels<=whole 1 after-reset 0"
