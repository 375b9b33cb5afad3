"""Max and average pools over a symbolic batch (an image size that is static) take the
hand-built window kernel of a pinned build, its outer loop over the batch at run time:
no generic loops, no GenericKernelWarning. Against onnxruntime at several batches on
llvm, its AVX2 path and c."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import PerformanceWarning
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_POOL_KERNEL
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target


def pool_model(op: str, **attrs: object) -> onnx.ModelProto:
    gb = GraphBuilder(seed=5)
    x = gb.input("x", ("batch", 6, 11, 9))
    y = gb.op("Relu", gb.op(op, x, **attrs))  # an epilogue fused into the store
    gb.output(y, typed=False)
    return gb.model(check=False)


CASES = {
    "max_2x2_s2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "max_3x3_pads_ceil": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                      "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    "avg_3x3_pads": ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 2],
                                     "pads": [1, 1, 1, 1]}),
    "avg_include_pad": ("AveragePool", {"kernel_shape": [2, 3], "pads": [0, 1, 1, 1],
                                        "count_include_pad": 1}),
}


@pytest.mark.parametrize("kind", NATIVE_TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_pools_over_a_symbolic_batch_take_the_window_kernel(kind: str, case: str) -> None:
    op, attrs = CASES[case]
    model = pool_model(op, **attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)  # GenericKernelWarning included
        exe = kiln.compile(from_onnx(model), native_target(kind))
    assert "generic_kernels" not in exe.metadata
    assert [f.attrs[ATTR_POOL_KERNEL] for f in exe.ir.functions.values()
            if ATTR_POOL_KERNEL in getattr(f, "attrs", {})]
    rng = np.random.default_rng(7)
    for batch in (1, 2, 5):
        x = rng.standard_normal((batch, 6, 11, 9)).astype(np.float32)
        [want] = onnxruntime_outputs(model, {"x": x})
        got = np.asarray(exe["main"](x))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(batch))


@pytest.mark.parametrize("kind", NATIVE_TARGETS)
def test_blocked_pools_over_a_symbolic_batch_take_the_nchwc_kernel(kind: str) -> None:
    """In the blocked layout (graph_pipeline="nchwc") a pool between convolutions is a
    `pool2d_nchwc` (where the layout pass blocks the chain): its vector kernel loops
    over the symbolic batch."""
    gb = GraphBuilder(seed=9)
    x = gb.input("x", ("batch", 8, 12, 12))
    h = gb.op("Relu", gb.conv(x, 8, 16, 3))
    h = gb.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    gb.output(gb.op("Relu", gb.conv(h, 16, 16, 3)), typed=False)
    model = gb.model(check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        exe = kiln.compile(from_onnx(model), native_target(kind), graph_pipeline="nchwc")
    pools = {f.attrs.get(ATTR_POOL_KERNEL) for f in exe.ir.functions.values()
             if hasattr(f, "attrs")} - {None}
    # the layout pass blocks this chain where the ISA's lanes pay (AVX-512 here); the
    # pool is hand-built either way
    assert pools in ({"pool2d_nchwc"}, {"max_pool2d"})
    rng = np.random.default_rng(11)
    for batch in (1, 3):
        x_in = rng.standard_normal((batch, 8, 12, 12)).astype(np.float32)
        [want] = onnxruntime_outputs(model, {"x": x_in})
        np.testing.assert_allclose(np.asarray(exe["main"](x_in)), want, rtol=1e-4, atol=1e-4)
