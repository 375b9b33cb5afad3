"""The row-by-row max pooling kernel (kiln.ops.max_pool_kernel) against onnxruntime,
bit for bit, on llvm, llvm with AVX-512 off and c; strided average pools on the same
kernel, summing, within float tolerance.

Cases: float32 with ceil_mode and asymmetric pads (a last window past the end pads),
dilation with stride 2 (window columns in both phases), a non-square window with
stride 3 x 1, int8 (the stem's 3x3/2 pad 1) and uint8 (2x2/2 with ceil_mode).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

pytest.importorskip("onnxruntime")

ELEM = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
# (input shape, dtype, MaxPool attributes)
CASES: list[tuple[tuple[int, ...], str, dict[str, Any]]] = [
    ((1, 3, 17, 19), "float32", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1],
                                     ceil_mode=1)),
    ((2, 2, 13, 21), "float32", dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2],
                                     pads=[2, 2, 2, 2])),
    ((1, 4, 14, 9), "float32", dict(kernel_shape=[3, 2], strides=[3, 1], pads=[0, 1, 1, 0])),
    ((1, 5, 23, 40), "int8", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 3, 11, 37), "uint8", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
]


def build_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = GraphBuilder(seed=26)
    rng = np.random.default_rng(26)
    feeds = {}
    for i, (shape, dtype, attrs) in enumerate(CASES):
        x = b.input(f"x{i}", list(shape), ELEM[dtype])
        if dtype == "float32":
            feeds[x] = rng.standard_normal(shape).astype(np.float32)
        else:
            info = np.iinfo(dtype)
            feeds[x] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        b.output(b.op("MaxPool", x, **attrs), elem=ELEM[dtype])
    return b.model(opset=17, name="max_pool", check=False), feeds


MODEL, FEEDS = build_model()


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return onnxruntime_outputs(MODEL, FEEDS)


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_matches_onnxruntime_exactly(target: str, reference: list[np.ndarray]) -> None:
    exe = kiln.compile(from_onnx(MODEL), native_target(target))
    pools = [f for f in exe.ir.functions.values() if f.attrs.get("kiln.pool_kernel")]
    assert len(pools) == len(CASES)
    for f in pools:  # one row buffer on the stack, no padded copy of the input
        allocs = {s.buffer.name: s.buffer.scope for s in iter_stmts(f.body)
                  if isinstance(s, Allocate)}
        assert allocs.get("maxrow") == "local" and "xpad" not in allocs
    got = exe(*FEEDS.values())
    for case, g, want in zip(CASES, got, reference, strict=True):
        assert np.asarray(g).dtype == want.dtype, case
        np.testing.assert_array_equal(np.asarray(g), want, err_msg=str(case))


# Strided average pools take the same row kernel, summing (kiln.ops.pool_kernels): odd
# sizes, ceil_mode past the end pads, count_include_pad, a batch of 2, stride 1 x 2 and
# a ReLU fused after the pool.
# Overlapping windows take the row kernel from 2 vectors of output columns (32 with
# AVX-512): those cases are 67-69 columns wide.
AVG_CASES: list[tuple[tuple[int, ...], dict[str, Any], bool]] = [
    ((1, 3, 7, 67), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), False),
    ((2, 2, 13, 69), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1,
                          count_include_pad=1), True),
    ((1, 4, 11, 9), dict(kernel_shape=[2, 2], strides=[2, 2]), False),
    ((1, 1, 1, 67), dict(kernel_shape=[1, 3], strides=[1, 2], pads=[0, 1, 0, 1]), True),
]


def build_avg_model(cases: list[tuple[tuple[int, ...], dict[str, Any], bool]] = AVG_CASES
                    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = GraphBuilder(seed=27)
    rng = np.random.default_rng(27)
    feeds = {}
    for i, (shape, attrs, relu) in enumerate(cases):
        x = b.input(f"x{i}", list(shape))
        feeds[x] = rng.standard_normal(shape).astype(np.float32)
        y = b.op("AveragePool", x, **attrs)
        b.output(b.op("Relu", y) if relu else y)
    return b.model(opset=17, name="avg_pool", check=False), feeds


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_strided_average_pools_match_onnxruntime(target: str) -> None:
    model, feeds = build_avg_model()
    exe = kiln.compile(from_onnx(model), native_target(target))
    pools = [f for f in exe.ir.functions.values() if f.attrs.get("kiln.pool_kernel")]
    assert len(pools) == len(AVG_CASES)
    for f in pools:  # the row buffer, no padded copy of the input
        allocs = {s.buffer.name for s in iter_stmts(f.body) if isinstance(s, Allocate)}
        assert "maxrow" in allocs and "xpad" not in allocs
    got = exe(*feeds.values())
    if target.startswith("llvm"):  # 14 output columns, under 2 AVX2 vectors: windows
        narrow = build_avg_model([((1, 8, 9, 28), AVG_CASES[0][1], False)])
        ir = kiln.compile(from_onnx(narrow[0]), native_target(target)).ir
        (pool,) = [p for p in ir.functions.values() if p.attrs.get("kiln.pool_kernel")]
        assert "maxrow" not in {s.buffer.name for s in iter_stmts(pool.body)
                                if isinstance(s, Allocate)}
    for case, g, want in zip(AVG_CASES, got, onnxruntime_outputs(model, feeds), strict=True):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6, err_msg=str(case))
