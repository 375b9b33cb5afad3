"""The blocked activation layout (kiln.transform.nchwc_layout, kiln.ops.layout) against
onnxruntime.

One ONNX model holds the cases as branches: a residual block and one more 3x3
convolution (bias, ReLU, Add) whose result feeds a max pool (kept blocked), a global
average pool + Flatten + Gemm, and the graph output; after the pool a stride-2 3x3
convolution with Clip and a strided 1x1 convolution, concatenated (blocked); a chain of
stride-2 1x1 and 3x3 convolutions on 3 input channels through 13 and 20 (not multiples
of the block). Batch 2. It is compiled with the `nchwc` graph pipeline on llvm and c,
and run in this process and in fresh processes with 1 and 2 threads.
"""

from __future__ import annotations

from pathlib import Path

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.structural import assert_structural_equal
from kiln.ops import layout
from kiln.script import from_source
from kiln.target import Target
from kiln.transform.registry import parse_passes
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs

TOL = 1e-4
RNG = np.random.default_rng(11)
BEFORE = "fold-constants,fold-batchnorm,block-convolutions"


def build_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv(x: str, out: str, ci: int, co: int, k: int, stride: int, pad: int) -> str:
        w = const(out + "_w", RNG.normal(0, 1 / np.sqrt(ci * k * k), (co, ci, k, k)))
        b = const(out + "_b", RNG.normal(0, 0.1, co))
        nodes.append(helper.make_node("Conv", [x, w, b], [out], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        return out

    def node(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    # 37 * 9 taps: the blocked kernel on every target
    a = node("Relu", [conv("x", "a0", 37, 45, 3, 1, 1)], "a")
    ab = node("Relu", [node("Add", [conv(a, "b", 45, 45, 3, 1, 1), a], "ab0")], "ab")
    r = node("Relu", [conv(ab, "e", 45, 45, 3, 1, 1)], "r")
    p = node("MaxPool", [r], "p", kernel_shape=[2, 2], strides=[2, 2])
    c = node("Clip", [conv(p, "c0", 45, 40, 3, 2, 1), const("lo", np.array(0.0)),
                      const("hi", np.array(6.0))], "c")
    s = conv(p, "s", 45, 40, 1, 2, 0)
    node("Concat", [c, s], "cat", axis=1)
    flat = node("Flatten", [node("GlobalAveragePool", [r], "gap")], "flat", axis=1)
    node("Gemm", [flat, const("fc_w", RNG.normal(0, 0.2, (10, 45))),
                  const("fc_b", RNG.normal(0, 0.1, 10))], "logits", transB=1)
    q = node("Sigmoid", [conv("y", "q0", 3, 13, 1, 2, 0)], "q")
    t = node("Relu", [conv(q, "t0", 13, 20, 1, 2, 0)], "t")
    conv(t, "u", 20, 20, 3, 1, 1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 37, 9, 9]),
              helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 9, 9])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("cat", "logits", "u", "r")]
    return kernel_checks.branches_model("nchwc", nodes, inputs, outputs, inits)


MODEL = build_model()
CASES = ["concat", "gap+gemm", "13 channels", "residual output"]
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
FEEDS = CHECKS.feeds
native = CHECKS.native_fixture(graph_pipeline="nchwc")


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return CHECKS.reference()


def blocked_module(lanes: int) -> kiln.ir.IRModule:
    mod = from_onnx(MODEL)
    for p in parse_passes(BEFORE):
        mod = p(mod)
    return parse_passes(f"nchwc-layout{{lanes={lanes}}}")[0](mod)


def ops(mod: kiln.ir.IRModule) -> list[str]:
    return [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]


def test_the_pass_keeps_conv_chains_blocked() -> None:
    mod = blocked_module(8)
    names = ops(mod)
    # two regions: the residual block, the pool and the two convolutions after it;
    # the 13-channel chain
    assert names.count("conv2d_nchwc") == 8 and "conv2d_blocked" not in names
    transforms = [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)
                  and b.value.op == "layout_transform"]
    # in: x (y's 3 channels, fewer than a block, are read in place by their convolution,
    # which writes NCHW8c: `_reads_nchw`); out: r (the output), the global pool (read by
    # Flatten), the concat, u
    assert sorted(t.attrs["dst"] for t in transforms) == ["NCHW"] * 4 + ["NCHW8c"]
    assert [c.value.attrs.get("block") for c in mod["main"].bindings
            if isinstance(c.value, g.Call)
            and c.value.op == "conv2d_nchwc" and c.value.args[0].type.ndim == 4] == [8]
    assert all(b.value.args[0].type.ndim == 5 for b in mod["main"].bindings
               if isinstance(b.value, g.Call) and b.value.op == "conv2d_nchwc"
               and "block" not in b.value.attrs)
    assert all(t.ret_type.shape[-1] == 8 for t in transforms if t.attrs["dst"] != "NCHW")
    # the residual Add, the activations, the max and global pools and the concat (40 + 40
    # channels: whole blocks) run on the blocked tensors
    blocked = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)
               and b.var.type.ndim == 5 and b.value.op not in ("conv2d_nchwc",
                                                                "layout_transform")]
    assert sorted(blocked) == ["add", "clip", "concat", "pool2d_nchwc", "reduce_mean", "relu",
                               "relu", "relu", "relu", "sigmoid"]


def test_regions_that_do_not_pay_stay_nchw() -> None:
    mod = from_onnx(MODEL)
    for p in parse_passes(BEFORE):
        mod = p(mod)
    # five convolutions per region at most: none is kept with a minimum of six
    kept = parse_passes("nchwc-layout{lanes=8 min_convs=6}")[0](mod)
    assert "conv2d_nchwc" not in ops(kept) and "layout_transform" not in ops(kept)
    # the 13-channel chain (3 convolutions, 2 reorders) is kept with a minimum of three
    kept = parse_passes("nchwc-layout{lanes=8 min_convs=3}")[0](mod)
    assert ops(kept).count("conv2d_nchwc") == 8


def test_the_block_follows_the_target() -> None:
    with Target("llvm -mcpu=skylake-avx512"):
        mod = from_onnx(MODEL)
        for p in parse_passes(BEFORE + ",nchwc-layout"):
            mod = p(mod)
    text = mod.script()
    assert 'dst="NCHW16c"' in text and 'dst="NCHW8c"' not in text


def test_aarch64_compiles_with_neon_blocks() -> None:
    target = Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon")
    ex = kiln.compile(from_onnx(MODEL), target, graph_pipeline="nchwc")
    kernels = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc"]
    # NEON's 4 float32 lanes: outputs (the last buffer parameter; a dimension scalar may
    # follow it: kiln.kernels.conv.run_time_width) in blocks of 4 channels
    assert kernels and all(f.buffer_params[-1].shape[-1] == 4 for f in kernels)


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    kinds = [f.attrs.get("kiln.conv_kernel") for f in native.ir.functions.values()]
    assert kinds.count("conv2d_nchwc") >= 1
    CHECKS.assert_close(native(*FEEDS.values()), reference)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    threads: int, reference: list[np.ndarray]) -> None:
    got = outputs_in_fresh_process(native, FEEDS, tmp_path, threads)
    CHECKS.assert_close(got, reference)


def test_interpreter_and_dsl_round_trip(reference: list[np.ndarray]) -> None:
    mod = blocked_module(8)
    back = from_source(mod.script())
    assert_structural_equal(back, mod)
    got = kiln.evaluate(back, "main", *FEEDS.values())
    CHECKS.assert_close(got, reference)


def test_layout_transform_round_trip() -> None:
    x = RNG.standard_normal((2, 13, 3, 5)).astype(np.float32)
    blocked = layout.to_blocked(x, 8)
    assert blocked.shape == (2, 2, 3, 5, 8)
    assert not blocked[:, 1, :, :, 5:].any()  # channels 13..15 are zero padding
    np.testing.assert_array_equal(blocked[:, 1, 2, 4, :5], x[:, 8:, 2, 4])
    np.testing.assert_array_equal(layout.from_blocked(blocked, 13), x)


@pytest.mark.parametrize("attrs", [
    {"src": "NCHW", "dst": "NHWC"}, {"src": "NCHW", "dst": "NCHW"},
    {"src": "NCHW8c", "dst": "NCHW"}, {"src": "NCHW8c", "dst": "NCHW", "channels": 17},
])
def test_bad_layout_transforms_are_refused(attrs: dict[str, object]) -> None:
    from kiln.errors import IRError
    from kiln.ir.types import TensorType
    from kiln.ops.registry import get_op

    with pytest.raises(IRError, match="layout_transform"):
        get_op("layout_transform").infer_type([TensorType((1, 2, 3, 3, 8), "float32")],
                                              g.freeze_attrs(attrs))


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_symbolic_batch_runs_natively(target: str) -> None:
    """One library for every batch, blocked regions included (llvm and c); the batch
    stays the outer loop: the hand-built kernels take it as their trailing dim scalar."""
    model = onnx.ModelProto()
    model.CopyFrom(MODEL)
    for v in model.graph.input:
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    ex = kiln.compile(from_onnx(model), target, graph_pipeline="nchwc")
    kernels = [f for f in ex.ir.prim_funcs().values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc"]
    # (a kernel over a run-time input width takes that count too: run_time_width)
    assert kernels and all("N" in [p.name for p in f.params[len(f.buffer_params):]]
                           for f in kernels)
    for batch in (1, 3):
        feeds = {k: np.concatenate([v, v])[:batch] for k, v in FEEDS.items()}
        want = onnxruntime_outputs(model, feeds)
        got = ex["main"](*feeds.values())
        CHECKS.assert_close(got, want)
