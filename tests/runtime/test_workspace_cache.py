"""Heap workspaces are kept between calls (docs/abi.md, "Heap workspaces").

A model whose memory plan needs a workspace above glibc's largest mmap threshold
(32 MiB): the C library maps such a block afresh on every malloc and unmaps it on
free, so without host.c's cache every call page-faults the whole workspace in
again. The library is exported and run in a fresh process on llvm and c, with and
without KILN_WORKSPACE_CACHE=0. What is counted is what kiln does, not what the
kernel does: a `malloc` interposed with LD_PRELOAD counts the allocations of 1 MiB
or more (the cache's floor, KILN_WORKSPACE_CACHED_MIN) made during each call of a
prepared call, whose results are allocated once beforehand. Page-fault counts
would depend on transparent huge pages and on what else the machine is doing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from support.graphs import GraphBuilder
from support.processes import run_python
from support.toolchains import c_compiler

ROWS, WIDTH = 150_000, 64  # 38 MB per activation
CACHED_MIN = 1 << 20

# glibc's own entry point behind the interposed malloc: no dlsym, so no recursion.
COUNTING_MALLOC = f"""
#include <stddef.h>
extern void* __libc_malloc(size_t size);
static unsigned long large_mallocs;
void* malloc(size_t size) {{
  if (size >= {CACHED_MIN}u) __atomic_add_fetch(&large_mallocs, 1, __ATOMIC_RELAXED);
  return __libc_malloc(size);
}}
unsigned long kiln_test_large_mallocs(void) {{
  return __atomic_load_n(&large_mallocs, __ATOMIC_RELAXED);
}}
"""

CHILD = """
import ctypes, json, sys
import numpy as np
from kiln.runtime import load_module

counter = ctypes.CDLL(None).kiln_test_large_mallocs
counter.restype = ctypes.c_ulong
x = np.load(sys.argv[2])
run = load_module(sys.argv[1])["main"].prepare(x)
counts = []
for _ in range(3):
    before = counter()
    y = run()
    counts.append(counter() - before)
np.save(sys.argv[3], np.asarray(y))
print(json.dumps(counts))
"""


def _model() -> onnx.ModelProto:
    """x -> MatMul -> Relu -> MatMul: the hidden activation lives in the workspace."""
    g = GraphBuilder()
    g.input("x", [ROWS, WIDTH])
    hidden = g.op("Relu", g.op("MatMul", "x", g.weight(WIDTH, WIDTH)))
    g.node("MatMul", [hidden, g.weight(WIDTH, WIDTH)], ["y"])
    g.output("y", [ROWS, WIDTH])
    return g.model()


@pytest.fixture(scope="module")
def counting_malloc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared library whose malloc counts large requests (for LD_PRELOAD)."""
    folder = tmp_path_factory.mktemp("malloc")
    (folder / "count.c").write_text(COUNTING_MALLOC)
    out = folder / "libcount.so"
    proc = subprocess.run([c_compiler(), "-shared", "-fPIC", "-O1", "-Wall", "-Werror",
                           "-o", str(out), str(folder / "count.c")],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot interpose malloc on this C library: {proc.stderr.strip()}")
    return out


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_repeated_call_reuses_its_workspace(target: str, tmp_path: Path,
                                              counting_malloc: Path) -> None:
    ex = kiln.compile(from_onnx(_model()), target)
    lib, inputs, result = tmp_path / "lib.so", tmp_path / "x.npy", tmp_path / "y.npy"
    ex.export_library(lib)
    x = np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)
    np.save(inputs, x)

    def large_mallocs(**env: str) -> list[int]:
        proc = run_python(CHILD, str(lib), str(inputs), str(result),
                          env={"LD_PRELOAD": str(counting_malloc), **env})
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_allclose(np.load(result), ex(x), rtol=1e-5, atol=1e-5)
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    uncached = large_mallocs(KILN_WORKSPACE_CACHE="0")
    assert min(uncached) >= 1, uncached  # every call allocates its workspace anew
    cached = large_mallocs()
    assert cached[0] >= 1, cached  # the first call allocates the workspace
    assert cached[1:] == [0, 0], (cached, uncached)
