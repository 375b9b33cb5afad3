"""Depthwise and grouped int8 convolutions on vector tiles (kiln/kernels/int8/grouped.py).

QLinearConv with several groups and a QDQ depthwise block (quantized by onnxruntime's
own quantizer, per-channel weights) compile to `qlinear_conv_grouped` and equal
onnxruntime's int8 outputs exactly: u8 and s8 activations, stride 1 and 2, pads read as
the input's zero point, a channel multiplier, a fused ReLU range, partial vector tiles,
and the plane kernel (narrow stride-1 rows; stride 2 on row and column phases), llvm
and c.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from quantized_models import integer_outputs, qlinear_conv_model, quantize_static_model

import kiln
from kiln.frontend import from_onnx
from kiln.kernels.int8.grouped import (
    conv_shape,
    plane_block,
    plane_geometry,
    plane_pair,
)
from kiln.kernels.tiles import tile_lanes, tile_registers
from kiln.script import print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs, onnxruntime_saturates

ort = pytest.importorskip("onnxruntime")


def _ops(model: onnx.ModelProto) -> Counter[str]:
    text = print_module(QuantizeOps()(from_onnx(model)))
    return Counter(op for op in ("qlinear_conv_grouped", "qlinear_conv_packed")
                   if op in text)


@pytest.mark.parametrize(("shape", "oc", "group", "k", "stride", "pad", "signed", "extra"), [
    ((1, 24, 19, 21), 24, 24, 3, 1, 1, False, {}),  # depthwise: a row of 21 = 16 + 5 lanes
    ((1, 16, 20, 37), 16, 16, 3, 2, 1, True, {}),   # stride 2 (column phases), s8
    ((2, 6, 9, 8), 12, 3, 3, 2, 0, False, {"dilation": 2}),  # grouped 2 -> 4, batch 2
    ((1, 8, 7, 7), 16, 8, 5, 1, 2, False, {"w_zero": 3}),    # multiplier 2, int16 weight
])
def test_grouped_qlinear_conv_equals_onnxruntime(shape: tuple[int, int, int, int], oc: int,
                                                 group: int, k: int, stride: int, pad: int,
                                                 signed: bool, extra: dict[str, int]) -> None:
    rng = np.random.default_rng(11)
    model = qlinear_conv_model(shape, oc, k, stride, pad, signed, rng, group=group, **extra)
    assert _ops(model) == Counter({"qlinear_conv_grouped": 1})
    lo, hi, q = (-128, 128, np.int8) if signed else (0, 256, np.uint8)
    x = rng.integers(lo, hi, shape).astype(q)
    x[0, :, 0, :] = hi - 1  # the largest bytes on the padded border rows
    ex = kiln.compile(from_onnx(model), like_onnxruntime("llvm"))
    if onnxruntime_saturates() and extra.get("w_zero") and not signed:
        # onnxruntime's saturating pairs of raw weights, then its zero-point terms: kiln
        # stays exact there (docs/quantization.md), as ONNX's reference computes
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    else:
        want = onnxruntime_outputs(model, {"x": x})[0]
    np.testing.assert_array_equal(ex["main"](x), want)


# AVX2 (8 int32 lanes) and AVX-512 (16): the plane kernel, its rows of 7 stored as 8-byte
# vectors (each spilling onto the next row, the last row exact); on AVX-512 the 7x7 tiles
# are one chunk, so a tile computes two channels side by side (`plane_pair`)
PLANE_TARGETS = ("llvm -mcpu=x86-64-v3", "c -mcpu=x86-64-v3")
# 7x7 rows (MobileNetV2's last blocks): s8, a channel multiplier of 2, dilation 2 (taps
# two plane rows apart), the last tile reading past the image into the tail
PLANE_7X7 = ((1, 4, 7, 7), 8, 1, 2, True, 2)
# stride 2 on row and column phases: odd sizes (an odd row padded to an even width, a
# last row phase one row short), u8, the pads read as the zero point; rows of 5
PLANE_STRIDED = ((1, 3, 11, 9), 3, 2, 1, False, 1)


@pytest.mark.parametrize(("target", "shape", "oc", "stride", "pad", "signed", "dilation"), [
    *((target, *case) for target in PLANE_TARGETS for case in (PLANE_7X7, PLANE_STRIDED)),
    *((target, *PLANE_7X7) for target in ("llvm -mcpu=x86-64-v4", "c -mcpu=x86-64-v4")),
])
def test_depthwise_planes_equal_onnxruntime(target: str, shape: tuple[int, int, int, int],
                                            oc: int, stride: int, pad: int, signed: bool,
                                            dilation: int) -> None:
    isa = isa_for(Target(target))
    if not isa.features <= isa_for(Target.from_host()).features:
        pytest.skip(f"{target}: this host cannot run it")
    c = shape[1]
    attrs = {"group": c, "pads": (pad,) * 4, "dilations": (dilation,) * 2,
             "strides": (stride,) * 2}
    geometry = conv_shape(shape, (oc, 1, 3, 3), attrs)
    assert geometry is not None
    planes = plane_geometry(geometry, tile_lanes(isa, "int32"))
    assert planes is not None
    pair = plane_pair(planes, plane_block(c, planes.phase_size * stride), tile_registers(isa))
    assert pair == (2 if isa.vector_bits == 512 and stride == 1 else 1)
    rng = np.random.default_rng(13)
    model = qlinear_conv_model(shape, oc, 3, stride, pad, signed, rng, group=c,
                               dilation=dilation)
    lo, hi, q = (-128, 128, np.int8) if signed else (0, 256, np.uint8)
    x = rng.integers(lo, hi, shape).astype(q)
    x[0, :, -1, :] = hi - 1  # the largest bytes beside the bottom and right pads
    x[0, :, :, -1] = hi - 1
    ex = kiln.compile(from_onnx(model), target)
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


def _depthwise_block() -> onnx.ModelProto:
    """MobileNetV2's depthwise step: a 3x3 depthwise conv (stride 2) + ReLU6, then a 1x1."""
    rng = np.random.default_rng(3)
    c = 16
    b = GraphBuilder()
    b.consts({"wd": rng.standard_normal((c, 1, 3, 3)).astype(np.float32),
              "bd": rng.standard_normal(c).astype(np.float32) * 0.1,
              "wp": rng.standard_normal((8, c, 1, 1)).astype(np.float32) * 0.3,
              "lo": np.float32(0), "hi": np.float32(6)})
    b.node("Conv", ["x", "wd", "bd"], ["d"], group=c, strides=[2, 2], pads=[1, 1, 1, 1])
    b.node("Clip", ["d", "lo", "hi"], ["r"])
    b.node("Conv", ["r", "wp"], ["y"])
    b.input("x", [1, c, 18, 18])
    b.output("y", [1, 8, 9, 9])
    return b.model(opset=13)


def test_qdq_depthwise_block_equals_onnxruntime() -> None:
    # onnxruntime's quantizer: per-channel weights, the ReLU6 fused as the output range
    # (the QLinearConv form is the single-node test above), rows of 9
    model = integer_outputs(quantize_static_model(_depthwise_block(), "QDQ"))
    assert _ops(model)["qlinear_conv_grouped"] == 1
    x = np.random.default_rng(5).standard_normal((1, 16, 18, 18)).astype(np.float32)
    # the host's vectors: the plane kernel wherever int32 vectors have 8 lanes or more
    ex = kiln.compile(from_onnx(model), like_onnxruntime(Target.from_host()))
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


def test_depthwise_plane_rounds_ties_to_even() -> None:
    # a requantization multiplier of exactly 0.5 makes every odd accumulator a tie, which
    # the plane kernel's rounding by ROUNDING_MAGIC must take to even as onnxruntime
    # does; two channels' biases push them onto the clamp bounds (the C backend's planes:
    # the tests above)
    host = Target.from_host()
    if plane_geometry(conv_shape((1, 8, 7, 7), (8, 1, 3, 3), {"group": 8, "pads": (1,) * 4}),
                      tile_lanes(isa_for(host), "int32")) is None:
        pytest.skip("this host's vectors have fewer than 8 int32 lanes: no plane kernel")
    rng = np.random.default_rng(17)
    model = qlinear_conv_model((1, 8, 7, 7), 8, 3, 1, 1, False, rng, group=8)
    small = {"xs": np.float32(0.5), "ws": np.ones(8, np.float32), "ys": np.float32(1.0),
             "w": rng.integers(-1, 2, (8, 1, 3, 3)).astype(np.int8),
             "b": np.r_[400, -400, rng.integers(-20, 21, 6)].astype(np.int32)}
    for init in model.graph.initializer:
        if init.name in small:
            init.CopyFrom(onnx.numpy_helper.from_array(small[init.name], init.name))
    x = rng.integers(111, 152, (1, 8, 7, 7)).astype(np.uint8)  # the zero point 131 +- 20
    y = kiln.compile(from_onnx(model), host)["main"](x)
    expected = onnxruntime_outputs(model, {"x": x})[0]
    np.testing.assert_array_equal(y, expected)
    assert {0, 255} <= set(np.unique(y)) and len(np.unique(y)) > 20
