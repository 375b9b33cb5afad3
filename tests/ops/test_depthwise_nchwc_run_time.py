"""NCHW{b}c depthwise layers over run-time channel blocks and image size
(kiln.kernels.conv.nchwc_depthwise.run_time_key) against onnxruntime.

Each branch runs a 1x1 layer (+ ReLU), a depthwise layer and a 1x1 layer. Three 3x3
depthwise layers at stride 1 with pads 1 and SiLU (x * sigmoid(x)), over 32 channels at
12x12 (one whole tile of 8 positions between the border columns and 2 left: the last
tile overlaps it) and at 16x16 (6 left), and 64 at 10x10 (exactly one tile), share a
kernel called with their input's channel blocks, height and width; two 5x5 ones with
pads 2 (32 at 14x14, 48 at 12x12) share another. (Sizes whose work falls on one side
of each ISA's parallel threshold: that choice is in the key.) Two 3x3 layers at stride 2
with pads 1 (64 at 18x18, 48 at 24x24: no right border column) share a third. Kernels of
their own: a 5x5 layer at 9x9 (a narrower tile: 5 positions) and a 3x3 layer at stride 2
at 19x19 (an odd width: a right border column) over run-time sizes, and, static, a 3x3
layer whose SiLU output is added to its input (a fused op reading an operand of the
convolution again). Batch 1; llvm, llvm
on the AVX2 path and c, in this process and in a fresh one; then a symbolic batch, and
`c -mcpu=native` (plain `c` keeps the layers NCHW).
"""

from __future__ import annotations

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.driver.compiler import lower_for_codegen
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_CONV_KERNEL
from kiln.kernels.conv.nchwc_depthwise import BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME
from kiln.target import Target
from support.reference import onnxruntime_outputs

TOL = 1e-4
RNG = np.random.default_rng(11)
#: (name, channels, image size, window, stride, whether the output is added to an input)
BRANCHES = (("p", 32, 12, 3, 1, False), ("q", 32, 16, 3, 1, False),
            ("r", 64, 10, 3, 1, False), ("s", 32, 14, 5, 1, False),
            ("t", 48, 12, 5, 1, False), ("u", 32, 9, 5, 1, False),
            ("v", 64, 18, 3, 2, False), ("x", 48, 24, 3, 2, False),
            ("y", 64, 19, 3, 2, False), ("w", 32, 12, 3, 1, True))
SHARED = [3, 2, 2]  # the calls of each kernel shared over run-time sizes


def build_model(batch: int | str = 1) -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, out: str, ci: int, co: int, k: int = 1, stride: int = 1,
             group: int = 1) -> str:
        w = numpy_helper.from_array(RNG.normal(0, 1 / np.sqrt(ci * k * k / group),
                                               (co, ci // group, k, k)).astype(np.float32),
                                    out + "_w")
        b = numpy_helper.from_array(RNG.normal(0, 0.1, co).astype(np.float32), out + "_b")
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [out], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4,
                                      group=group))
        return out

    for name, ci, _, k, stride, added in BRANCHES:
        nodes.append(helper.make_node("Relu", [conv(name, f"{name}e", ci, ci)], [f"{name}r"]))
        d = conv(f"{name}r", f"{name}d", ci, ci, k, stride, group=ci)
        nodes.append(helper.make_node("Sigmoid", [d], [f"{name}g"]))
        nodes.append(helper.make_node("Mul", [d, f"{name}g"], [f"{name}s"]))
        last = f"{name}s"
        if added:
            nodes.append(helper.make_node("Add", [last, f"{name}r"], [f"{name}a"]))
            last = f"{name}a"
        conv(last, f"{name}o", ci, 32)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, ci, hw, hw])
              for n, ci, hw, *_ in BRANCHES]
    outputs = [helper.make_tensor_value_info(f"{n}o", TensorProto.FLOAT, None)
               for n, *_ in BRANCHES]
    return kernel_checks.branches_model("depthwise", nodes, inputs, outputs, inits)


MODEL = build_model()
CASES = ["3x3, 32 channels at 12x12", "3x3, 32 at 16x16", "3x3, 64 at 10x10",
         "5x5, 32 at 14x14", "5x5, 48 at 12x12", "5x5, 32 at 9x9", "3x3 at stride 2, 64 at 18x18",
         "3x3 at stride 2, 48 at 24x24", "3x3 at stride 2, 64 at 19x19",
         "3x3 with an added operand"]
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
assert_close = CHECKS.assert_close
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()
test_matches_onnxruntime, test_in_a_fresh_process = CHECKS.onnxruntime_tests()


@pytest.mark.parametrize("target", ["llvm -mcpu=znver4", "llvm -mcpu=znver4 -mattr=-avx512f"])
def test_same_size_layers_share_a_kernel(target: str) -> None:
    kernels, calls = kernel_checks.kernel_calls(
        MODEL, target, lambda name, f: f.attrs.get(ATTR_CONV_KERNEL) == "conv2d_nchwc_depthwise"
        and "parallel" not in name)
    shared = [name for name, f in kernels.items() if ATTR_ARG_DIMS in f.attrs]
    assert sorted(calls[name] for name in shared if calls[name] > 1) == sorted(SHARED)
    for name in shared:
        f = kernels[name]
        assert f.attrs[ATTR_ARG_DIMS] == ((BLOCKS_NAME, 0, 1), (HEIGHT_NAME, 0, 2),
                                          (WIDTH_NAME, 0, 3))
        x, w, _, out = f.buffer_params
        assert [d.name for d in x.shape[1:4]] == [BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME]
        assert w.shape[0].name == out.shape[1].name == BLOCKS_NAME
        # the output's height and width: the input's at stride 1, expressions of them at 2
        assert HEIGHT_NAME in str(out.shape[2]) and WIDTH_NAME in str(out.shape[3])
    # the rest each their own: the 9x9 layer's (a narrower tile), the 19x19 one's (a
    # right border column) and that of the one whose output is added (static)
    assert all(calls[name] == 1 for name in kernels if calls[name] < 2)
    assert len([name for name in kernels if name not in shared]) == 1

def test_a_symbolic_batch() -> None:
    model = build_model("N")
    ex = kiln.compile(from_onnx(model), Target("llvm"))
    lib = ex.jit()
    for batch in (1, 3):
        feeds = {n: RNG.standard_normal((batch, ci, hw, hw)).astype(np.float32)
                 for n, ci, hw, *_ in BRANCHES}
        assert_close(list(lib["main"](*feeds.values())), onnxruntime_outputs(model, feeds))


def test_the_c_backend_for_this_cpu() -> None:
    """`c -mcpu=native` blocks the layers as llvm does (plain `c`, of no vector width,
    keeps them NCHW): the run-time kernels through the C compiler."""
    target = Target("c -mcpu=native")
    lowered = lower_for_codegen(from_onnx(MODEL), target)
    assert any(f.attrs.get(ATTR_CONV_KERNEL) == "conv2d_nchwc_depthwise"
               and ATTR_ARG_DIMS in f.attrs for f in lowered.functions.values())
    lib = kiln.compile(from_onnx(MODEL), target).jit()
    assert_close(list(lib["main"](*CHECKS.feeds.values())), CHECKS.reference())
