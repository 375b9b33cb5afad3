"""NCHW{b}c max pools over run-time channel blocks and image size
(kiln.kernels.pool.lowering.run_time_pool) against onnxruntime.

Three branches run two 1x1 layers (+ ReLU), a 3x3 max pool at stride 1 with pads 1 and a
1x1 layer, at 12x12 over 32 channels, at 6x6 over 48 and at 9x9 over 64: the three
pools share one kernel, called with their input's channel blocks, height and width. A
fourth pools at stride 2 (an output smaller than its input): a kernel of its own.
Batch 2; llvm, llvm on the AVX2 path and c, in this process and in a fresh one.
"""

from __future__ import annotations

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.ir.attrs import ATTR_ARG_DIMS
from kiln.kernels.pool.lowering import BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME

TOL = 1e-4
RNG = np.random.default_rng(7)
BRANCHES = (("p", 32, 12, 1), ("q", 48, 6, 1), ("r", 64, 9, 1), ("s", 32, 10, 2))


def build_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, out: str, ci: int, co: int) -> str:
        w = numpy_helper.from_array(
            RNG.normal(0, 1 / np.sqrt(ci), (co, ci, 1, 1)).astype(np.float32), out + "_w")
        b = numpy_helper.from_array(RNG.normal(0, 0.1, co).astype(np.float32), out + "_b")
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [out], kernel_shape=[1, 1]))
        return out

    for name, ci, _, stride in BRANCHES:
        a = conv(conv(name, f"{name}b0", ci, ci), f"{name}a0", ci, ci)
        nodes.append(helper.make_node("Relu", [a], [f"{name}a"]))
        nodes.append(helper.make_node("MaxPool", [f"{name}a"], [f"{name}m"],
                                      kernel_shape=[3, 3], strides=[stride, stride],
                                      pads=[1, 1, 1, 1]))
        conv(f"{name}m", f"{name}o", ci, 32)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, ci, hw, hw])
              for n, ci, hw, _ in BRANCHES]
    outputs = [helper.make_tensor_value_info(f"{n}o", TensorProto.FLOAT, None)
               for n, *_ in BRANCHES]
    return kernel_checks.branches_model("pools", nodes, inputs, outputs, inits)


MODEL = build_model()
CASES = ["32 channels at 12x12", "48 channels at 6x6", "64 channels at 9x9",
         "stride 2 at 10x10"]
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()
test_matches_onnxruntime, test_in_a_fresh_process = CHECKS.onnxruntime_tests()


@pytest.mark.parametrize("target", ["llvm -mcpu=znver4", "llvm -mcpu=znver4 -mattr=-avx512f"])
def test_pools_at_stride_one_share_a_kernel(target: str) -> None:
    pools, calls = kernel_checks.kernel_calls(
        MODEL, target, lambda name, f: bool(f.attrs.get("kiln.pool_kernel"))
        and "parallel" not in name)
    shared = [name for name, f in pools.items() if ATTR_ARG_DIMS in f.attrs]
    assert [calls[name] for name in shared] == [3]
    f = pools[shared[0]]
    assert f.attrs[ATTR_ARG_DIMS] == ((BLOCKS_NAME, 0, 1), (HEIGHT_NAME, 0, 2),
                                      (WIDTH_NAME, 0, 3))
    x, out = f.buffer_params
    assert [d.name for d in x.shape[1:4]] == [BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME]
    assert [d.name for d in out.shape[1:4]] == [BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME]
    # the stride-2 pool: its own kernel at its static size (NCHW{b}c or, where its branch
    # stays NCHW, the NCHW one)
    assert sorted(calls[name] for name in pools if name not in shared) == [1]
