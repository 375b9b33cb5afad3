"""bind-gpu-threads: every kernel gets a block/thread launch; the scheduled IR, run by
kiln's reference interpreter, still matches onnxruntime (the GPU runs the same IR)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.errors import CompileError
from kiln.frontend import from_onnx
from kiln.ir import structural_equal
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.gpu_launch import launch_shape
from kiln.ir.module import IRModule
from kiln.ir.tensor import For
from kiln.ir.visitor import iter_stmts
from kiln.script import from_source
from kiln.target import Target
from kiln.transform.gpu_schedule import BindGpuThreads
from kiln.transform.pipeline import get_pipeline
from support.cuda_nets import NETS
from support.reference import onnxruntime_outputs


def _scheduled(name: str) -> tuple[IRModule, np.ndarray, dict[str, np.ndarray]]:
    model, feeds = NETS[name]()
    mod = from_onnx(model)
    with Target({"kind": "cuda", "arch": "sm_90"}):
        mod = get_pipeline("gpu", "graph")(mod)
        mod = get_pipeline("gpu", "tensor")(mod)
    return mod, onnxruntime_outputs(model, feeds)[0], feeds


@pytest.mark.parametrize("name", sorted(NETS))
def test_scheduled_ir_matches_onnxruntime_in_the_interpreter(name: str) -> None:
    mod, expected, feeds = _scheduled(name)
    out = np.empty(expected.shape, np.float32)
    kiln.evaluate(mod, "main", *feeds.values(), out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(NETS))
def test_every_kernel_is_bound_and_most_threads_are_used(name: str) -> None:
    mod, _, _ = _scheduled(name)
    kernels = {n: f for n, f in mod.prim_funcs().items() if not f.attrs.get(ATTR_GRAPH)}
    shapes = {n: launch_shape(f) for n, f in kernels.items()}
    for n, f in kernels.items():
        # No loop is left for a thread pool; bound loops appear only at the top.
        kinds = [s.kind for s in iter_stmts(f.body) if isinstance(s, For)]
        assert "parallel" not in kinds, n
        assert kinds[:2] == ["block_x", "thread_x"] and "block_x" not in kinds[2:], n
    # The data-parallel kernels (convolutions, pooling, matmul + tail, transposes) get
    # full blocks; fusing the independent loops gives a grid of more than one block.
    wide = [n for n, (grid, block) in shapes.items() if block == 256 and grid > 1]
    assert len(wide) >= 3, shapes
    assert sum(grid * block for grid, block in shapes.values()) > 10 * len(shapes)
    if name == "cnn":  # one thread per output element of the first convolution
        assert shapes["fused_conv2d_relu"] == (16 * 32 * 32 // 256, 256)


def test_scheduled_ir_round_trips_through_the_dsl() -> None:
    mod, _, _ = _scheduled("cnn")
    text = mod.script()
    assert "T.block_x(" in text and "T.thread_x(" in text
    again = from_source(text)
    assert structural_equal(again, mod)
    assert again.script() == text


def test_guard_covers_a_partial_last_block() -> None:
    src = '''
from kiln.script import T, ir_module

@ir_module
class M:
    @T.prim_func
    def f(a: T.Buffer((3, 300), "float32"), b: T.Buffer((3, 300), "float32")):
        for i in T.parallel(3):
            for j in T.serial(300):
                b[i, j] = a[i, j] * T.float32(2.0)
'''
    mod = BindGpuThreads(threads_per_block=128)(from_source(src))
    assert launch_shape(mod["f"]) == (8, 128)  # 900 iterations fused, 1024 threads
    a = np.random.default_rng(0).standard_normal((3, 300)).astype(np.float32)
    b = np.full_like(a, np.nan)
    kiln.evaluate(mod, "f", a, b)
    np.testing.assert_array_equal(b, a * 2)


def test_options_and_unscheduled_kernels_are_errors() -> None:
    with pytest.raises(CompileError, match=r"threads_per_block must be in 1\.\.1024"):
        BindGpuThreads(threads_per_block=0)
    mod, _, _ = _scheduled("cnn")
    with pytest.raises(CompileError, match="bind-gpu-threads"):
        launch_shape(mod["main"])
