"""Depthwise convolutions inside a blocked region (kiln.ops.conv_nchwc_depthwise, its
kernel kiln.kernels.conv.nchwc_depthwise, the nchwc-layout pass) against onnxruntime.

One ONNX model, a MobileNet/EfficientNet-style chain: a 3x3 convolution with ReLU, a
1x1 one, a 3x3 depthwise layer with Clip (ReLU6), a 5x5 stride-2 depthwise layer with
Swish (x * sigmoid(x)) and a squeeze-and-excitation block (global pool, 1x1
convolutions, per-channel scale), a 3x3 convolution, and a residual Add of a 3x3
dilated-2 and a 3x3 depthwise layer;
40 channels (not a multiple of 16: padding lanes on AVX-512), images 13x11 (border
columns on both sides, whole tiles and a remainder). Compiled with the `nchwc` graph
pipeline on llvm and c, run here and in a fresh process with 2 threads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.kernels.conv.blocked import Tiling
from kiln.kernels.conv.nchwc import (
    pointwise_body_isa,
    pointwise_k_blocking,
    pointwise_kernel,
    pointwise_tile,
    three_vector_tile,
)
from kiln.ops.conv_bf16 import BF16_WORDS
from kiln.ops.conv_geometry import ConvShape
from kiln.ops.conv_nchwc_depthwise import NCHWC_DEPTHWISE, halves_order, pack_weight
from kiln.ops.gemm_bf16 import bf16_round
from kiln.ops.pool_nchwc import POOL_NCHWC
from kiln.ops.registry import get_op
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.registry import parse_passes
from support.graphs import GraphBuilder
from support.numerics import assert_close
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

TOL = 1e-4
RNG = np.random.default_rng(5)
C = 40


def build_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(x: str, out: str, ci: int, co: int, k: int, stride: int = 1, pad: int = 1,
             group: int = 1, dilation: int = 1) -> str:
        w = const(out + "_w", RNG.normal(0, 1 / np.sqrt(ci // group * k * k),
                                         (co, ci // group, k, k)))
        b = const(out + "_b", RNG.normal(0, 0.1, co))
        nodes.append(helper.make_node("Conv", [x, w, b], [out], kernel_shape=[k, k],
                                      strides=[stride] * 2, pads=[pad] * 4, group=group,
                                      dilations=[dilation] * 2))
        return out

    def node(op: str, inputs: list[str], out: str) -> str:
        nodes.append(helper.make_node(op, inputs, [out]))
        return out

    a = node("Relu", [conv("x", "a0", 37, C, 3)], "a")
    p = conv(a, "p", C, C, 1, pad=0)  # 1x1: the GEMM kernel's in NCHW
    d = node("Clip", [conv(p, "d0", C, C, 3, group=C), const("lo", np.array(0.0)),
                      const("hi", np.array(6.0))], "d")
    e0 = conv(d, "e0", C, C, 5, stride=2, pad=2, group=C)
    e = node("Mul", [e0, node("Sigmoid", [e0], "e1")], "e")
    # a squeeze-and-excitation block: global pool, 1x1 convolutions, per-channel scale
    se = node("Relu", [conv(node("GlobalAveragePool", [e], "gap"), "se0", C, 8, 1, pad=0)],
              "se1")
    z = node("Mul", [e, node("Sigmoid", [conv(se, "se2", 8, C, 1, pad=0)], "se3")], "z")
    f = conv(z, "f", C, C, 3)
    node("Add", [conv(f, "g", C, C, 3, pad=2, group=C, dilation=2),
                 conv(f, "h", C, C, 3, group=C)], "y")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 37, 13, 11])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    return kernel_checks.branches_model("nchwc_depthwise", nodes, inputs, outputs, inits)


MODEL = build_model()
CHECKS = kernel_checks.KernelCases(MODEL, ["mobilenet-style chain"], TOL, RNG)
FEEDS = CHECKS.feeds
native = CHECKS.native_fixture(graph_pipeline="nchwc")
reference = CHECKS.reference_fixture()


def test_the_pass_blocks_depthwise_layers() -> None:
    mod = from_onnx(MODEL)
    for p in parse_passes("fold-constants,fold-batchnorm,block-convolutions,"
                          "nchwc-layout{lanes=8}"):
        mod = p(mod)
    names = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    # one region: every convolution blocked (the 1x1 ones too), the SE block's pool and
    # scale on the blocked tensors; one reorder in and one out
    assert names.count("conv2d_nchwc_depthwise") == 4 and names.count("conv2d_nchwc") == 5
    assert not {"conv2d_depthwise", "conv2d_gemm", "conv2d_blocked"} & set(names)
    assert names.count("reduce_mean") == names.count("channel_scale_nchwc") == 1
    assert names.count("layout_transform") == 2
    dw = [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)
          and b.value.op == "conv2d_nchwc_depthwise"]
    # weights packed into whole blocks of 8 channels, the bias padded alike
    assert all(c.args[1].type.shape[::3] == (5, 8) and c.args[2].type.shape == (40,)
               for c in dw)


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    kinds = [f.attrs.get("kiln.conv_kernel") for f in native.ir.functions.values()]
    assert kinds.count("conv2d_nchwc_depthwise") >= 3
    CHECKS.assert_close([native(*FEEDS.values())], reference)


def test_two_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                        reference: list[np.ndarray]) -> None:
    CHECKS.assert_close(outputs_in_fresh_process(native, FEEDS, tmp_path, 2), reference)


def test_pointwise_tiles_on_32_registers() -> None:
    avx512 = isa_for(Target("llvm -mcpu=skylake-avx512"))
    # the fewest padded channels, then the most vectors; the most positions that fit
    assert pointwise_tile(576, 196, avx512) == (64, 6)
    assert pointwise_tile(96, 196, avx512) == (48, 7)
    assert pointwise_tile(160, 49, avx512) == (32, 7)
    # three vectors: a broadcast per position besides (8 positions spilled)
    assert pointwise_tile(96, 112 * 112, avx512) == (48, 7)
    assert pointwise_tile(40, 143, avx512) == (48, 6)  # 7 would compute 147 positions
    assert pointwise_tile(16, 112 * 112, avx512) == (16, 8)
    # one vector below 112x112: up to 12 positions (196 in 18 tiles of 11)
    assert pointwise_tile(16, 56 * 56, avx512) == (16, 12)
    assert pointwise_tile(112, 196, avx512) == (16, 11)
    # `pointwise_body`'s layers: one tile of all the channels ends in half a vector where
    # they fill at most half of the last one
    assert pointwise_tile(24, 56 * 56, avx512, half=True) == (24, 8)
    assert pointwise_tile(40, 143, avx512, half=True) == (40, 6)
    assert pointwise_tile(44, 143, avx512, half=True) == (48, 6)
    assert pointwise_tile(160, 49, avx512, half=True) == (32, 7)  # 5 tiles
    # `even`: whole pairs of blocks a tile (a producer of words of pairs)
    assert pointwise_tile(96, 112 * 112, avx512, even=True) == (32, 8)
    assert pointwise_tile(576, 196, avx512, even=True) == (64, 6)
    assert pointwise_tile(16, 196, avx512, even=True) is None
    # 16 registers (AVX2) and NEON (4 lanes, not measured) keep the blocked kernel's rule
    assert pointwise_tile(576, 196, isa_for(Target("llvm -mcpu=haswell"))) is None
    assert pointwise_tile(576, 196, isa_for(Target("llvm -mtriple=aarch64-linux-gnu"
                                                   " -mcpu=neoverse-n1"))) is None



def test_an_input_read_by_a_region_and_an_activation() -> None:
    # `x` is reordered for the convolution; the Relu reading `x` alone belongs to no
    # region and stays NCHW (the pass once failed on it)
    b = GraphBuilder()
    x = b.input("x", [1, C, 6, 6])
    y = b.conv(b.conv(b.op("Relu", b.conv(x, C, C, 3, group=C)), C, C, 3, group=C), C, C, 3,
               group=C)
    b.output(y, [1, C, 6, 6])
    b.output(b.op("Relu", x), [1, C, 6, 6])
    mod = from_onnx(b.model())
    for p in parse_passes("fold-constants,block-convolutions,nchwc-layout{lanes=8}"):
        mod = p(mod)
    calls = [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    assert [c.op for c in calls].count("conv2d_nchwc_depthwise") == 3
    assert [c.args[0].type.ndim for c in calls if c.op == "relu"] == [5, 4]


def _ops_after(spec: str, passes: str, model: onnx.ModelProto = MODEL) -> list[str]:
    with Target(spec):
        mod = from_onnx(model)
        for p in parse_passes(passes):
            mod = p(mod)
    return [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]


def test_the_default_pipeline_blocks_depthwise_regions_on_avx2_and_avx512() -> None:
    from test_nchwc_layout import MODEL as NO_DEPTHWISE

    passes = "fold-constants,block-convolutions,nchwc-layout{depthwise_only=true}"
    for cpu in ("skylake-avx512", "haswell", "znver4 -mattr=-avx512f"):
        assert "conv2d_nchwc_depthwise" in _ops_after(f"llvm -mcpu={cpu}", passes)
        # regions without a depthwise convolution stay NCHW
        assert "layout_transform" not in _ops_after(f"llvm -mcpu={cpu}", passes,
                                                    NO_DEPTHWISE)
    # 4 lanes (NEON, SSE): not measured, NCHW
    assert "layout_transform" not in _ops_after(
        "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", passes)
    assert "layout_transform" not in _ops_after("llvm -mcpu=nehalem", passes)
    # the default's `pointwise_regions`: on AVX2 and AVX-512 regions without a depthwise
    # convolution too, with pools whose windows are clipped (pool2d_nchwc bounds its
    # taps); 4 lanes as before
    passes = passes.replace("=true}", "=true pointwise_regions=true}")
    for cpu in ("haswell", "skylake-avx512", "znver4"):
        for model in (NO_DEPTHWISE, _with_clipped_pool(NO_DEPTHWISE)):
            ops = _ops_after(f"llvm -mcpu={cpu}", passes, model)
            assert "conv2d_nchwc" in ops and "pool2d_nchwc" in ops, cpu
            assert "max_pool2d" not in ops, cpu
    assert "layout_transform" not in _ops_after("llvm -mcpu=nehalem", passes, NO_DEPTHWISE)


def _with_clipped_pool(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its max pools padded by one on every side."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.op_type == "MaxPool":
            node.attribute.append(helper.make_attribute("pads", [1, 1, 1, 1]))
    return out


def test_pointwise_kernel_on_16_registers_of_8_lanes() -> None:
    def on(spec: str) -> bool:
        return pointwise_kernel(isa_for(Target(spec)))

    assert on("llvm -mcpu=haswell") and on("llvm -mcpu=znver4 -mattr=-avx512f")
    # AVX-512 runs it with `pointwise_tile`'s tiles, the lanes a loop; NEON and SSE (4
    # lanes) keep the blocked kernel
    assert not on("llvm -mcpu=znver4") and not on("llvm -mcpu=nehalem")
    assert not on("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1")
    assert pointwise_body_isa(isa_for(Target("llvm -mcpu=znver4")))
    assert pointwise_body_isa(isa_for(Target("llvm -mcpu=haswell")))
    assert not pointwise_body_isa(isa_for(Target("llvm -mcpu=nehalem")))
    avx2 = isa_for(Target("llvm -mcpu=znver3"))
    # 3 vectors x 4 positions where tiles of three waste at most 5% of the vectors
    for channels in (24, 96, 144, 160, 320, 1280):
        assert three_vector_tile(channels, avx2) == (24, 4), channels
    # two vectors, 12.5% wasted (64: 9 for 8), a partial block: the blocked rule's tile
    for channels in (16, 32, 64, 44):
        assert three_vector_tile(channels, avx2) is None, channels
    for spec in ("llvm -mcpu=znver4", "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"):
        assert three_vector_tile(96, isa_for(Target(spec))) is None
    # K-blocked only where a tile's weights reach a quarter of the L2 (512 KB): 2048
    # input channels (196 KB), not 960 (92 KB; the 16-channel tile's small-image rule
    # blocks those)
    wide, narrow = Tiling(24, 4), Tiling(16, 6)
    layer = ConvShape(1, 960, 7, 7, 320, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
    assert pointwise_k_blocking(layer, wide, avx2, 8) is None
    assert pointwise_k_blocking(layer, narrow, avx2, 8) is not None
    assert pointwise_k_blocking(replace(layer, c_in=2048), wide, avx2, 8) is not None


def _pointwise_model() -> onnx.ModelProto:
    """1x1 layers around a depthwise one, the default pipeline's region on AVX2: input
    channels 21 (two whole blocks of 8 and 5 lanes) and 44, outputs 44 (a padded last
    block), 21 (the tile's second vector past the last block) and 16; 9x7 = 63
    positions (a last tile with slots past the end; 7 columns: too few for the
    row-tiled kernel); a bias, ReLU, Clip and a residual Add in the epilogues; 21 > 512
    on AVX2's three-vector tiles (`three_vector_tile`, its last tile two vectors past
    the channels, summed position by position); the last a stride-2 1x1 layer (5x4
    positions read in place) of 512 input channels, whose 32 KB of weights per tile's
    channels K-block its sums (`pointwise_k_blocking`)."""
    b = GraphBuilder(seed=11)
    x = b.input("x", [1, 21, 9, 7])
    a = b.op("Relu", b.conv(x, 21, 44, 1))
    d = b.op("Clip", b.conv(a, 44, 44, 3, group=44), b.const(np.float32(0.0), "lo"),
             b.const(np.float32(6.0), "hi"))
    y = b.op("Add", b.conv(d, 44, 21, 1), x)
    wide = b.op("Relu", b.conv(y, 21, 512, 1))
    b.output(b.conv(wide, 512, 16, 1, stride=2, bias=False), [1, 16, 5, 4])
    return b.model()


POINTWISE = _pointwise_model()


@pytest.mark.parametrize("kind", NATIVE_TARGETS)
def test_pointwise_layers_of_a_default_region_match_onnxruntime(kind: str) -> None:
    target = native_target(kind)
    feeds = {"x": RNG.standard_normal((1, 21, 9, 7)).astype(np.float32)}
    exe = kiln.compile(from_onnx(POINTWISE), target)
    kinds = [f.attrs.get("kiln.conv_kernel") for f in exe.ir.functions.values()]
    if kind != "c" and pointwise_kernel(isa_for(target)):
        assert kinds.count("conv2d_nchwc") == 4 and "conv2d_nchwc_depthwise" in kinds
    assert_close([np.asarray(exe(*feeds.values()))], onnxruntime_outputs(POINTWISE, feeds),
                 TOL, ["pointwise"])


def _stem_model() -> onnx.ModelProto:
    """A first layer on 3 channels (3x3/2 with BatchNorm and Clip: the row-tiled kernel
    outside a region) before a depthwise layer and a 1x1 one; 33x35 -> 17x18."""
    b = GraphBuilder(seed=12)
    x = b.input("x", [1, 3, 33, 35])
    s = b.relu6(b.bn(b.conv(x, 3, 24, 3, stride=2, bias=False), 24))
    d = b.relu6(b.conv(s, 24, 24, 3, group=24))
    b.output(b.conv(d, 24, 16, 1), [1, 16, 17, 18])
    return b.model()


STEM = _stem_model()


@pytest.mark.parametrize("cpu", ["skylake-avx512", "haswell"])
def test_a_first_layer_on_3_channels_writes_the_blocked_layout(cpu: str) -> None:
    passes = ("fold-constants,fold-batchnorm,block-convolutions,"
              "nchwc-layout{depthwise_only=true}")
    with Target(f"llvm -mcpu={cpu}"):
        mod = from_onnx(STEM)
        for p in parse_passes(passes):
            mod = p(mod)
    calls = [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    # no reorder into the region: the first layer reads the NCHW image in place
    assert [c.attrs["dst"] for c in calls if c.op == "layout_transform"] == ["NCHW"]
    lanes = 16 if cpu == "skylake-avx512" else 8
    first = calls[0]
    assert first.op == "conv2d_nchwc" and first.args[0].type.shape == (1, 3, 33, 35)
    assert first.ret_type.shape == (1, 24 // lanes + (24 % lanes > 0), 17, 18, lanes)


@pytest.mark.parametrize("kind", NATIVE_TARGETS)
def test_a_first_layer_on_3_channels_matches_onnxruntime(kind: str) -> None:
    feeds = {"x": RNG.standard_normal((1, 3, 33, 35)).astype(np.float32)}
    exe = kiln.compile(from_onnx(STEM), native_target(kind))
    if kind != "c":  # (NCHW{b}c regions on vector ISAs of 8 lanes or more)
        reads = [tuple(f.params[0].shape) for f in exe.ir.functions.values()
                 if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc"]
        assert (1, 3, 33, 35) in reads
    assert_close([np.asarray(exe(*feeds.values()))], onnxruntime_outputs(STEM, feeds),
                 TOL, ["stem"])


def test_words_input_reference_reads_the_rounded_values() -> None:
    """`conv2d_nchwc_depthwise` with `words_input` (kiln.ops.conv_nchwc_depthwise) on the
    words `bf16_words` (`flat`) stores of a float32 NCHW16c value gives the output of
    the float32 call on that value rounded to bfloat16."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 6, 5, 16)).astype(np.float32)
    wp = pack_weight(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), 16)
    attrs = {"channels": 32, "group": 32, "pads": [1, 1, 1, 1], "strides": [2, 2]}
    words = get_op(BF16_WORDS).reference(x, pads=(0, 0, 0, 0), flat=True)
    assert words.shape == (1, 1, 30, 16)
    dw = get_op(NCHWC_DEPTHWISE).reference
    got = dw(words, wp, **attrs, words_input=(6, 5))
    np.testing.assert_array_equal(got, dw(bf16_round(x), wp, **attrs))


def test_half_words_input_reference_reads_the_rounded_values() -> None:
    """With `half_words` too, the depthwise call reads words of half blocks (an odd count
    of blocks) and its weight and bias in the words' lane order (`halves_order`): the
    output of the float32 call on the value rounded to bfloat16 (the reference and the
    tensor-expression definition)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 6, 5, 16)).astype(np.float32)
    wp = pack_weight(rng.standard_normal((48, 1, 3, 3)).astype(np.float32), 16)
    bias = rng.standard_normal(48).astype(np.float32)
    attrs = {"channels": 48, "group": 48, "pads": [1, 1, 1, 1], "strides": [1, 1]}
    words = get_op(BF16_WORDS).reference(x, pads=(0, 0, 0, 0), flat=True, half_words=True)
    assert words.shape == (1, 3, 30, 8)
    order = halves_order(16)
    lanes = dict(attrs, words_input=(6, 5), half_words=True)
    dw = get_op(NCHWC_DEPTHWISE)
    want = dw.reference(bf16_round(x), wp, bias, **attrs)
    got = dw.reference(words, np.ascontiguousarray(wp[..., order]),
                       bias.reshape(3, 16)[:, order].reshape(-1), **lanes)
    np.testing.assert_array_equal(got, want)


def test_pool_words_input_reference_reads_the_rounded_values() -> None:
    """`pool2d_nchwc` with `words_input` (kiln.ops.pool_nchwc) pools the bfloat16 values
    of the words `bf16_words` (`flat`) stores: the float32 pool of the rounded value."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 7, 6, 16)).astype(np.float32)
    attrs = {"pool": "max_pool2d", "kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
             "strides": [2, 2]}
    words = get_op(BF16_WORDS).reference(x, pads=(0, 0, 0, 0), flat=True)
    pool = get_op(POOL_NCHWC).reference
    np.testing.assert_array_equal(pool(words, **attrs, words_input=(7, 6)),
                                  pool(bf16_round(x), **attrs))
