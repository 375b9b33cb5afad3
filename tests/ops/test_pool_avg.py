"""Float32 average pooling (kiln.ops.pool_kernels) against onnxruntime on llvm, llvm with
AVX-512 off and c: pools whose windows share no input row sum row by row
(kiln.ops.max_pool_kernel.row_pool_body, no padded copy of the input); overlapping ones
keep the window kernel (a padded workspace).

Row-by-row cases: DenseNet's 2x2/2 transition pool with a fused ReLU, a 2x3 window with
ceil_mode and asymmetric pads not counted (`count_include_pad=0`: border windows divide
by fewer values), and a dilated window with stride 3 x 2 counting the padding. The
window kernel's: a 3x3/1 pool (Inception's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

pytest.importorskip("onnxruntime")

# (input shape, AveragePool attributes, a fused Relu, summed row by row)
CASES: list[tuple[tuple[int, ...], dict[str, Any], bool, bool]] = [
    ((1, 6, 12, 20), dict(kernel_shape=[2, 2], strides=[2, 2]), True, True),
    ((1, 3, 13, 17), dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1],
                          ceil_mode=1, count_include_pad=0), False, True),
    ((2, 2, 16, 19), dict(kernel_shape=[2, 2], strides=[3, 2], dilations=[2, 2],
                          pads=[1, 1, 1, 1], count_include_pad=1), False, True),
    ((1, 4, 9, 11), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                         count_include_pad=0), False, False),
]


def build_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = GraphBuilder(seed=27)
    rng = np.random.default_rng(27)
    feeds = {}
    for i, (shape, attrs, relu, _) in enumerate(CASES):
        x = b.input(f"x{i}", list(shape))
        feeds[x] = rng.standard_normal(shape).astype(np.float32)
        y = b.op("AveragePool", x, **attrs)
        b.output(b.op("Relu", y) if relu else y)
    return b.model(opset=19, name="avg_pool", check=False), feeds


MODEL, FEEDS = build_model()


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return onnxruntime_outputs(MODEL, FEEDS)


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_matches_onnxruntime(target: str, reference: list[np.ndarray]) -> None:
    exe = kiln.compile(from_onnx(MODEL), native_target(target))
    pools = [f for f in exe.ir.functions.values() if f.attrs.get("kiln.pool_kernel")]
    assert len(pools) == len(CASES)
    rows = []
    for f in pools:
        allocs = {s.buffer.name for s in iter_stmts(f.body) if isinstance(s, Allocate)}
        rows.append("maxrow" in allocs and "xpad" not in allocs)
    assert sorted(rows) == sorted(case[3] for case in CASES)
    got = exe(*FEEDS.values())
    for case, g, want in zip(CASES, got, reference, strict=True):
        # the sums run in another order than onnxruntime's: a few ulp apart
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-6,
                                   err_msg=str(case))
