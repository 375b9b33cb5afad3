"""A small CNN-with-softmax through the default pipelines on llvm and c: the
vectorize-loops pass's `vector` loops (register tiles, row kernels) run on 1 and 2
threads and agree with onnxruntime; the C form also compiles for aarch64 (NEON
chunks) with the cross compiler and `-Werror`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from c_helpers import WARNINGS

import kiln
from kiln.codegen.c import codegen_c
from kiln.codegen.constants import ConstantPool
from kiln.frontend.onnx import from_onnx
from kiln.ir.attrs import ATTR_VECTOR_BITS
from kiln.ir.tensor import For
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.host import host_config
from kiln.transform.outline import OutlineParallelLoops
from kiln.transform.pipeline import get_pipeline
from support.graphs import GraphBuilder, value_info
from support.reference import onnxruntime_outputs
from support.toolchains import needs


def _model() -> onnx.ModelProto:
    g = GraphBuilder(3)
    y = g.op("Relu", g.conv("x", 3, 16, 3))
    y = g.op("Relu", g.conv(y, 16, 16, 3))
    y = g.linear(g.op("Flatten", y), 16 * 6 * 6, 24)
    return g.model([value_info("x", [1, 3, 6, 6])],
                   [value_info(g.op("Softmax", y, axis=1), [1, 24])], 17, "vector_cnn")


MODEL = _model()
FEEDS = {"x": np.random.default_rng(0).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)}


def _lowered(target: Target) -> kiln.ir.IRModule:
    mod = from_onnx(MODEL)
    with target:
        mod = get_pipeline("default", "graph", target=target)(mod)
        return get_pipeline("default", "tensor", target=target)(mod)


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_vector_loops_agree_with_onnxruntime_on_1_and_2_threads(kind: str) -> None:
    target = Target({**host_config(), "kind": kind})  # this CPU's vector width
    fn = kiln.compile(from_onnx(MODEL), target)["main"]
    want = onnxruntime_outputs(MODEL, FEEDS)[0]
    try:
        for threads in (1, 2):
            kiln.runtime.set_num_threads(threads)
            np.testing.assert_allclose(np.asarray(fn(FEEDS["x"])), want, rtol=1e-5, atol=1e-6)
    finally:
        kiln.runtime.set_num_threads(None)


@needs("aarch64-linux-gnu-gcc", why="the cross C compiler (make test installs it)")
def test_c_vector_loops_compile_for_aarch64(tmp_path: Path) -> None:
    target = Target("c -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1")
    mod = _lowered(target)
    assert mod.attrs[ATTR_VECTOR_BITS] == 128
    assert any(isinstance(s, For) and s.kind == "vector"
               for fn in mod.prim_funcs().values() for s in iter_stmts(fn.body))
    # the backend takes parallel loops outlined, as kiln.compile hands them over
    kernels = codegen_c(OutlineParallelLoops()(mod), target, prefix="kiln_",
                        pool=ConstantPool.from_module(mod))[0]
    source = kernels.content.decode()
    assert "kiln_f32x4" in source and "kiln_f32x8" not in source
    path = tmp_path / "kernels.c"
    path.write_text(source)
    subprocess.run([str(kernels.metadata["cc"]), *kernels.metadata["cflags"], *WARNINGS, "-c",
                    str(path), "-o", str(tmp_path / "kernels.o")], check=True)
