"""Elementwise kernels over a run-time channel count (kiln.transform.run_time_channels)
against onnxruntime.

Three branches apply a BatchNorm-like scale, shift and ReLU (`Mul`, `Add` by per-channel
constants, `Relu`: the NCHW channel-scale kernel, kiln.kernels.conv.channel_scale) at
12x12 over 16, 40 and 72 channels: one kernel, called with each count. Two more add a
per-channel constant, take the sigmoid and multiply by a second input (the
tensor-expression kernel) over 24 and 56 channels at 5x7: a second shared kernel. A
last one adds and takes the tanh over 8 channels, a group of its own: its kernel stays
static. Batch 2; llvm, llvm on the AVX2 path and c, in this process and in a fresh one.
"""

from __future__ import annotations

import kernel_checks
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kiln.ir.attrs import ATTR_ARG_DIMS
from kiln.transform.run_time_channels import CHANNELS_NAME

TOL = 1e-5
RNG = np.random.default_rng(11)
SCALED = (("a", 16), ("b", 40), ("c", 72))
GATED = (("d", 24), ("e", 56))
ALONE = ("f", 8)


def build_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    inputs = []

    def per_channel(name: str, channels: int) -> str:
        inits.append(numpy_helper.from_array(
            RNG.normal(0, 1, (channels, 1, 1)).astype(np.float32), name))
        return name

    def given(name: str, shape: list[int]) -> str:
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    for name, c in SCALED:
        x = given(name, [2, c, 12, 12])
        nodes += [helper.make_node("Mul", [x, per_channel(name + "_s", c)], [name + "m"]),
                  helper.make_node("Add", [name + "m", per_channel(name + "_t", c)],
                                   [name + "t"]),
                  helper.make_node("Relu", [name + "t"], [name + "o"])]
    for name, c in GATED:
        x, y = given(name, [2, c, 5, 7]), given(name + "y", [2, c, 5, 7])
        nodes += [helper.make_node("Add", [x, per_channel(name + "_b", c)], [name + "a"]),
                  helper.make_node("Sigmoid", [name + "a"], [name + "s"]),
                  helper.make_node("Mul", [name + "s", y], [name + "o"])]
    name, c = ALONE
    x = given(name, [2, c, 6, 6])
    nodes += [helper.make_node("Add", [x, per_channel(name + "_b", c)], [name + "a"]),
              helper.make_node("Tanh", [name + "a"], [name + "o"])]
    outputs = [helper.make_tensor_value_info(n + "o", TensorProto.FLOAT, None)
               for n, _ in (*SCALED, *GATED, ALONE)]
    return kernel_checks.branches_model("channels", nodes, inputs, outputs, inits)


MODEL = build_model()
CASES = [f"{kind} over {c} channels" for kind, group in
         (("scale", SCALED), ("gate", GATED), ("alone", (ALONE,))) for _, c in group]
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()
test_matches_onnxruntime, test_in_a_fresh_process = CHECKS.onnxruntime_tests()


def test_widths_share_a_kernel() -> None:
    kernels, calls = kernel_checks.kernel_calls(
        MODEL, "llvm -mcpu=znver4",
        lambda name, f: name.startswith("fused_") and "parallel" not in name)
    shared = sorted((name for name, f in kernels.items() if ATTR_ARG_DIMS in f.attrs),
                    key=lambda name: calls[name])
    assert [calls[name] for name in shared] == [2, 3]
    for name in shared:
        f = kernels[name]
        assert f.attrs[ATTR_ARG_DIMS] == ((CHANNELS_NAME, 0, 1),)
        assert f.params[-1].name == CHANNELS_NAME
        out = f.buffer_params[-1]
        assert out.shape[1].name == CHANNELS_NAME and out.shape[2:] != ()
        assert all(isinstance(d, int) for d in out.shape[2:])  # the image stays static
    assert f.attrs.get("kiln.channel_scale")  # the three scale groups: the hand kernel
    # the group of its own keeps its static kernel
    alone = [name for name in kernels if name not in shared]
    assert [calls[name] for name in alone] == [1]
    assert all(isinstance(d, int) for d in kernels[alone[0]].buffer_params[-1].shape)
