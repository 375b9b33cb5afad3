"""Heap workspaces are kept between calls (docs/abi.md, "Heap workspaces").

A model whose memory plan needs a workspace above glibc's largest mmap threshold
(32 MiB): the C library maps such a block afresh on every malloc and unmaps it on
free, so without host.c's cache every call page-faults the whole workspace in
again. The library is exported and run in a fresh process on llvm and c; the minor
page faults of a repeated call are counted with and without KILN_WORKSPACE_CACHE=0.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from support.graphs import GraphBuilder
from support.processes import run_python

ROWS, WIDTH = 150_000, 64  # 38 MB per activation
PAGE = 4096

CHILD = """
import json, resource, sys
import numpy as np
from kiln.runtime import load_module

fn = load_module(sys.argv[1])["main"]
x = np.load(sys.argv[2])
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = fn(x)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
np.save(sys.argv[3], np.asarray(y))
print(json.dumps(faults))
"""


def _model() -> onnx.ModelProto:
    """x -> MatMul -> Relu -> MatMul: the hidden activation lives in the workspace."""
    g = GraphBuilder()
    g.input("x", [ROWS, WIDTH])
    hidden = g.op("Relu", g.op("MatMul", "x", g.weight(WIDTH, WIDTH)))
    g.node("MatMul", [hidden, g.weight(WIDTH, WIDTH)], ["y"])
    g.output("y", [ROWS, WIDTH])
    return g.model()


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_repeated_call_reuses_its_workspace(target: str, tmp_path: Path) -> None:
    ex = kiln.compile(from_onnx(_model()), target)
    lib, inputs, result = tmp_path / "lib.so", tmp_path / "x.npy", tmp_path / "y.npy"
    ex.export_library(lib)
    x = np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)
    np.save(inputs, x)
    workspace_pages = ROWS * WIDTH * 4 // PAGE

    def faults(**env: str) -> list[int]:
        proc = run_python(CHILD, str(lib), str(inputs), str(result), env=env)
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_allclose(np.load(result), ex(x), rtol=1e-5, atol=1e-5)
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    uncached = faults(KILN_WORKSPACE_CACHE="0")
    if uncached[-1] < workspace_pages // 2:
        pytest.skip(f"this C library keeps freed {ROWS * WIDTH * 4 >> 20} MiB blocks mapped "
                    f"({uncached} page faults per call): nothing for the cache to save")
    cached = faults()
    assert cached[0] >= workspace_pages // 2, cached  # the first call maps the workspace
    assert max(cached[1:]) < workspace_pages // 8, (cached, uncached)
