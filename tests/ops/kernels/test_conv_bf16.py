"""The bfloat16 NCHWc convolution (`host -precision=bf16`: kiln.ops.conv_bf16,
kiln.kernels.conv.bf16) against float32 onnxruntime.

Tolerance: bfloat16 keeps 8 significant bits (a relative rounding error up to 2^-9 on
each of the input and the weight), so each product is off by up to about 4e-3 relative;
on random data the errors have random signs and a chain of five layers comes out near
4e-3 relative L2 from float32 (each layer's input rounded again). 1e-2 leaves margin
for it and catches any wrong pairing, packing or border (errors near 1).

One model, compiled once, holds the kernel's cases: a padded 5x3 layer with bias and
ReLU reading the NCHW input of 3 channels in place (a region's first layer: channels
paired (0, 1) and (2, zero)) and beside it a 7x7 layer with asymmetric pads on the same
input (neighbouring kernel columns paired: `row_taps`), added into the first, a 1x1
layer 48 > 48 with a residual Add (one channel tile: each tile of positions converts
its own input words, `stages_input`; 3 blocks, the last paired with zero), a
strided unpadded 1x1 layer (48 channels, an odd count of blocks, paired within each
block: the 1x1 layer's residual Add stores them so, `half_words`, and the strided layer
reads every other position's), a 3x3 layer with a residual Add, a 3x3
layer to 256 channels (weights large enough that each tile prefetches the next channel
tile's), a 1x1 layer to 24 channels (a partial output block; one channel tile, staged
too, rather than over a run-time width), a
strided 3x3 layer with asymmetric pads (its 24 channels in word rows of 4 lanes), over
an image of 13x11 (tiles past its end) and a symbolic batch; then an LRN on the blocked
result (`lrn_nchwc`, 40 channels in blocks of 16), whose `s ** -0.75` a `precision=bf16`
target takes by square roots.
A second input runs Whisper's front: two Conv1d layers
(the second strided) each with an exact GELU, a region of two layers and two reorders;
a third one of ShuffleNet's grouped 1x1 layers and its channel shuffle
(`conv2d_group_gemm` in bfloat16, stored shuffled: kiln.kernels.conv.grouped_bf16).
A fourth input runs a bottleneck twice (`_bottlenecks`): once with each layer storing the
next one's bfloat16 words (kiln.transform.bf16_words), once converting float32 values;
and a bottleneck with depthwise layers twice (`_depthwise_bottlenecks`): once with each
depthwise layer storing the next convolution's words, once converting float32 values.
The host must have AVX512-BF16 (the test machine, an AMD EPYC Zen 5, has it); elsewhere
the run test skips.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

import kiln
from kiln.errors import TargetError
from kiln.frontend import from_onnx
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_ARG_DIMS
from kiln.ir.visitor import iter_exprs, iter_stmts
from kiln.kernels.conv.bf16 import TWO_VECTOR_8_POSITIONS, WORDS_NAME, bf16_tile
from kiln.kernels.conv.nchwc import pointwise_tile
from kiln.kernels.conv.run_time_width import WIDTH_NAME
from kiln.kernels.tiles import tile_lanes, tile_registers
from kiln.ops.conv_bf16 import (
    pack_conv_bf16,
    pack_row_taps,
    stem_stays_float32,
    unpack_conv_bf16,
    unpack_row_taps,
)
from kiln.ops.conv_geometry import conv_shape
from kiln.ops.conv_nchwc_depthwise import halves_order, pack_weight
from kiln.ops.gemm_bf16 import bf16_round
from kiln.runtime import load_module, swap
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

RNG = np.random.default_rng(63)
TOL = 1e-2  # against float32 (see the module docstring)
CONVS = 21  # kernels: the bottlenecks share their first 1x1 layer's


def _weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _model() -> Any:
    b = GraphBuilder()
    x = b.input("x", ("N", 3, 13, 11))
    wide = b.op("Conv", x, b.const(_weight(48, 3, 7, 7)), pads=[3, 2, 3, 4])
    # 5x3, not 3x3: a 3x3 stride-1 first layer stays float32 (`stem_stays_float32`)
    y = b.op("Relu", b.op("Add", b.op("Conv", x, b.const(_weight(48, 3, 5, 3)),
                                      b.const(_weight(48)), pads=[2, 1, 2, 1]), wide))
    y = b.op("Add", y, b.op("Conv", y, b.const(_weight(48, 48, 1, 1))))
    y = b.op("Conv", y, b.const(_weight(64, 48, 1, 1)), strides=[2, 2])
    y = b.op("Add", y, b.op("Conv", y, b.const(_weight(64, 64, 3, 3)),
                            b.const(_weight(64)), pads=[1, 1, 1, 1]))
    # 295 KB of weight words over 7x6 positions: the tiles prefetch the next channel
    # tile's weights (`prefetches_bf16_weights`; the last one its own)
    y = b.op("Conv", y, b.const(_weight(256, 64, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("Conv", y, b.const(_weight(24, 256, 1, 1)))
    y = b.op("Relu", b.op("Conv", y, b.const(_weight(40, 24, 3, 3)), strides=[2, 2],
                          pads=[0, 1, 1, 0]))
    # LRN on the NCHW result, its scales well past 1 (kiln.kernels.lrn by square roots)
    b.node("LRN", [y], ["out"], size=3, alpha=1.5, beta=0.75, bias=1.0)
    b.output("out", ("N", 40, 3, 3))
    a = b.input("a", ("N", 20, 9))
    a = _gelu(b, b.op("Conv", a, b.const(_weight(24, 20, 3)), b.const(_weight(24)),
                      pads=[1, 1]))
    a = _gelu(b, b.op("Conv", a, b.const(_weight(24, 24, 3)), b.const(_weight(24)),
                      pads=[1, 1], strides=[2]))
    b.node("Transpose", [a], ["a_out"], perm=[0, 2, 1])
    b.output("a_out", ("N", 5, 24))
    # a ShuffleNet pointwise layer: 3 groups of 37 channels (K a whole pair block, then
    # 5 values paired 3 apart: the compact tail, odd) over 60 positions (a partial last
    # panel), bias, ReLU, the channel shuffle (stored shuffled) and a residual Add (an
    # epilogue load through the flat view, at the shuffled channel)
    g = b.input("g", (1, 111, 7, 7))
    y = b.op("Relu", b.op("Conv", g, b.const(_weight(111, 37, 1, 1)), b.const(_weight(111)),
                          group=3))
    y = b.op("Reshape", y, b.const(np.array([1, 3, 37, 7, 7], np.int64)))
    y = b.op("Transpose", y, perm=[0, 2, 1, 3, 4])
    y = b.op("Reshape", y, b.const(np.array([1, 111, 7, 7], np.int64)))
    b.node("Add", [y, g], ["g_out"])
    b.output("g_out", (1, 111, 7, 7))
    _depthwise_bottlenecks(b, _bottlenecks(b))
    return b.model()


def _bottlenecks(b: GraphBuilder) -> Any:
    """A bottleneck twice over the same weights: a 1x1 layer and ReLU, a 3x3 layer with
    pads (1, 0, 1, 2) and ReLU, concatenated with a 1x1 layer and ReLU on the input and
    its 3x3 max pool, a 1x1 layer. In the first (output `words`) each value between
    layers is read by the next layer only: each layer stores the next one's words
    (kiln.transform.bf16_words: into its border, then as one row of positions; the 3x3
    layer and the pool each into its part of the concat's words); in the second
    (`floats`) each is also a result, so stays float32 and is converted by the layer
    reading it."""
    x = b.input("r", (1, 32, 6, 7))
    w1, b1, w2, b2, w3, w4 = (b.const(_weight(32, 32, 1, 1)), b.const(_weight(32)),
                              b.const(_weight(32, 32, 3, 3)), b.const(_weight(32)),
                              b.const(_weight(32, 64, 1, 1)), b.const(_weight(32, 32, 1, 1)))
    for name in ("words", "floats"):
        y = b.op("Relu", b.op("Conv", x, w1, b1))
        z = b.op("Relu", b.op("Conv", y, w2, b2, pads=[1, 0, 1, 2]))
        side = b.op("Relu", b.op("Conv", x, w4))
        pooled = b.op("MaxPool", side, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        b.node("Conv", [b.op("Concat", z, pooled, axis=1), w3], [name])
        b.output(name, (1, 32, 6, 7))
    for value, name, shape in ((y, "y", (1, 32, 6, 7)), (z, "z", (1, 32, 6, 7)),
                               (pooled, "pooled", (1, 32, 6, 7))):
        b.node("Identity", [value], [name])
        b.output(name, shape)
    return x


def _depthwise_bottlenecks(b: GraphBuilder, x: Any) -> None:
    """A bottleneck twice over the same weights on `x`: a 1x1 layer and ReLU, a depthwise
    3x3 layer, a 3x3 layer with pads (1, 0, 2, 1) and ReLU, a depthwise 3x3 layer with bias
    and ReLU6, a 1x1 layer. In the first (output `dwords`) each value between layers is
    read by the next layer only: each depthwise layer stores the next convolution's words
    (kiln.transform.bf16_words: into the 3x3 layer's border, then as one row of positions,
    as MobileNetV2's before their projections); in the second (`dfloats`) each is also a
    result, so stays float32 and is converted by the layer reading it."""
    w1, b1, d1, w2, b2, d2, bd, w3 = (
        b.const(_weight(32, 32, 1, 1)), b.const(_weight(32)), b.const(_weight(32, 1, 3, 3)),
        b.const(_weight(32, 32, 3, 3)), b.const(_weight(32)), b.const(_weight(32, 1, 3, 3)),
        b.const(_weight(32)), b.const(_weight(32, 32, 1, 1)))
    six = (b.const(np.float32(0.0)), b.const(np.float32(6.0)))
    for name in ("dwords", "dfloats"):
        y = b.op("Relu", b.op("Conv", x, w1, b1))
        d = b.op("Conv", y, d1, pads=[1, 1, 1, 1], group=32)
        z = b.op("Relu", b.op("Conv", d, w2, b2, pads=[1, 0, 2, 1]))
        e = b.op("Clip", b.op("Conv", z, d2, bd, pads=[1, 1, 1, 1], group=32), *six)
        b.node("Conv", [e, w3], [name])
        b.output(name, (1, 32, 7, 6))
    for value, name, shape in ((y, "dy", (1, 32, 6, 7)), (d, "d", (1, 32, 6, 7)),
                               (z, "dz", (1, 32, 7, 6)), (e, "e", (1, 32, 7, 6))):
        b.node("Identity", [value], [name])
        b.output(name, shape)


def _gelu(b: GraphBuilder, y: str) -> str:
    """GELU as the exporters spell it: `0.5 * y * (1 + erf(y / sqrt(2)))`."""
    e = b.op("Erf", b.op("Div", y, b.const(np.float32(np.sqrt(2.0)))))
    return b.op("Mul", b.op("Mul", y, b.const(np.float32(0.5))),
                b.op("Add", e, b.const(np.float32(1.0))))


def _bf16_host() -> Target:
    try:
        return Target("host -precision=bf16")
    except TargetError as err:
        pytest.skip(f"this host cannot run precision=bf16: {err}")


@pytest.fixture(scope="module")
def built() -> tuple[Any, Any]:
    target = _bf16_host()
    model = _model()
    return kiln.compile(from_onnx(model), target), model


@pytest.mark.parametrize("batch", [1, 3])
def test_bf16_conv_matches_float32(built: Any, batch: int) -> None:
    ex, model = built
    feeds = {"x": RNG.standard_normal((batch, 3, 13, 11)).astype(np.float32),
             "a": RNG.standard_normal((batch, 20, 9)).astype(np.float32),
             "g": RNG.standard_normal((1, 111, 7, 7)).astype(np.float32),
             "r": RNG.standard_normal((1, 32, 6, 7)).astype(np.float32)}
    for want, got in zip(onnxruntime_outputs(model, feeds), ex["main"](*feeds.values()),
                         strict=True):
        assert got.shape == want.shape
        assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOL


def test_every_layer_runs_in_bfloat16(built: Any) -> None:
    """Every layer on the bfloat16 kernel, the Conv1d layers' GELUs fused into them; the
    LRN joins the first region (`lrn_nchwc`), which reorders only its result back."""
    ex, _ = built
    kernels = [f.attrs.get("kiln.conv_kernel") for f in ex.ir.functions.values()
               if hasattr(f, "attrs")]
    assert kernels.count("conv2d_nchwc_bf16") == CONVS
    assert "conv2d_nchwc" not in kernels
    assert "lrn_nchwc" in ex.ir.functions and "lrn" not in ex.ir.functions
    # the 64 > 256 layer prefetches weights, the smaller ones do not
    prefetching = [name for name, f in ex.ir.prim_funcs().items()
                   if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc_bf16"
                   and any(isinstance(s, t.Evaluate) and isinstance(s.value, t.Intrin)
                           and s.value.name == t.PREFETCH_INTRINSIC
                           for s in iter_stmts(f.body))]
    assert len(prefetching) == 1, prefetching
    # the 1x1 stride-1 kernels of one channel tile convert their input in their tiles
    # (one the kernel of both bottlenecks' first layers), the layers reading the words
    # their producer stored (the strided 1x1 layer, the 3x3 layer to 256 channels, the
    # 1x1 layer to 24, two of `_bottlenecks`' and two of `_depthwise_bottlenecks`') read
    # them in place, the others convert into a workspace first
    staged = [name for name, f in ex.ir.prim_funcs().items()
              if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc_bf16"
              and not any(isinstance(s, t.Allocate) and s.buffer.name == "xbf16"
                          for s in iter_stmts(f.body))]
    assert len(staged) == 13, staged
    # the 7x7 layer's weight: 3 channels x 7 rows x 4 words of column pairs (`row_taps`)
    assert any(isinstance(p, t.Buffer) and tuple(p.shape)[1:4] == (3, 7, 4)
               for f in ex.ir.prim_funcs().values() for p in f.params)
    assert sum(name.startswith("fused_conv2d_nchwc_bf16_gelu") for name in ex.ir.functions) == 2
    # the grouped 1x1 layer: its products in `vdpbf16ps` sums, the shuffle its stores
    # (the one copy left is the Conv1d output's transpose)
    assert sum(name.startswith("reshape_transpose") for name in ex.ir.functions) == 1
    grouped = [f for f in ex.ir.prim_funcs().values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_group_gemm"]
    assert len(grouped) == 1 and all(
        any(isinstance(s, t.Store) and any(isinstance(e, t.Intrin) and e.name == t.DOT2_BF16
                                           for e in iter_exprs(s.value))
            for s in iter_stmts(f.body)) for f in grouped)


def test_pack_round_trips_the_rounded_weights() -> None:
    w = _weight(40, 50, 3, 3)
    w[0, 0, 0, 0] = 1.0 + 2.0 ** -8  # a tie rounds to even
    # 50 channels in blocks of 16 or 8 pair 4 or 2 lanes (`word_block`: 7 pairs of 4 lanes
    # or 13 of 2, the fewest rows; 16 lanes would take 32)
    for block, rows in ((16, 28), (8, 26)):
        packed = pack_conv_bf16(w, 32, block)
        assert packed.shape == (2, rows, 3, 3, 32) and packed.dtype == np.int32
        back = unpack_conv_bf16(packed, 40, 50, block)
        assert back[0, 0, 0, 0] == 1.0
        np.testing.assert_array_equal(back, bf16_round(w))
    # a 7x7 first layer's neighbouring columns paired: 4 words per row, the last half zero
    w7 = _weight(40, 3, 7, 7)
    packed = pack_row_taps(w7, 32)
    assert packed.shape == (2, 3, 7, 4, 32)
    assert not (packed[:, :, :, 3].view(np.uint32) >> 16).any()
    np.testing.assert_array_equal(unpack_row_taps(packed, 40, 7), bf16_round(w7))


def test_only_a_3x3_stride_1_stem_stays_float32() -> None:
    """VGG's first layer keeps the float32 kernel; strided 3x3 stems (MobileNetV2's)
    and the model above's 5x3 and 7x7 ones take the bfloat16 kernel."""
    assert stem_stays_float32((3, 3), {}) and stem_stays_float32((3, 3), {"strides": [1, 1]})
    assert not stem_stays_float32((3, 3), {"strides": [2, 2]})
    assert not stem_stays_float32((5, 3), {}) and not stem_stays_float32((7, 7), {})


@pytest.mark.parametrize("c_out,hw,stride", [(64, 56, 1), (128, 28, 2), (512, 7, 1),
                                             (32, 28, 1), (96, 14, 1), (208, 14, 1),
                                             (16, 4, 1)])
def test_tiles_hold_enough_accumulators(c_out: int, hw: int, stride: int) -> None:
    """A 3x3 layer's tile (`bf16_tile`) holds the profile's `bf16_min_accumulators`
    where its channels and positions have them, pads no more output channels than
    one vector, is one vector wide only where the outputs are (208 channels: 2 x 10, not
    1 x 14), fits the 32 registers with its weight vectors and
    broadcasts, and covers the positions in tiles of even width; 1x1 layers keep the
    float32 pointwise rule's channels, its positions widened only where its tile holds
    fewer accumulators (1 or 2 vectors), in no more tiles."""
    isa = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver5 -precision=bf16"))
    least, lanes = isa.profile.bf16_min_accumulators, tile_lanes(isa)
    shape = conv_shape((1, 64, hw, hw), c_out, (3, 3), {"strides": (stride, stride),
                                                        "pads": (1, 1, 1, 1)})
    cb, width = bf16_tile(shape, isa)
    vectors, positions = cb // lanes, shape.out_h * shape.out_w
    assert least > 12  # above the float32 rule's 2 vectors x 6 positions
    assert cb % lanes == 0 and -(-c_out // cb) * cb - c_out <= lanes
    assert vectors >= min(2, -(-c_out // lanes))
    assert vectors * width + vectors + width <= tile_registers(isa)
    tiles = -(-positions // width)
    assert tiles * width - positions < tiles
    if vectors * width < least:  # only where the channels or positions run out
        assert vectors * (width + 1) + vectors + width + 1 > tile_registers(isa) \
            or tiles == -(-positions // (width + 1)) or c_out < least
    pointwise = replace(shape, kh=1, kw=1, pads=(0, 0, 0, 0))
    cb1, width1 = bf16_tile(pointwise, isa)
    float_cb, float_width = pointwise_tile(c_out, positions, isa)
    assert cb1 == float_cb and (width1 == float_width or (
        float_cb // lanes * float_width < least
        and -(-positions // width1) <= -(-positions // float_width)))


def test_two_vector_pointwise_tile_on_a_large_image() -> None:
    """A 1x1 layer of two vectors of outputs keeps the float32 rule's 8 positions a tile
    from `TWO_VECTOR_8_POSITIONS` on (`widened`: 10 below it); 40 > 24 channels over
    51x53 positions (a partial last tile, a partial output block) with bias and ReLU
    matches float32 onnxruntime."""
    isa = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver5 -precision=bf16"))
    lanes = tile_lanes(isa)
    for hw, width in ((51, 8), (28, 10)):
        shape = conv_shape((1, 40, hw, 53), 24, (1, 1), {})
        assert (hw * 53 >= TWO_VECTOR_8_POSITIONS) == (width == 8)
        assert bf16_tile(shape, isa) == (2 * lanes, width)
    b = GraphBuilder()
    x = b.input("x", (1, 40, 51, 53))
    b.node("Relu", [b.op("Conv", x, b.const(_weight(24, 40, 1, 1)), b.const(_weight(24)))],
           ["out"])
    b.output("out", (1, 24, 51, 53))
    model = b.model()
    ex = kiln.compile(from_onnx(model), _bf16_host())
    x = RNG.standard_normal((1, 40, 51, 53)).astype(np.float32)
    (want,) = onnxruntime_outputs(model, {"x": x})
    got = np.asarray(ex["main"](x))
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOL


def test_sapphirerapids_build_only() -> None:
    """A library for another CPU with the instructions (AMX too) builds on any host; it
    is not loaded (the loader refuses it on a host without AMX)."""
    b = GraphBuilder()
    x = b.input("x", ("N", 32, 8, 8))
    y = b.op("Conv", x, b.const(_weight(32, 32, 1, 1)))
    b.node("Conv", [y, b.const(_weight(16, 32, 3, 3))], ["y"], pads=[1, 1, 1, 1],
           strides=[2, 2])
    b.output("y", ("N", 16, 4, 4))
    target = Target("llvm -mcpu=sapphirerapids -precision=bf16")
    ex = kiln.compile(from_onnx(b.model()), target)  # the object file, not linked or loaded
    assert "conv2d_nchwc_bf16" in ex.ir.script() and "kernels.o" in ex.artifacts.inspect()


def _preactivation_model() -> Any:
    """A DenseNet-like block: each 1x1 layer reads BatchNorm + ReLU (per-channel Mul and
    Add, `[C][1][1]` and `[1][C][1][1]` constants) of the concat of earlier outputs; the
    two 1x1 layers to 128 channels (two channel tiles, a DenseNet bottleneck's) read 32
    and 64, each followed by a 3x3 layer to 32 channels."""
    b = GraphBuilder()
    x = b.input("x", ("N", 16, 4, 54))
    feats = [b.op("Conv", x, b.const(_weight(32, 16, 1, 1)))]
    for shape in [(32, 1, 1), (1, 64, 1, 1)]:
        cat = feats[0] if len(feats) == 1 else b.op("Concat", *feats, axis=1)
        scale = RNG.uniform(0.5, 1.5, shape).astype(np.float32)
        shift = RNG.uniform(-0.5, 0.5, shape).astype(np.float32)
        y = b.op("Relu", b.op("Add", b.op("Mul", cat, b.const(scale)), b.const(shift)))
        y = b.op("Relu", b.op("Conv", y, b.const(_weight(128, shape[-3], 1, 1))))
        # 144 taps over rows of 54: a row-tiled layer on float32 (SqueezeNet's)
        feats.append(b.op("Conv", y, b.const(_weight(32, 128, 3, 3)), pads=[1, 1, 1, 1]))
    b.node("Identity", [feats[-1]], ["out"])
    b.output("out", ("N", 32, 4, 54))
    return b.model()


@pytest.fixture(scope="module")
def preactivation() -> tuple[Any, Any]:
    model = _preactivation_model()
    return kiln.compile(from_onnx(model), _bf16_host()), model


def test_preactivation_batchnorm_stays_blocked(preactivation: Any) -> None:
    """The per-channel Mul/Add + ReLU between the layers run on NCHW16c as the vector
    channel-scale kernel with the Add fused (the region reorders only its input and its
    result), every convolution on the bfloat16 kernel (the 3x3 one, row-tiled on
    float32, too: left NCHW it would split the region); the output matches float32
    onnxruntime at batch 2 (the batch symbolic: the constant scale is shared). The two
    1x1 layers to 128 channels share one kernel, which takes their input's channel blocks
    and their weight's word rows at run time (`run_time_width`) and stores the 3x3
    layers' words (kiln.transform.bf16_words); it reads its input as words the
    BatchNorm + ReLU kernels stored (kiln.kernels.conv.channel_scale)."""
    ex, model = preactivation
    kernels = {name: f for name, f in ex.ir.prim_funcs().items()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc_bf16"}
    assert len(kernels) == 3
    shared = [name for name, f in kernels.items() if f.attrs.get(ATTR_ARG_DIMS)]
    assert len(shared) == 1 and kernels[shared[0]].attrs[ATTR_ARG_DIMS] == (
        (WIDTH_NAME, 0, 1), (WORDS_NAME, 1, 1)) and "bf16_words" in shared[0]
    calls = ex.ir.script()
    assert sum(calls.count(f'"{name}", [') for name in kernels) == 5
    assert sum(name.startswith("layout_transform") for name in ex.ir.functions) == 2
    # the BatchNorm + ReLU kernels store the 1x1 layers' words, which read them in place
    assert sum("channel_scale_nchwc_add_relu_bf16_words" in name
               for name in ex.ir.functions) == 2
    x = RNG.standard_normal((2, 16, 4, 54)).astype(np.float32)
    want = onnxruntime_outputs(model, {"x": x})[0]
    got = np.asarray(ex["main"](x))
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOL



def test_stored_words_match_converted_input(built: Any) -> None:
    """A layer reading the words its producer stored gives the outputs of one converting
    its float32 input itself, bit for bit (the same rounding; both match float32
    onnxruntime: `test_bf16_conv_matches_float32`). Eight kernels store words: the 1x1
    layer 48 > 48 with its residual add (half blocks, for the strided 1x1 layer), the 3x3
    layer to 64 channels with its residual add (for the 3x3 layer to 256), that layer's
    (for the 1x1 layer to 24), the first bottleneck's three (the 3x3 layer and the pool
    into a concat) and the first depthwise bottleneck's two depthwise layers (for its
    padded 3x3 layer and its last 1x1 layer)."""
    ex, _ = built
    assert sum("bf16_words" in name for name in ex.ir.functions) == 8
    assert "fused_pool2d_nchwc_bf16_words" in ex.ir.functions
    assert sum(name.startswith("fused_conv2d_nchwc_depthwise") and "bf16_words" in name
               for name in ex.ir.functions) == 2
    r = RNG.standard_normal((1, 32, 6, 7)).astype(np.float32)
    inputs = [np.zeros((1, 3, 13, 11), np.float32), np.zeros((1, 20, 9), np.float32),
              np.zeros((1, 111, 7, 7), np.float32), r]
    outputs = ex["main"](*inputs)
    for pair in (outputs[3:5], outputs[8:10]):  # `words`, `floats`; `dwords`, `dfloats`
        words, floats = (np.asarray(v) for v in pair)
        np.testing.assert_array_equal(words, floats)
        assert np.abs(words).max() > 0


def _half_block_model() -> Any:
    """MobileNetV2's odd counts of blocks twice over the same weights: a 1x1 layer 16 > 48
    and ReLU6, a depthwise 3x3 layer (48 channels, 3 blocks) and ReLU6, a 1x1 projection
    to 16 channels (one block), a 3x3 layer 16 > 48 with pads (1, 0, 1, 2) and ReLU, a
    strided depthwise 3x3 layer, a 1x1 layer 48 > 16. In the first (output `words`) each
    value between layers is read by the next layer only: each layer read by a
    convolution (both depthwise layers and the projection) stores its words of half
    blocks (`half_words`: word `v` pairs lanes `v` and `v + 8` of a block; the
    projection's into the 3x3 layer's border, the others' as one row of positions); in
    the second (`floats`) each is also a result, so stays float32 and is converted by
    the layer reading it."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 9, 10))
    w1, d1, bd, w2, w3, d2, w4 = (
        b.const(_weight(48, 16, 1, 1)), b.const(_weight(48, 1, 3, 3)), b.const(_weight(48)),
        b.const(_weight(16, 48, 1, 1)), b.const(_weight(48, 16, 3, 3)),
        b.const(_weight(48, 1, 3, 3)), b.const(_weight(16, 48, 1, 1)))
    six = (b.const(np.float32(0.0)), b.const(np.float32(6.0)))
    values = []
    for name in ("words", "floats"):
        e = b.op("Clip", b.op("Conv", x, w1), *six)
        d = b.op("Clip", b.op("Conv", e, d1, bd, pads=[1, 1, 1, 1], group=48), *six)
        p = b.op("Conv", d, w2)
        q = b.op("Relu", b.op("Conv", p, w3, pads=[1, 0, 1, 2]))
        r = b.op("Conv", q, d2, pads=[1, 1, 1, 1], strides=[2, 2], group=48)
        b.node("Conv", [r, w4], [name])
        b.output(name, (1, 16, 5, 5))
        values = [(e, (1, 48, 9, 10)), (d, (1, 48, 9, 10)), (p, (1, 16, 9, 10)),
                  (q, (1, 48, 9, 10)), (r, (1, 48, 5, 5))]
    for k, (value, shape) in enumerate(values):
        b.node("Identity", [value], [f"v{k}"])
        b.output(f"v{k}", shape)
    return b.model()


def test_half_block_words_match_converted_input() -> None:
    """Layers of an odd count of 16-lane blocks store their readers' words of half blocks
    (kiln.transform.bf16_words): the first chain's two depthwise layers (the strided one
    too) and its projection to 16 channels; the outputs of both chains are the same bit
    for bit and match float32 onnxruntime."""
    model = _half_block_model()
    ex = kiln.compile(from_onnx(model), _bf16_host())
    stores = [name for name in ex.ir.functions if "bf16_words" in name]
    assert len(stores) == 3, stores
    assert sum(name.startswith("fused_conv2d_nchwc_depthwise") for name in stores) == 2
    funcs = ex.ir.prim_funcs()  # each stores rows of 8 words (the last parameter)
    assert all(funcs[name].params[-1].dtype == "int32"
               and funcs[name].params[-1].shape[-1] == 8 for name in stores)
    x = RNG.standard_normal((1, 16, 9, 10)).astype(np.float32)
    got = [np.asarray(v) for v in ex["main"](x)]
    np.testing.assert_array_equal(got[0], got[1])
    for want, value in zip(onnxruntime_outputs(model, {"x": x}), got, strict=True):
        assert value.shape == want.shape
        assert np.linalg.norm(value - want) / np.linalg.norm(want) <= TOL


def _large_expansion_model() -> Any:
    """MobileNetV2's 112x112 expansion edge, at 56x56: a 1x1 layer 16 > 96 and ReLU6,
    whose float32 output (1.2 MB) exceeds the L2, a strided depthwise 3x3 layer and
    ReLU6, a 1x1 projection to 32 channels (two blocks: the depthwise layer stores
    its words of pairs)."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 56, 56))
    six = (b.const(np.float32(0.0)), b.const(np.float32(6.0)))
    e = b.op("Clip", b.op("Conv", x, b.const(_weight(96, 16, 1, 1)), b.const(_weight(96))),
             *six)
    d = b.op("Clip", b.op("Conv", e, b.const(_weight(96, 1, 3, 3)), b.const(_weight(96)),
                          pads=[1, 1, 1, 1], strides=[2, 2], group=96), *six)
    b.node("Conv", [d, b.const(_weight(32, 96, 1, 1))], ["out"])
    b.output("out", (1, 32, 28, 28))
    return b.model()


def test_large_expansion_stores_depthwise_words() -> None:
    """An expansion whose float32 output exceeds the L2 stores its depthwise layer's
    words of pairs of blocks, repacked from three vectors of channels a tile to two
    (kiln.transform.bf16_depthwise_words), and the depthwise layer reads them: its
    input int32 `[N][C/32][H * W][16]`; the output matches float32 onnxruntime."""
    model = _large_expansion_model()
    ex = kiln.compile(from_onnx(model), _bf16_host())
    funcs = ex.ir.prim_funcs()
    (dw,) = (f for name, f in funcs.items() if name.startswith("fused_conv2d_nchwc_depthwise"))
    assert dw.params[0].dtype == "int32"
    assert tuple(int(d) for d in dw.params[0].shape) == (1, 3, 56 * 56, 16)
    (expansion,) = (f for name, f in funcs.items()
                    if name.startswith("fused_conv2d_nchwc_bf16_clip_bf16_words"))
    assert int(expansion.params[1].shape[-1]) == 32  # the channel tile: one pair of blocks
    x = RNG.standard_normal((1, 16, 56, 56)).astype(np.float32)
    (want,) = onnxruntime_outputs(model, {"x": x})
    got = np.asarray(ex["main"](x))  # one output: the array itself
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOL


def _odd_blocks_expansion_model() -> Any:
    """MobileNetV2's 56x56 edges of 144 channels (nine blocks): a 1x1 expansion 24 > 144
    and ReLU6, whose float32 output (1.8 MB) exceeds the L2, a depthwise 3x3 layer and
    ReLU6, a 1x1 projection to 24 channels; and the same with a strided depthwise layer
    projected to 32 (each depthwise layer stores words of half blocks)."""
    b = GraphBuilder()
    x = b.input("x", (1, 24, 56, 56))
    six = (b.const(np.float32(0.0)), b.const(np.float32(6.0)))
    for stride, out, c_out in ((1, "a", 24), (2, "b", 32)):
        e = b.op("Clip", b.op("Conv", x, b.const(_weight(144, 24, 1, 1)),
                              b.const(_weight(144))), *six)
        d = b.op("Clip", b.op("Conv", e, b.const(_weight(144, 1, 3, 3)),
                              b.const(_weight(144)), pads=[1, 1, 1, 1],
                              strides=[stride, stride], group=144), *six)
        b.node("Conv", [d, b.const(_weight(c_out, 144, 1, 1))], [out])
        b.output(out, (1, c_out, 56 // stride, 56 // stride))
    return b.model()


def _matches_at_threads(ex: Any, model: Any, x: np.ndarray, tmp_path: Path) -> None:
    """`ex`'s library, loaded afresh at one and at two threads (each its own pool), gives
    the same outputs at both, within `TOL` of float32 onnxruntime's."""
    path = tmp_path / "lib.so"
    ex.export_library(path)
    runs = []
    for threads in (1, 2):
        copy = tmp_path / f"lib{threads}.so"
        shutil.copyfile(path, copy)
        out = load_module(copy, num_threads=threads)["main"](x)
        runs.append([np.asarray(v) for v in (out if isinstance(out, (list, tuple)) else [out])])
    for one, two in zip(*runs, strict=True):
        np.testing.assert_array_equal(one, two)
    for want, got in zip(onnxruntime_outputs(model, {"x": x}), runs[1], strict=True):
        assert got.shape == want.shape
        assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOL


def test_odd_blocks_expansion_stores_half_block_words(tmp_path: Path) -> None:
    """An expansion of an odd count of blocks whose float32 output exceeds the L2 stores
    its depthwise layer's words of half blocks (kiln.transform.bf16_depthwise_words),
    which the layer reads as bfloat16 values `[N][C/b][H * W][b]` in the words' order
    (weight and bias reordered so) and stores its projection's words of half blocks;
    both layers (stride 1 and 2) match float32 onnxruntime at one and two threads. The
    reordered weights' replay (a weight swap's) rebuilds them from the ONNX weights."""
    model = _odd_blocks_expansion_model()
    ex = kiln.compile(from_onnx(model), _bf16_host())
    dws = [f for name, f in ex.ir.prim_funcs().items()
           if name.startswith("fused_conv2d_nchwc_depthwise")]
    assert [(dw.params[0].dtype, tuple(int(d) for d in dw.params[0].shape)) for dw in dws
            ] == [("int32", (1, 9, 56 * 56, 8))] * 2
    _matches_at_threads(ex, model, RNG.standard_normal((1, 24, 56, 56)).astype(np.float32),
                        tmp_path)
    _, record = swap.replay_record(load_module(tmp_path / "lib1.so"))
    named = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = [c for c in record["constants"] if "op" in c and c["shape"] == [9, 3, 3, 16]]
    rebuilt = [d.view(np.float32).reshape(9, 3, 3, 16)
               for _, d in swap.rebuild(dict(record, constants=weights), named)]
    packed = [pack_weight(w, 16)[..., halves_order(16)] for w in named.values()
              if w.shape == (144, 1, 3, 3)]
    assert len(rebuilt) == 2
    assert all(any(np.array_equal(r, p) for p in packed) for r in rebuilt)


def _stem_pool_model() -> Any:
    """ResNet's stem: a 7x7/2 layer 3 > 64 and ReLU at 224x224, whose float32 output
    (3.2 MB at 112x112) exceeds the L2, a 3x3/2 max pool (pad 1), a 3x3 layer and the
    residual add that also reads the pool's output."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 224, 224))
    s = b.op("Relu", b.op("Conv", x, b.const(_weight(64, 3, 7, 7)), b.const(_weight(64)),
                          pads=[3, 3, 3, 3], strides=[2, 2]))
    p = b.op("MaxPool", s, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    c = b.op("Conv", p, b.const(_weight(64, 64, 3, 3)), pads=[1, 1, 1, 1])
    b.node("Add", [c, p], ["out"])
    b.output("out", (1, 64, 56, 56))
    return b.model()


def test_stem_stores_max_pool_words(tmp_path: Path) -> None:
    """A stem whose float32 output exceeds the L2 stores its max pool's words of pairs of
    blocks (kiln.transform.bf16_pool_words) and the pool reads them, int32
    `[N][C/32][H * W][16]`; the output matches float32 onnxruntime at one and two
    threads."""
    model = _stem_pool_model()
    ex = kiln.compile(from_onnx(model), _bf16_host())
    (pool,) = (f for name, f in ex.ir.prim_funcs().items() if name.startswith("pool2d_nchwc"))
    assert (pool.params[0].dtype, tuple(int(d) for d in pool.params[0].shape)) == (
        "int32", (1, 2, 112 * 112, 16))
    _matches_at_threads(ex, model, RNG.standard_normal((1, 3, 224, 224)).astype(np.float32),
                        tmp_path)
