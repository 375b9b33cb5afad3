"""Parallel loops on the library's thread pool, through the `llvm`, `c` and `llvmjit` backends.

One module holds a kernel per feature of the outlining (captured scalars of
several dtypes, an int32 loop with a non-zero start, constants, heap and stack
workspaces inside and outside the loop, nested parallel loops, a parallel body
calling a kernel that has its own parallel loop, a loop capturing nothing, an
allocation failure inside a loop body). Every result is compared with the IR
interpreter, and results with 1 and 2 threads must be identical bit for bit:
in this process (jit), in fresh processes loading an exported `.so` with
`KILN_NUM_THREADS=1` and `=2`, and from a C program with no Python. A forked
child, and a library unloaded with `dlclose`, must not hang (timeouts).
No timing is asserted anywhere: bench/models.py measures speed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_helpers import WARNINGS, build, have_cc

import kiln
from kiln import evaluate, ops
from kiln.codegen.c import codegen_c
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm import codegen_llvm
from kiln.driver import Executable
from kiln.errors import CompileError, KilnError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.tensor import Cast, Const, For, PrimFunc, Var, select
from kiln.ir.visitor import iter_stmts
from kiln.runtime import include_dir, load_module
from kiln.target import Target
from kiln.transform import PassContext
from kiln.transform.outline import OutlineParallelLoops, outline_parallel_loops
from support.processes import child_env

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

N, M = 37, 24  # rows do not split evenly into chunks
HUGE = 1 << 60  # float32 elements: malloc returns NULL
NATIVE = ["llvm", "c"]
TIMEOUT = 120


# ====================================================================== the module


def outlined_feature_module() -> IRModule:
    """`feature_module` as kiln.compile hands it to a backend: parallel loops outlined."""
    return OutlineParallelLoops()(feature_module())


def parallel_loops(fn: PrimFunc) -> list[For]:
    return [s for s in iter_stmts(fn.body) if isinstance(s, For) and s.kind == "parallel"]


def feature_module() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("scaled"):
        # Captured scalars of several dtypes; an int32 loop starting at 1.
        x = ib.arg("X", (N, M), "float32")
        y = ib.arg("Y", (N, M), "float32")
        a = ib.scalar_arg("a", "float32")
        h = ib.scalar_arg("h", "float16")
        s = ib.scalar_arg("s", "int8")
        flag = ib.scalar_arg("flag", "bool")
        i = Var("i", "int32")
        with ib.for_range(Const(1, "int32"), extent=Const(N - 1, "int32"), var=i,
                          kind="parallel"), ib.for_range(M, name="j") as j:
            row = Cast("int64", i)
            v = x[row, j] * a + Cast("float32", h) + Cast("float32", s)
            ib.store(y, [row, j], select(flag, v, -v))
    with ib.prim_func("workspaces"):
        # A constant and a heap workspace made outside the loop; a heap row and a
        # stack accumulator per iteration inside it.
        x = ib.arg("X", (N, M), "float32")
        y = ib.arg("Y", (N, M), "float32")
        weights = np.linspace(-1, 1, M, dtype=np.float32)
        with ib.alloc_const("w", weights) as w, \
                ib.allocate("outer", (N, M), "float32", "global") as outer:
            with ib.for_range(N, name="i") as i, ib.for_range(M, name="j") as j:
                ib.store(outer, [i, j], x[i, j] * 2.0)
            with ib.for_range(N, name="i", kind="parallel") as i, \
                    ib.allocate("row", (M,), "float32", "global") as row, \
                    ib.allocate("acc", (1,), "float32", "local") as acc:
                ib.store(acc, [0], 0.0)
                with ib.for_range(M, name="j") as j:
                    ib.store(row, [j], outer[i, j] + w[j])
                    ib.store(acc, [0], acc[0] + row[j])
                with ib.for_range(M, name="j") as j:
                    ib.store(y, [i, j], row[j] - acc[0] / float(M))
    with ib.prim_func("square_row"):
        # Called from a parallel body: its own parallel loop then runs serially.
        x = ib.arg("X", (N, M), "float32")
        z = ib.arg("Z", (N, M), "float32")
        r = ib.scalar_arg("r")
        with ib.for_range(M, name="j", kind="parallel") as j:
            ib.store(z, [r, j], x[r, j] * x[r, j])
    with ib.prim_func("nested"):
        x = ib.arg("X", (N, M), "float32")
        y = ib.arg("Y", (N, M), "float32")
        z = ib.arg("Z", (N, M), "float32")
        with ib.for_range(N, name="i", kind="parallel") as i, \
                ib.for_range(M, name="j", kind="parallel") as j:
            ib.store(y, [i, j], x[i, j] + 1.0)
        with ib.for_range(N, name="i", kind="parallel") as i:
            ib.call_func("square_row", [x, z, i])
        with ib.for_range(3, name="t") as t, ib.for_range(M, name="j", kind="parallel") as j:
            ib.store(y, [t, j], y[t, j] + Cast("float32", t))
    with ib.prim_func("no_captures"):
        y = ib.arg("Y", (1,), "int32")
        with ib.for_range(64, name="i", kind="parallel") as i, \
                ib.allocate("tmp", (1,), "int64", "local") as tmp:
            ib.store(tmp, [0], i * 2)
        ib.store(y, [0], 7)
    with ib.prim_func("oom"):
        # Fails inside the parallel body; the indices come from the inputs so the
        # compiler cannot drop the allocation.
        x = ib.arg("X", (8,), "int64")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="i", kind="parallel") as i, \
                ib.allocate("huge", (HUGE,), "float32", "global") as huge:
            ib.store(huge, [x[i]], 1.0)
            ib.store(y, [i], huge[x[(i + 1) % 8]])
    return ib.get()


def inputs() -> dict[str, list[Any]]:
    rng = np.random.default_rng(7)

    def mat() -> np.ndarray:
        return rng.standard_normal((N, M)).astype(np.float32)

    return {
        "scaled": [mat(), np.zeros((N, M), np.float32), 1.5, 0.25, -3, True],
        "workspaces": [mat(), np.zeros((N, M), np.float32)],
        "nested": [mat(), np.zeros((N, M), np.float32), np.zeros((N, M), np.float32)],
        "no_captures": [np.zeros(1, np.int32)],
    }


def interpreted() -> dict[str, list[Any]]:
    mod = feature_module()
    out = {}
    for name, args in inputs().items():
        evaluate(mod, name, *args)
        out[name] = args
    return out


def run(lib: Any, name: str, args: list[Any]) -> list[Any]:
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    lib[name](*args)
    return args


def assert_matches(got: dict[str, list[Any]], want: dict[str, list[Any]],
                   *, exact: bool = False) -> None:
    for name, expected in want.items():
        for k, (a, b) in enumerate(zip(got[name], expected)):
            if not isinstance(b, np.ndarray):
                continue
            if exact:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} argument {k}")
            else:
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6,
                                           err_msg=f"{name} argument {k}")


def compile_features(target: str) -> Executable:
    with PassContext(config={"kiln.cache": False}):
        return kiln.compile(feature_module(), target, graph_pipeline=None,
                            tensor_pipeline=None)


@pytest.fixture(scope="module")
def reference() -> dict[str, list[Any]]:
    return interpreted()


@pytest.fixture(scope="module", params=NATIVE)
def native(request: pytest.FixtureRequest) -> Executable:
    return compile_features(request.param)


@pytest.fixture(scope="module")
def exported(native: Executable, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(f"parallel-{native.target.kind.name}") / "features.so"
    native.export_library(path)
    return path


# ====================================================================== generated code


def test_outlining_turns_each_outer_parallel_loop_into_a_launch() -> None:
    outlined = outline_parallel_loops(feature_module())
    bodies = sorted(outlined.bodies)
    assert bodies == ["nested_parallel0", "nested_parallel1", "nested_parallel2",
                      "no_captures_parallel0", "oom_parallel0", "scaled_parallel0",
                      "square_row_parallel0", "workspaces_parallel0"]
    body = outlined.mod["workspaces_parallel0"]
    assert isinstance(body, PrimFunc)
    captured = [p.name for p in body.params]
    assert captured == ["begin", "end", "outer", "w", "Y"]  # row and acc stay inside
    # A nested parallel loop runs serially inside its outer loop's body.
    inner = outlined.mod["nested_parallel0"]
    assert isinstance(inner, PrimFunc) and not parallel_loops(inner)
    assert not any(parallel_loops(fn) for fn in outlined.mod.prim_funcs().values())


def test_outlining_is_a_pass_whose_result_prints_parses_and_runs(
        reference: dict[str, list[Any]]) -> None:
    from kiln.ir import assert_structural_equal
    from kiln.ir.verify import verify
    from kiln.script import from_source, print_module
    from kiln.transform import get_pass

    outlined = get_pass("outline-parallel-loops")(feature_module())
    verify(outlined)
    assert "scaled_parallel0" in outlined.functions
    assert_structural_equal(from_source(print_module(outlined)), outlined)
    assert OutlineParallelLoops()(outlined) is outlined  # outlined already: as is
    got = {}
    for name, args in inputs().items():
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        evaluate(outlined, name, *args)
        got[name] = args
    assert_matches(got, reference, exact=True)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_backends_take_outlined_parallel_loops_only(target: str) -> None:
    codegen = codegen_c if target == "c" else codegen_llvm
    with pytest.raises(CompileError, match=r"codegen of 'scaled': parallel loop 'i' was not "
                                           r"outlined; run the pass 'outline-parallel-loops'"):
        codegen(feature_module(), Target(target), prefix="kiln_", pool=ConstantPool())


def test_a_tensor_pipeline_may_outline_itself() -> None:
    """kiln.compile outlines for the c backend unless the pipeline did: same library,
    and the loop bodies are no functions of it."""
    def build(pipeline: str | None) -> Executable:
        with PassContext(config={"kiln.cache": False}):
            return kiln.compile(feature_module(), "c", graph_pipeline=None,
                                tensor_pipeline=pipeline)

    by_driver, by_pipeline = build(None), build("outline-parallel-loops")
    assert "scaled_parallel0" not in by_driver.ir.functions  # the module before outlining
    assert "scaled_parallel0" in by_pipeline.ir.functions
    assert by_driver.metadata == by_pipeline.metadata
    assert "scaled_parallel0" not in by_driver.metadata["functions"]
    for a, b in zip(by_driver.artifacts, by_pipeline.artifacts, strict=True):
        assert bytes(a.content) == bytes(b.content), a.file_name


def test_c_kernels_and_host_compile_with_all_warnings(tmp_path: Path,
                                                      reference: dict[str, list[Any]]) -> None:
    """kernels.c and host.c build with -Wall -Wextra -Werror -pedantic (c_helpers)
    and give the interpreter's results through the packed entries."""
    lib = build(feature_module(), tmp_path)
    kernels, host = lib.source("kernels.c"), lib.source("host.c")
    assert "kiln__parallel_for(" in kernels and "kiln__kernel_scaled_parallel0_run" in kernels
    assert "static int32_t kiln__kernel_scaled_parallel0(" in kernels
    assert "pthread_create" in host and "#define _POSIX_C_SOURCE" in host
    got = {}
    for name, args in inputs().items():
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        lib.run(name, *args)
        got[name] = args
    assert_matches(got, reference)
    x = np.arange(8, dtype=np.int64)
    assert lib.call("oom", x, np.zeros(8, np.float32)) == 1
    assert lib.last_error().startswith("oom: out of memory allocating a workspace")


def test_host_c_without_threads_for_firmware(tmp_path: Path) -> None:
    """Bare metal: host.c gets -DKILN_NO_THREADS (parallel loops run serially) and no
    -pthread; it still compiles with every warning, with gcc and arm-none-eabi-gcc."""
    firmware = Target("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4 -mfloat-abi=hard")
    # `oom`'s workspace (HUGE floats) cannot exist on a 32-bit target: a compile error.
    with pytest.raises(CompileError, match="workspace 'huge' of function 'oom'"):
        codegen_c(outlined_feature_module(), firmware, prefix="kiln_", pool=ConstantPool())
    mod = OutlineParallelLoops()(
        IRModule({k: f for k, f in feature_module().functions.items() if k != "oom"}))
    host = next(a for a in codegen_c(mod, firmware, prefix="kiln_", pool=ConstantPool())
                if a.file_name == "host.c")
    assert "-DKILN_NO_THREADS" in host.metadata["cflags"] and "libs" not in host.metadata
    native_host = next(a for a in codegen_c(mod, None, prefix="kiln_", pool=ConstantPool())
                       if a.file_name == "host.c")
    assert native_host.metadata["libs"] == ["-pthread"]
    path = tmp_path / "host.c"
    path.write_bytes(host.content)
    compilers = [("cc", [])]
    if shutil.which("arm-none-eabi-gcc"):
        compilers.append(("arm-none-eabi-gcc", ["-mcpu=cortex-m4", "-mthumb"]))
    for cc, flags in compilers:
        proc = subprocess.run([cc, *WARNINGS, "-std=c11", "-O2", "-DKILN_NO_THREADS", *flags,
                               "-c", str(path), "-o", str(tmp_path / f"{cc}.o")],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    arm = Target("llvm -mtriple=thumbv7em-none-eabi -mcpu=cortex-m4")
    arts = codegen_llvm(mod, arm, prefix="kiln_", pool=ConstantPool())
    llvm_host = next(a for a in arts if a.file_name == "host.c")
    assert "-DKILN_NO_THREADS" in llvm_host.metadata["cflags"]


def test_llvm_ir_outlines_loop_bodies() -> None:
    from kiln.artifact import inspect_artifact

    arts = codegen_llvm(outlined_feature_module(), Target("llvm"), prefix="kiln_",
                        pool=ConstantPool())
    obj = next(a for a in arts if a.file_name == "kernels.o")
    assert "kiln__kernel_scaled_parallel0" not in obj.metadata["functions"]  # internal
    ll = inspect_artifact(next(a for a in arts if a.file_name == "kernels.bc"), "ll")
    assert "declare hidden i32 @kiln__parallel_for(i64, ptr, ptr)" in ll
    assert "@kiln__kernel_scaled_parallel0.run" in ll
    assert next(a for a in arts if a.file_name == "host.c").metadata["libs"] == ["-pthread"]


def test_loop_bodies_are_compiled_for_the_target_cpu() -> None:
    """The loop body is inlined into its trampoline: the trampoline must carry the
    kernels' target-cpu and features, or the body loses AVX & co."""
    import re

    from kiln.artifact import inspect_artifact

    arts = codegen_llvm(outlined_feature_module(), Target("llvm -mcpu=skylake"), prefix="kiln_",
                        pool=ConstantPool())
    ll = inspect_artifact(next(a for a in arts if a.file_name == "kernels.bc"), "ll")
    define = next(line for line in ll.splitlines()
                  if line.startswith("define") and "scaled_parallel0.run" in line)
    group = re.search(r"#(\d+)", define.split(")")[-1])
    assert group is not None, define
    attrs = next(line for line in ll.splitlines()
                 if line.startswith(f"attributes #{group.group(1)} "))
    assert '"target-cpu"="skylake"' in attrs


# ====================================================================== running


def test_jit_matches_the_interpreter(native: Executable,
                                     reference: dict[str, list[Any]]) -> None:
    got = {name: run(native, name, args) for name, args in inputs().items()}
    assert_matches(got, reference)


def test_llvmjit_runs_parallel_loops_serially(reference: dict[str, list[Any]]) -> None:
    ex = compile_features("llvmjit")
    got = {name: run(ex, name, args) for name, args in inputs().items()}
    assert_matches(got, reference)
    ll = ex.jit().inspect_source("ll")
    # No host.c in a JIT: the serial parallel-for is defined in the module (and inlined).
    assert not any(line.startswith("declare") and "@kiln__parallel_for" in line
                   for line in ll.splitlines())


def test_an_error_inside_a_parallel_body_is_reported(native: Executable) -> None:
    x = np.arange(8, dtype=np.int64)
    for _ in range(3):  # the pool stays usable after a failed loop
        with pytest.raises(KilnError, match="oom: out of memory allocating a workspace"):
            native["oom"](x, np.zeros(8, np.float32))
        out = run(native, "scaled", inputs()["scaled"])
        assert np.isfinite(out[1]).all()


def test_threads_calling_at_once(native: Executable,
                                 reference: dict[str, list[Any]]) -> None:
    """Two threads running parallel kernels together: one gets the pool, the other
    runs its loop serially; both get the right answer."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                got = {name: run(native, name, args) for name, args in inputs().items()}
                assert_matches(got, reference)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a parallel kernel hung"
    assert not errors, errors[0]


@pytest.mark.parametrize("threads", [3, 13])
def test_chunk_shares_for_any_thread_count(exported: Path, tmp_path: Path, threads: int,
                                           reference: dict[str, list[Any]]) -> None:
    """Each thread runs its own contiguous share of a loop's chunks first, then takes
    what is left of the others' (docs/abi.md, "Parallel loops"): 3 threads split 36 rows
    into 12 chunks in shares of 4, 13 threads into 36 one-row chunks in shares of 2 or
    3. Every row is computed once: the results are those of one thread, bit for bit."""
    copies = [tmp_path / f"{n}.so" for n in (1, threads)]  # a library, a pool: one each
    for copy in copies:
        shutil.copy(exported, copy)
    one, many = (load_module(copy, num_threads=n) for copy, n in zip(copies, (1, threads)))
    try:
        want = {name: run(one, name, args) for name, args in inputs().items()}
        assert_matches(want, reference)
        for _ in range(5):
            got = {name: run(many, name, args) for name, args in inputs().items()}
            assert_matches(got, want, exact=True)
        assert many.pool_stats().started == threads - 1
    finally:
        one.close()
        many.close()


# ====================================================================== fresh processes


FRESH_SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    from kiln.runtime import load_module

    def threads():
        return len(os.listdir("/proc/self/task"))

    # No weight check: its background thread (kiln.runtime.weights) would end meanwhile
    # and make the count of the pool's workers one short.
    lib = load_module(sys.argv[1], verify_weights=False)
    data = np.load(sys.argv[2], allow_pickle=True).item()
    before = threads()
    out = {}
    for name, args in data.items():
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        lib[name](*args)
        out[name] = args
    started = threads() - before
    np.save(sys.argv[3], out, allow_pickle=True)
    lib.close()  # dlclose: the library's workers exit first
    print(started, threads() - before)
""")


def fresh_env(threads: int | None) -> dict[str, str]:
    env = child_env()
    env.pop("KILN_NUM_THREADS", None)
    if threads is not None:
        env["KILN_NUM_THREADS"] = str(threads)
    return env


@pytest.mark.parametrize("threads", [1, 2])
def test_exported_library_in_a_fresh_process(exported: Path, tmp_path: Path, threads: int,
                                             reference: dict[str, list[Any]]) -> None:
    data, result = tmp_path / "in.npy", tmp_path / "out.npy"
    np.save(data, inputs(), allow_pickle=True)
    proc = subprocess.run([sys.executable, "-c", FRESH_SCRIPT, str(exported), str(data),
                           str(result)], capture_output=True, text=True, timeout=TIMEOUT,
                          env=fresh_env(threads))
    assert proc.returncode == 0, proc.stderr
    started, after_close = (int(v) for v in proc.stdout.split())
    assert started == threads - 1  # KILN_NUM_THREADS counts the calling thread
    assert after_close == 0
    got = np.load(result, allow_pickle=True).item()
    assert_matches(got, reference)
    # 1 and 2 threads run the same code on the same chunks of work: identical bits.
    other = tmp_path / f"jit-{threads}.npy"
    np.save(other, {name: run(load_module(exported), name, args)
                    for name, args in inputs().items()}, allow_pickle=True)
    assert_matches(got, np.load(other, allow_pickle=True).item(), exact=True)


FORK_SCRIPT = textwrap.dedent("""
    import os, sys, threading
    import numpy as np
    from kiln.runtime import load_module

    lib = load_module(sys.argv[1])
    x = np.random.default_rng(0).standard_normal((37, 24)).astype(np.float32)

    def scaled():
        y = np.zeros_like(x)
        lib["scaled"](x, y, 1.5, 0.25, -3, True)
        return y

    want = scaled()  # the pool is running now
    stop = threading.Event()

    def busy():  # keeps the pool busy while the main thread forks
        while not stop.is_set():
            assert np.array_equal(scaled(), want)

    worker = threading.Thread(target=busy)
    worker.start()
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            ok = all(np.array_equal(scaled(), want) for _ in range(5))
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            print("child failed", status)
            sys.exit(1)
    stop.set()
    worker.join()
    print("ok")
""")


def test_forked_children_run_parallel_kernels(exported: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(exported)],
                          capture_output=True, text=True, timeout=TIMEOUT, env=fresh_env(2))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


C_PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <kiln/kiln.h>

int main(int argc, char** argv) {
  void* lib;
  KilnPackedFunc scaled, oom;
  KilnStringFunc err;
  float x[NROWS * NCOLS], y[NROWS * NCOLS];
  int64_t shape[2] = {NROWS, NCOLS}, idx_shape[1] = {8}, idx[8];
  float small[8];
  KilnValue args[6];
  int32_t codes[6];
  DLTensor tx, ty, ti, ts;
  int k, round;
  if (argc != 2) return 2;
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  scaled = (KilnPackedFunc)dlsym(lib, "kiln_scaled");
  oom = (KilnPackedFunc)dlsym(lib, "kiln_oom");
  err = (KilnStringFunc)dlsym(lib, "kiln__last_error");
  if (!scaled || !oom || !err) return 4;
  for (k = 0; k < NROWS * NCOLS; ++k) { x[k] = (float)(k % 17) - 8.0f; y[k] = 0.0f; }
  for (k = 0; k < 8; ++k) idx[k] = k;
  tx = kiln_tensor(x, 2, shape, KILN_FLOAT32);
  ty = kiln_tensor(y, 2, shape, KILN_FLOAT32);
  for (round = 0; round < 50; ++round) {
    kiln_set_tensor(args, codes, 0, &tx);
    kiln_set_tensor(args, codes, 1, &ty);
    kiln_set_float(args, codes, 2, 1.5);
    kiln_set_float(args, codes, 3, 0.25);
    kiln_set_int(args, codes, 4, -3);
    kiln_set_int(args, codes, 5, 1);
    if (scaled(args, codes, 6) != 0) { fprintf(stderr, "%s\n", err()); return 5; }
  }
  for (k = 0; k < NROWS * NCOLS; ++k) printf("%.9g\n", y[k]);
  ti = kiln_tensor(idx, 1, idx_shape, KILN_INT64);
  ts = kiln_tensor(small, 1, idx_shape, KILN_FLOAT32);
  kiln_set_tensor(args, codes, 0, &ti);
  kiln_set_tensor(args, codes, 1, &ts);
  printf("oom %d %s\n", (int)oom(args, codes, 2), err());
  return 0;
}
"""


def test_c_program_runs_parallel_kernels_without_python(exported: Path, tmp_path: Path,
                                                        native: Executable) -> None:
    source = tmp_path / "main.c"
    source.write_text(C_PROGRAM.replace("NROWS", str(N)).replace("NCOLS", str(M)))
    exe = tmp_path / "main"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}",
                    str(source), "-o", str(exe), "-ldl"], check=True, capture_output=True,
                   text=True)
    x = ((np.arange(N * M) % 17) - 8).astype(np.float32).reshape(N, M)
    want = run(native, "scaled", [x, np.zeros((N, M), np.float32), 1.5, 0.25, -3, True])[1]
    for threads in (1, 2):
        proc = subprocess.run([str(exe), str(exported)], capture_output=True, text=True,
                              timeout=TIMEOUT, env=fresh_env(threads))
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        got = np.array([float(v) for v in lines[:N * M]], np.float32).reshape(N, M)
        np.testing.assert_array_equal(got, want)
        assert lines[N * M].startswith("oom 1 oom: out of memory allocating a workspace")


def test_static_library_links_with_pthread(native: Executable, tmp_path: Path) -> None:
    """`.a` export: the header names -pthread; a static program links and runs."""
    archive = tmp_path / "parallel_lib.a"  # (not features.h: glibc has one)
    native.export_library(archive)
    header = archive.with_suffix(".h").read_text()
    assert "-pthread" in header
    source = tmp_path / "main.c"
    source.write_text(textwrap.dedent(r"""
        #include <stdio.h>
        #include "parallel_lib.h"
        int main(void) {
          int32_t y[1] = {0};
          int64_t shape[1] = {1};
          DLTensor ty = kiln_tensor(y, 1, shape, KILN_INT32);
          DLTensor* args[1] = {&ty};
          if (kiln_call_tensors(kiln_no_captures, args, 1) != 0) return 1;
          printf("%d\n", (int)y[0]);
          return 0;
        }
    """))
    exe = tmp_path / "main"
    proc = subprocess.run(["cc", "-std=c99", f"-I{include_dir()}", f"-I{tmp_path}", str(source),
                           str(archive), "-lm", "-pthread", "-o", str(exe)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.stdout.strip() == "7"


# ====================================================================== a model


def small_cnn() -> IRModule:
    rng = np.random.default_rng(3)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, 3, 24, 24), "float32")
        w = g.Constant(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w")
        c = ib.emit(ops.call("conv2d", x, w, pads=(1, 1, 1, 1)), "c")
        r = ib.emit(ops.call("relu", c), "r")
        p = ib.emit(ops.call("max_pool2d", r, kernel_shape=(2, 2), strides=(2, 2)), "p")
        f = ib.emit(ops.call("reshape", p, shape=(1, 16 * 12 * 12)), "f")
        d = g.Constant(rng.standard_normal((16 * 12 * 12, 256)).astype(np.float32) * 0.01, "d")
        ib.ret(ib.emit(ops.call("matmul", f, d), "y"))
    return ib.get()


@pytest.mark.parametrize("target", NATIVE)
def test_default_pipeline_parallelizes_a_model(target: str) -> None:
    mod = small_cnn()
    with PassContext(config={"kiln.cache": False}):
        ex = kiln.compile(mod, target)
    marked = [name for name, fn in ex.ir.prim_funcs().items() if parallel_loops(fn)]
    assert "main" not in marked and len(marked) >= 2
    x = np.random.default_rng(4).standard_normal((1, 3, 24, 24)).astype(np.float32)
    np.testing.assert_allclose(ex(x), evaluate(mod, "main", x), rtol=1e-4, atol=1e-5)


TSAN_DRIVER = r"""
#include <pthread.h>
#include <stdio.h>
#include <kiln/kiln.h>
int32_t kiln_nested(const KilnValue*, const int32_t*, int32_t);
int32_t kiln_workspaces(const KilnValue*, const int32_t*, int32_t);
int32_t kiln_oom(const KilnValue*, const int32_t*, int32_t);
int32_t kiln__pool_stats(int64_t*, int32_t);
static int failures;
static void* run(void* arg) {
  static float x[3][NROWS * NCOLS], y[3][NROWS * NCOLS], z[3][NROWS * NCOLS];
  int me = *(int*)arg, k, r;
  int64_t shape[2] = {NROWS, NCOLS}, idx[8] = {0, 1, 2, 3, 4, 5, 6, 7}, small_shape[1] = {8};
  float small[8];
  for (k = 0; k < NROWS * NCOLS; ++k) x[me][k] = (float)k;
  for (r = 0; r < 150; ++r) {
    DLTensor tx = kiln_tensor(x[me], 2, shape, KILN_FLOAT32);
    DLTensor ty = kiln_tensor(y[me], 2, shape, KILN_FLOAT32);
    DLTensor tz = kiln_tensor(z[me], 2, shape, KILN_FLOAT32);
    DLTensor ti = kiln_tensor(idx, 1, small_shape, KILN_INT64);
    DLTensor ts = kiln_tensor(small, 1, small_shape, KILN_FLOAT32);
    DLTensor* three[3] = {&tx, &ty, &tz};
    DLTensor* two[2] = {&ti, &ts};
    if (kiln_call_tensors(kiln_nested, three, 3) != 0) __atomic_add_fetch(&failures, 1, 0);
    if (kiln_call_tensors(kiln_workspaces, three, 2) != 0) __atomic_add_fetch(&failures, 1, 0);
    if (kiln_call_tensors(kiln_oom, two, 2) != 1) __atomic_add_fetch(&failures, 1, 0);
  }
  return NULL;
}
int main(void) {
  pthread_t t[3];
  int ids[3] = {0, 1, 2}, i;
  for (i = 0; i < 3; ++i) pthread_create(&t[i], NULL, run, &ids[i]);
  int64_t stats[17];
  for (i = 0; i < 3; ++i) pthread_join(t[i], NULL);
  /* [16]: loops run on the caller alone, as probes or by the verdict (docs/abi.md) */
  printf("failures %d probed %d\n", failures, kiln__pool_stats(stats, 17) == 17 && stats[16] > 0);
  return 0;
}
"""


def test_thread_pool_under_thread_sanitizer(tmp_path: Path) -> None:
    """Three application threads run nested and failing parallel kernels at once, the
    pool probing whether its threads pay every other loop (docs/abi.md, "Parallel
    loops"); ThreadSanitizer must see no data race in the pool or the generated code."""
    from c_helpers import consts_c

    mod = outlined_feature_module()
    pool = ConstantPool.from_module(mod)
    sources = []
    for art in codegen_c(mod, None, prefix="kiln_", pool=pool):
        path = tmp_path / art.file_name
        if art.file_name == "constants.bin":
            path = tmp_path / "constants.c"
            path.write_text(consts_c(art.content, art.metadata["symbol"], art.metadata["align"]))
        else:
            path.write_bytes(art.content)
        sources.append(str(path))
    driver = tmp_path / "driver.c"
    driver.write_text(TSAN_DRIVER.replace("NROWS", str(N)).replace("NCOLS", str(M)))
    exe = tmp_path / "driver"
    proc = subprocess.run(["cc", "-fsanitize=thread", "-g", "-O1", "-std=c11", "-fwrapv",
                           "-DKILN_POOL_PROBE_LOOPS=2", "-DKILN_POOL_SETTLE_NS=50000000",
                           f"-I{include_dir()}", str(driver), *sources, "-o", str(exe),
                           "-pthread", "-lm"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"no ThreadSanitizer here: {proc.stderr.strip()[:200]}")
    for threads in (2, 4):
        env = dict(fresh_env(threads), TSAN_OPTIONS="allocator_may_return_null=1 exitcode=66",
                   KILN_SERIAL_NS="0", KILN_PROBE_MS="1")
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT,
                             env=env)
        assert out.returncode == 0 and "WARNING" not in out.stderr, out.stderr[-3000:]
        assert out.stdout.strip() == "failures 0 probed 1"
