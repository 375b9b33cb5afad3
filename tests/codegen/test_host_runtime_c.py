"""kiln_host.c, the model-independent C of every host.c, is a real C file.

It ships next to kiln.h (package data) and must compile on its own, strictly,
in every configuration host.c uses it in: plain, with the thread pool, and with
the pool under KILN_NO_THREADS (firmware); alone as host.c's prelude object and
with kiln_host_entries.c as one translation unit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from c_helpers import CC, have_cc

from kiln.codegen.cfamily.helpers import DIM_RUNTIME_FILE, dim_runtime_source
from kiln.codegen.host import (
    HOST_RUNTIME_FILE,
    host_runtime_names,
    host_runtime_path,
    host_runtime_source,
)
from kiln.runtime import include_dir
from kiln.runtime.abi import ARGUMENT_ERROR, ERROR_BUFFER_SIZE
from kiln.runtime.threads import POOL_EXPORTS

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

CONFIGS = {
    "checks only": [],
    "thread pool": ["-DKILN_HOST_PARALLEL"],
    "pool without threads": ["-DKILN_HOST_PARALLEL", "-DKILN_NO_THREADS"],
    "no threads": ["-DKILN_NO_THREADS"],
    "profiling": ["-DKILN_HOST_PROFILE=3"],
    "profiling without threads": ["-DKILN_HOST_PROFILE=3", "-DKILN_NO_THREADS"],
    "workspace cache": ["-DKILN_WORKSPACE_ALLOC=kiln_workspace_alloc",
                        "-DKILN_WORKSPACE_FREE=kiln_workspace_free"],
    "swapping weights": ["-DKILN_HOST_SWAP", "-DKILN_SWAP_WEIGHTS=kiln_swap_weights",
                         "-DKILN_SWAP_WEIGHT=kiln_swap_weight",
                         "-DKILN_SWAP_PROGRAM=kiln_swap_program",
                         "-DKILN_SWAP_NAMES=kiln_swap_names", "-DKILN_SWAP_RUN=kiln_swap_run",
                         "-DKILN_SWAP_PAUSE=kiln_swap_pause",
                         "-DKILN_SWAP_RESUME=kiln_swap_resume"],
    "workspace from a firmware allocator": [
        "-DKILN_WORKSPACE_ALLOC=kiln_workspace_alloc", "-DKILN_WORKSPACE_FREE=kiln_workspace_free",
        "-DKILN_MALLOC=fw_malloc", "-DKILN_FREE=fw_free", "-DKILN_NO_THREADS"],
}
# kiln_swap.c's entries, the guard the interpreter calls (hidden), and the weak stand-ins
# of a library without a swap program.
SWAP_SYMBOLS = ["kiln_swap_names", "kiln_swap_pause", "kiln_swap_program", "kiln_swap_resume",
                "kiln_swap_run", "kiln_swap_weight", "kiln_swap_weights"]
PROFILE_SYMBOLS = ["kiln_profile_read", "kiln_profile_reset", "kiln_profile_start",
                   "kiln_profile_stop"]


def test_ships_next_to_kiln_h() -> None:
    path = host_runtime_path()
    assert path == Path(include_dir()) / "kiln" / HOST_RUNTIME_FILE
    assert path.is_file() and (path.parent / "kiln.h").is_file()
    # The constants Python documents are the ones the C file uses.
    text = host_runtime_source()
    assert f"#define KILN_HOST_ARGUMENT_ERROR ({ARGUMENT_ERROR})" in text
    assert f"#define KILN_HOST_ERROR_SIZE {ERROR_BUFFER_SIZE}" in text


# The helpers host.c's model part calls: hidden externs when kiln_host.c is compiled
# apart (KILN_HOST_PRELUDE_ONLY, kiln.runtime.native), static in one translation unit.
SHARED_HELPERS = sorted(f"kiln_host_{n}" for n in (
    "error", "fail", "tensor", "bind_dim", "dim_range", "shape_is", "dim_ok", "dim_nonzero",
    "int", "float", "terminate_flag", "cpu_ok"))


@pytest.mark.parametrize("std", ["-std=c11", "-std=c99"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_compiles_standalone_with_werror(config: str, std: str, tmp_path: Path) -> None:
    """As C11, kiln_host.c alone as kiln.runtime.native compiles host.c's prelude; as
    C99, with kiln_host_entries.c in one translation unit, as Model Library Format's
    host.c is built."""
    obj = tmp_path / "kiln_host.o"
    split = std == "-std=c11"
    source = tmp_path / "runtime.c"
    source.write_text("#include <kiln/kiln_host.c>\n#include <kiln/kiln_host_entries.c>\n")
    proc = subprocess.run(
        [CC, std, "-Wall", "-Wextra", "-Werror", "-pedantic", *CONFIGS[config], "-c",
         *(["-DKILN_HOST_PRELUDE_ONLY", str(host_runtime_path())] if split
           else [f"-I{include_dir()}", str(source)]), "-o", str(obj)],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True,
                             text=True, check=True).stdout.split()
    # Only the pool's entry and controls, the profiling timers and the CPU check are
    # global; every check helper is static (hidden when compiled apart).
    assert sorted(s for s in symbols if s.startswith("kiln_host_")) == (
        SHARED_HELPERS if split else [])
    assert ("kiln_parallel_for" in symbols) == ("-DKILN_HOST_PARALLEL" in CONFIGS[config])
    profiled = any(flag.startswith("-DKILN_HOST_PROFILE") for flag in CONFIGS[config])
    assert sorted(s for s in symbols if s.startswith("kiln_profile")) == (
        PROFILE_SYMBOLS if profiled else [])
    workspace = ["kiln_workspace_alloc", "kiln_workspace_free"]
    assert sorted(s for s in symbols if s in workspace) == (
        workspace if "-DKILN_WORKSPACE_ALLOC=kiln_workspace_alloc" in CONFIGS[config] else [])
    swap = "-DKILN_HOST_SWAP" in CONFIGS[config] and not split
    assert sorted(s for s in symbols if s.startswith("kiln_") and s != "kiln_parallel_for"
                  and not s.startswith(("kiln_profile", "kiln_host_"))
                  and s not in workspace) == sorted(
        ["kiln_cpu_missing", *(f"kiln_{name}" for name in POOL_EXPORTS),
         *(SWAP_SYMBOLS if swap else [])])


@pytest.mark.parametrize("std", ["-std=c11", "-std=c99"])
def test_kiln_dim_c_compiles_standalone_and_host_c_holds_its_text(std: str,
                                                                   tmp_path: Path) -> None:
    """kiln_dim.c (the checked arithmetic of dimension expressions) is a real C file of
    static inline helpers; host.c holds its text where kiln_host.c includes it."""
    path = Path(include_dir()) / "kiln" / DIM_RUNTIME_FILE
    proc = subprocess.run([CC, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", str(path),
                           "-o", str(tmp_path / "kiln_dim.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = host_runtime_source()
    assert f'#include "{DIM_RUNTIME_FILE}"' not in text
    assert dim_runtime_source() in text and "kiln_dim_mul" in host_runtime_names()


@pytest.mark.parametrize("std", ["-std=c11", "-std=c99"])
def test_the_swap_interpreter_compiles_standalone_with_werror(std: str, tmp_path: Path) -> None:
    """kiln_swap_run.c (`swap_runtime.c`, the swap program's interpreter) is a C file of
    its own: it defines only the hidden KILN_SWAP_RUN."""
    obj = tmp_path / "swap_runtime.o"
    path = host_runtime_path().parent / "kiln_swap_run.c"
    proc = subprocess.run(
        [CC, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2", "-fPIC",
         "-DKILN_SWAP_RUN=kiln_swap_run", "-DKILN_SWAP_PAUSE=kiln_swap_pause",
         "-DKILN_SWAP_RESUME=kiln_swap_resume", "-DKILN_SWAP_CONSTS=kiln_consts", "-c",
         str(path), "-o", str(obj)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True,
                             text=True, check=True).stdout.split()
    assert [s for s in symbols if s.startswith("kiln_")] == ["kiln_swap_run"]
