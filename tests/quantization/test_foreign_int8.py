"""Models quantized by other people, as the ONNX model zoo ships them, against
onnxruntime's default session, bit for bit (docs/quantization.md, "Files quantized by
others").

The float models are zoo-style: IR version 3 with every initializer also listed as a
graph input (or the current IR version), Conv with a bias then BatchNormalization and
Relu, MaxPool, residual Add, GlobalAveragePool, Flatten and Gemm (a ResNet v1), Fire
modules with Concat, Dropout and a Softmax head (a SqueezeNet 1.1), at opsets 10 to
21. onnxruntime's quantizer quantizes them as users do (quantize_static without
pre-processing: QDQ and QOperator, per tensor and per channel, uint8 and int8
activations and weights, reduce_range, its extra options), keeping the IR version and
adding scales and zero points as initializers only. kiln's outputs, quantized and
dequantized, must equal onnxruntime's exactly: which QDQ groups onnxruntime fuses into
integer kernels and which it computes in float follows its int8-to-uint8 conversion
(kiln.ops.quant_ort), and the float ones are computed in its order
(kiln.ops.quant_mlas_conv). Also: the checker's acceptance of IR 3 files whose
initializers are not inputs, and NaN and infinity in quantization.

KILN_FULL_MODELS=1 adds a full-size ResNet-50 at 224 x 224 and a 6-layer DistilBERT
quantized by quantize_dynamic, compiled for this host's CPU.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder, value_info
from support.reference import (
    like_onnxruntime,
    onnxruntime_outputs,
    onnxruntime_saturates,
    ort_session,
)

FULL = os.environ.get("KILN_FULL_MODELS") == "1"
IR3_WARNING = "not listed as graph inputs"
#: The IR version onnx writes today (the "current" files).
IR_CURRENT = onnx.IR_VERSION


# --------------------------------------------------------------------------- models

class ZooBuilder(GraphBuilder):
    """GraphBuilder with the layers of the zoo's CNNs, He-scaled weights."""

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1,  # type: ignore[override]
             group: int = 1, bias: bool = True, pad: int | None = None,
             gain: float = 2.0) -> str:
        w = (self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(gain / (cin * k * k)))
        args = [x, self.const(w.astype(np.float32), "w")]
        if bias:
            args.append(self.const(self.rng.normal(0, 0.05, cout).astype(np.float32), "b"))
        p = k // 2 if pad is None else pad
        return self.op("Conv", *args, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[p] * 4)

    def conv_bn_relu(self, x: str, cin: int, cout: int, k: int, stride: int = 1,
                     relu: bool = True) -> str:
        h = self.bn(self.conv(x, cin, cout, k, stride, pad=k // 2), cout)
        return self.op("Relu", h) if relu else h


def _finish(b: GraphBuilder, image: int, out: str, classes: int, opset: int,
            ir: int) -> onnx.ModelProto:
    """The model of `b`: input `data`, output `out`; at IR 3 every initializer is also a
    graph input, as the zoo's old files have them."""
    inputs = [value_info("data", [1, 3, image, image])]
    if ir < 4:
        inputs += [value_info(t.name, list(t.dims), t.data_type) for t in b.inits]
    return b.model(inputs, [value_info(out, [1, classes])], opset, ir_version=ir)


def resnet_v1(opset: int = 13, ir: int = 3, image: int = 32) -> onnx.ModelProto:
    """ResNet v1 as the zoo ships it, three bottlenecks: Conv (with bias) + BN + Relu,
    MaxPool, two projection blocks (the second strided) and an identity block with
    residual Adds, GlobalAveragePool, Flatten, Gemm."""
    b = ZooBuilder(11)
    h = b.op("MaxPool", b.conv_bn_relu("data", 3, 16, 7, 2), kernel_shape=[3, 3],
             strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 16
    # (stride, projection shortcut): ResNet v1's strided 1x1 first, then identity blocks
    for stride, projection in ((1, True), (2, True), (1, False)):
        y = b.conv_bn_relu(h, cin, 16, 1, stride)
        y = b.conv_bn_relu(y, 16, 16, 3)
        y = b.conv_bn_relu(y, 16, 64, 1, relu=False)
        shortcut = b.conv_bn_relu(h, cin, 64, 1, stride, relu=False) if projection else h
        h = b.op("Relu", b.op("Add", shortcut, y))
        cin = 64
    flat = b.op("Flatten", b.op("GlobalAveragePool", h), axis=1)
    w = b.const((b.rng.standard_normal((10, 64)) / 8).astype(np.float32), "fc_w")
    b.node("Gemm", [flat, w, b.const(b.rng.normal(0, 0.05, 10).astype(np.float32), "fc_b")],
           ["logits"], transB=1)
    return _finish(b, image, "logits", 10, opset, ir)


def squeezenet_11(opset: int = 13, ir: int = 3, image: int = 48) -> onnx.ModelProto:
    """SqueezeNet 1.1 as the zoo ships it: a strided conv, max pools, Fire modules
    (squeeze 1x1, expand 1x1 and 3x3, Concat), Dropout, a 1x1 classifier conv + Relu,
    GlobalAveragePool, Flatten, Softmax."""
    b = ZooBuilder(12)
    h = b.op("MaxPool", b.op("Relu", b.conv("data", 3, 16, 3, 2, pad=0)), kernel_shape=[3, 3],
             strides=[2, 2])
    cin = 16
    for item in ((8, 16), "pool", (8, 16), (16, 32)):
        if item == "pool":
            h = b.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2])
            continue
        squeeze, expand = item
        s = b.op("Relu", b.conv(h, cin, squeeze, 1))
        h = b.op("Concat", b.op("Relu", b.conv(s, squeeze, expand, 1)),
                 b.op("Relu", b.conv(s, squeeze, expand, 3)), axis=1)
        cin = 2 * expand
    h = b.op("Dropout", h, ratio=0.5) if opset < 12 else b.op("Dropout", h)
    h = b.op("Relu", b.conv(h, cin, 10, 1, gain=0.5))
    b.node("Softmax", [b.op("Flatten", b.op("GlobalAveragePool", h))], ["prob"], axis=1)
    return _finish(b, image, "prob", 10, opset, ir)


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {"resnet": resnet_v1,
                                                     "squeezenet": squeezenet_11}


# --------------------------------------------------------------------------- quantizing

class _Reader(CalibrationDataReader):
    """A few standard-normal batches for the model's input `data`."""

    def __init__(self, model: onnx.ModelProto, count: int = 3) -> None:
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        rng = np.random.default_rng(0)
        self.batches = iter([{"data": rng.standard_normal(shape).astype(np.float32)}
                             for _ in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def quantized(model: onnx.ModelProto, fmt: str = "QDQ", per_channel: bool = True,
              activations: str = "int8", weights: str = "int8", reduce_range: bool = False,
              **extra: Any) -> onnx.ModelProto:
    """`model` quantized by onnxruntime's quantize_static as a user runs it on a zoo
    file (no pre-processing)."""
    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the quantizer's advice to pre-process
        src, out = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(out), _Reader(model),
                        quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
                        per_channel=per_channel, reduce_range=reduce_range,
                        activation_type=types[activations], weight_type=types[weights],
                        extra_options=extra)
        return onnx.load(str(out))


def imported(model: onnx.ModelProto) -> Any:
    """kiln's import of `model`; an IR 3 file quantized by onnxruntime warns that its
    scales and zero points are initializers but not inputs."""
    if model.ir_version < 4:
        with pytest.warns(UserWarning, match=IR3_WARNING):
            return from_onnx(model)
    return from_onnx(model)


def _image(model: onnx.ModelProto, seed: int = 5) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"data": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _assert_equal(model: onnx.ModelProto, target: str, what: str, images: int = 3) -> None:
    """kiln's output on `images` random images equals onnxruntime's, bit for bit."""
    fn = kiln.compile(imported(model), like_onnxruntime(target))["main"]
    for seed in range(images):
        feeds = _image(model, seed)
        want = onnxruntime_outputs(model, feeds)[0]
        got = np.asarray(fn(feeds["data"]))
        assert got.dtype == want.dtype and got.shape == want.shape, what
        differ = int((got != want).sum())
        assert differ == 0, f"{what} on {target}, image {seed}: {differ} of {want.size} differ"


# (model, opset, IR version, quantizer options): each differs from onnxruntime on the code
# before this file (an IR 3 file was refused; the others computed groups onnxruntime keeps
# in float as integers or the other way round, or rounded a float step otherwise)
CONFIGS: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    # quantize_static's defaults (int8 activations), per channel: the zoo's int8 files
    "resnet-qdq-s8-opset13-ir3": ("resnet", 13, 3, {}),
    "resnet-qoperator-s8-opset21-ir3": ("resnet", 21, 3, {"fmt": "QOperator"}),
    "resnet-qdq-s8-float-bias-opset17": ("resnet", 17, IR_CURRENT, {"QuantizeBias": False}),
    "resnet-qdq-u8-reduce-range-opset10-ir3": ("resnet", 10, 3, {
        "per_channel": False, "activations": "uint8", "reduce_range": True}),
    "squeezenet-qdq-s8-opset13-ir3": ("squeezenet", 13, 3, {}),
    "squeezenet-qdq-s8-symmetric-opset21-ir3": ("squeezenet", 21, 3, {
        "ActivationSymmetric": True, "weights": "int8"}),
    "squeezenet-qoperator-u8-u8-opset10-ir3": ("squeezenet", 10, 3, {
        "fmt": "QOperator", "per_channel": False, "activations": "uint8",
        "weights": "uint8"}),
}
_QUANTIZED: dict[str, onnx.ModelProto] = {}


def _config(name: str) -> onnx.ModelProto:
    if name not in _QUANTIZED:
        model, opset, ir, options = CONFIGS[name]
        _QUANTIZED[name] = quantized(MODELS[model](opset, ir), **options)
    return _QUANTIZED[name]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_zoo_style_model_equals_onnxruntime(name: str) -> None:
    _assert_equal(_config(name), "llvm", name)


# the C backend prints the new kernels (the MLAS-order convolution, the int8 groups
# computed as uint8): one int8 configuration of each model
@pytest.mark.parametrize("name", ["resnet-qdq-s8-opset13-ir3",
                                  "squeezenet-qdq-s8-opset13-ir3"])
def test_zoo_style_model_equals_onnxruntime_on_c(name: str) -> None:
    _assert_equal(_config(name), "c", name)


def test_int8_groups_follow_onnxruntimes_fusions() -> None:
    """onnxruntime fuses the int8 ResNet's convolutions whose activations it runs as
    uint8 (one reader) and computes the others in float (a block's input, read by two
    convolutions or a convolution and the Add): so does kiln."""
    model = _config("resnet-qdq-s8-opset13-ir3")
    mod = QuantizeOps()(imported(model))
    ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    integer = sum(op.startswith("qlinear_conv") for op in ops)
    assert ops.count("conv2d_mlas") + integer == convs
    assert 0 < ops.count("conv2d_mlas") < convs
    assert "conv2d" not in ops


# --------------------------------------------------------------------------- float steps

def _int8_groups(scales: tuple[float, float, float]) -> onnx.ModelProto:
    """Add, Mul and AveragePool groups between int8 Q/DQ pairs: each once with one reader
    per pair (onnxruntime runs it as uint8) and once with every pair read twice (it stays
    int8); x and y cover every pair of int8 values."""
    sa, sb, sy = (np.float32(s) for s in scales)
    b = GraphBuilder()
    b.consts({"sa": sa, "za": np.int8(3), "sb": sb, "zb": np.int8(-5), "sy": sy,
              "zy": np.int8(1)})
    b.input("x", [1, 1, 256, 256])
    b.input("y", [1, 1, 256, 256])
    for shared in (False, True):
        tag = "shared" if shared else "single"
        for name, zp in (("x", "za"), ("y", "zb")):
            b.node("QuantizeLinear", [name, "s" + zp[1], zp], [f"{name}q_{tag}"])
            b.node("DequantizeLinear", [f"{name}q_{tag}", "s" + zp[1], zp], [f"{name}d_{tag}"])
            if shared:  # a second reader of the pair
                b.node("Relu", [f"{name}d_{tag}"], [f"{name}r_{tag}"])
                b.output(f"{name}r_{tag}", [1, 1, 256, 256])
        for op in ("Add", "Mul", "AveragePool"):
            out = f"{op}_{tag}"
            if op == "AveragePool":
                b.node(op, [f"xd_{tag}"], [out + "_f"], kernel_shape=[2, 2], strides=[2, 2])
            else:
                b.node(op, [f"xd_{tag}", f"yd_{tag}"], [out + "_f"])
            b.node("QuantizeLinear", [out + "_f", "sy", "zy"], [out])
            shape = [1, 1, 128, 128] if op == "AveragePool" else [1, 1, 256, 256]
            b.output(out, shape, TensorProto.INT8)
            if shared:
                b.node("DequantizeLinear", [out, "sy", "zy"], [out + "_d"])
                b.output(out + "_d", shape)
    return b.model(opset=13)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_int8_add_mul_average_pool_compute_as_onnxruntime(target: str) -> None:
    """With a = b scale and y = 2a (halves everywhere), the float formula and onnxruntime's
    QLinearAdd / QLinearMul / QLinearAveragePool round differently on many pairs; the uint8
    ones (a group it converts) differ again from the int8 ones."""
    scales = (0.1, 0.1, 0.2)
    model = _int8_groups(scales)
    k = np.arange(-128, 128)
    x = np.broadcast_to(((k - 3) * np.float32(scales[0])).astype(np.float32)[:, None],
                        (256, 256)).reshape(1, 1, 256, 256).copy()
    y = np.broadcast_to(((k + 5) * np.float32(scales[1])).astype(np.float32)[None, :],
                        (256, 256)).reshape(1, 1, 256, 256).copy()
    want = onnxruntime_outputs(model, {"x": x, "y": y})
    got = kiln.compile(from_onnx(model), target)["main"](x, y)
    names = [o.name for o in model.graph.output]
    for name, got_k, want_k in zip(names, got, want, strict=True):
        assert np.array_equal(got_k, want_k), f"{name}: {int((got_k != want_k).sum())} differ"


def _shared_int8_conv() -> onnx.ModelProto:
    """An int8 QDQ convolution whose input pair has two readers: onnxruntime keeps it int8,
    so it computes the convolution in float (MLAS), then quantizes."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    b.consts({"xs": np.float32(0.03), "xz": np.int8(-2), "ys": np.float32(0.05),
              "yz": np.int8(4), "ws": rng.uniform(0.002, 0.01, 24).astype(np.float32),
              "wz": np.zeros(24, np.int8),
              "w": rng.integers(-127, 128, (24, 40, 3, 3)).astype(np.int8),
              "bq": rng.integers(-3000, 3000, 24).astype(np.int32),
              "bs": (np.float32(0.03) * rng.uniform(0.002, 0.01, 24)).astype(np.float32),
              "bz": np.zeros(24, np.int32)})
    b.input("x", [1, 40, 12, 12])
    b.node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])
    b.node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])
    b.node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0)
    b.node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], axis=0)
    for k in range(2):
        b.node("Conv", ["xd", "wd", "bd"], [f"c{k}"], pads=[1, 1, 1, 1])
        b.node("QuantizeLinear", [f"c{k}", "ys", "yz"], [f"y{k}"])
        b.output(f"y{k}", [1, 24, 12, 12], TensorProto.INT8)
    return b.model(opset=13)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_float_convolution_sums_like_mlas(target: str) -> None:
    model = _shared_int8_conv()
    x = np.random.default_rng(4).standard_normal((1, 40, 12, 12)).astype(np.float32) * 2
    want = onnxruntime_outputs(model, {"x": x})
    mod = QuantizeOps()(from_onnx(model))
    assert sum(b.value.op == "conv2d_mlas" for b in mod["main"].bindings
               if isinstance(b.value, g.Call)) == 2
    got = kiln.compile(from_onnx(model), target)["main"](x)
    for got_k, want_k in zip(got, want, strict=True):
        assert np.array_equal(got_k, want_k), f"{int((got_k != want_k).sum())} differ"


def test_dedicated_qdq_pairs_merge_as_onnxruntime_merges_them() -> None:
    """A file with a Q/DQ pair per consumer (`DedicatedQDQPair`) quantizes a uint8
    convolution's output twice; onnxruntime's common-subexpression elimination merges the
    pairs, so the convolution has one reader and runs as QLinearConv: kiln merges them
    too (before, it kept the convolution in float)."""
    rng = np.random.default_rng(10)
    b = GraphBuilder()
    b.consts({"xs": np.float32(0.04), "xz": np.uint8(128), "ys": np.float32(0.02),
              "yz": np.uint8(0), "ws": rng.uniform(0.001, 0.004, 32).astype(np.float32),
              "wz": np.zeros(32, np.int8),
              "w": rng.integers(-127, 128, (32, 64, 3, 3)).astype(np.int8)})
    b.input("x", [1, 64, 16, 16])
    b.node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])
    b.node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])
    b.node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0)
    b.node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1])
    for k in range(2):  # the dedicated pairs, each read by a MaxPool
        b.node("QuantizeLinear", ["c", "ys", "yz"], [f"q{k}"])
        b.node("DequantizeLinear", [f"q{k}", "ys", "yz"], [f"d{k}"])
        b.node("MaxPool", [f"d{k}"], [f"p{k}"], kernel_shape=[2, 2], strides=[2, 2])
        b.node("QuantizeLinear", [f"p{k}", "ys", "yz"], [f"y{k}"])
        b.output(f"y{k}", [1, 32, 8, 8], TensorProto.UINT8)
    model = b.model(opset=13)
    ops = [c.value.op for c in QuantizeOps()(from_onnx(model))["main"].bindings
           if isinstance(c.value, g.Call)]
    assert "conv2d" not in ops and ops.count("qlinear_conv_packed") + ops.count(
        "qlinear_conv_dot") == 1
    fn = kiln.compile(from_onnx(model), "llvm")["main"]
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 64, 16, 16)).astype(np.float32)
        for got, want in zip(fn(x), onnxruntime_outputs(model, {"x": x}), strict=True):
            assert np.array_equal(got, want), f"{int((got != want).sum())} differ"


# (batch, channels, filters, image, kernel, stride, pad, group): MLAS's paths (a direct
# 1x1 GEMM, the expanded GEMM split by rows, segments of positions per thread), K over
# 128, where its block length follows the thread count, and its M = 1 kernel (a
# depthwise convolution, a single filter)
MLAS_SHAPES = [(1, 64, 32, 8, 3, 1, 1, 1), (1, 288, 32, 8, 3, 1, 1, 1),
               (2, 256, 64, 7, 1, 1, 0, 1), (1, 256, 128, 4, 3, 1, 1, 1),
               (1, 64, 64, 9, 3, 2, 1, 2), (1, 300, 16, 6, 3, 1, 1, 1),
               (1, 32, 32, 14, 3, 2, 1, 32), (1, 200, 1, 10, 3, 1, 1, 1)]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_mlas_convolution_reference_equals_onnxruntime(threads: int) -> None:
    """conv2d_mlas's sums (its numpy reference, which the kernels equal: tests/ops) are
    onnxruntime's float Conv with weights it cannot pre-pack, for its thread count."""
    from kiln.ops.quant_mlas_conv import conv2d_mlas_ref

    rng = np.random.default_rng(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for batch, c, oc, hw, k, stride, pad, group in MLAS_SHAPES:
        b = GraphBuilder()
        b.input("x", [batch, c, hw, hw])
        b.input("w", [oc, c // group, k, k])
        b.input("b", [oc])
        b.node("Conv", ["x", "w", "b"], ["y"], strides=[stride, stride], pads=[pad] * 4,
               group=group)
        b.output("y", None)
        model = b.model(opset=13, check=False)
        feeds = {"x": rng.standard_normal((batch, c, hw, hw)).astype(np.float32),
                 "w": (rng.standard_normal((oc, c // group, k, k)) / np.sqrt(c * k * k)
                       ).astype(np.float32),
                 "b": rng.standard_normal(oc).astype(np.float32)}
        want = ort_session(model, options).run(None, feeds)[0]
        got = conv2d_mlas_ref(*feeds.values(), strides=(stride, stride), pads=(pad,) * 4,
                              group=group, threads=threads)
        assert np.array_equal(got, want), (batch, c, oc, hw, k, stride, pad, group)


def test_batch_normalization_rounds_like_onnxruntime() -> None:
    """A float BatchNormalization between quantized tensors: `x * ((1 / sqrt(var + eps)) *
    scale) + (bias - mean * that)`, as onnxruntime's kernel rounds it."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    b.consts({"s": np.float32(0.021), "z": np.int8(-7),
              "gamma": rng.uniform(0.5, 1.5, 32).astype(np.float32),
              "beta": rng.normal(0, 0.1, 32).astype(np.float32),
              "mean": rng.normal(0, 0.1, 32).astype(np.float32),
              "var": rng.uniform(0.5, 1.5, 32).astype(np.float32)})
    b.input("x", [1, 32, 16, 16])
    b.node("QuantizeLinear", ["x", "s", "z"], ["xq"])
    b.node("DequantizeLinear", ["xq", "s", "z"], ["xd"])
    b.node("BatchNormalization", ["xd", "gamma", "beta", "mean", "var"], ["y"])
    b.output("y", [1, 32, 16, 16])
    model = b.model(opset=13)
    x = rng.standard_normal((1, 32, 16, 16)).astype(np.float32)
    want = onnxruntime_outputs(model, {"x": x})[0]
    got = kiln.compile(from_onnx(model), "llvm")["main"](x)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} differ"


def test_saturating_pairs_take_the_int8_groups_onnxruntime_runs_as_uint8() -> None:
    """With `int8-pairs=saturate` (onnxruntime's AVX2 products), an int8 convolution
    onnxruntime runs as uint8 saturates its pairs as its uint8 kernel does."""
    target = Target("llvm -mcpu=znver3 -int8-pairs=saturate")
    model = _config("resnet-qdq-s8-opset13-ir3")
    with target:
        mod = QuantizeOps()(imported(model))
    pairs = [b.value.attrs.get("pairs") for b in mod["main"].bindings
             if isinstance(b.value, g.Call) and b.value.op.startswith("qlinear_conv")]
    assert pairs and all(p == "saturate" for p in pairs)
    if onnxruntime_saturates() and isa_for(target).features <= isa_for(
            Target.from_host()).features:
        _assert_equal(model, str(target), "int8 ResNet, AVX2 pairs")


# --------------------------------------------------------------------------- the checker

def _ir3_model(extra_initializer: bool) -> onnx.ModelProto:
    b = GraphBuilder()
    b.consts({"s": np.float32(0.1), "z": np.uint8(128)})
    if extra_initializer:  # read by no node
        b.const(np.ones(3, np.float32), name="unused")
    b.input("x", [2, 3])
    b.node("QuantizeLinear", ["x", "s", "z"], ["q"])
    b.node("DequantizeLinear", ["q", "s", "z"], ["y"])
    b.output("y", [2, 3])
    return b.model(opset=13, ir_version=3, check=False)


def test_ir3_initializers_that_are_not_inputs_are_accepted_with_a_warning() -> None:
    model = _ir3_model(False)
    with pytest.warns(UserWarning, match=r"'s', 'z' of this IR version 3 model are not "
                                         r"listed as graph inputs"):
        mod = from_onnx(model)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    got = kiln.compile(mod, "llvm")["main"](x)
    assert np.array_equal(got, onnxruntime_outputs(model, {"x": x})[0])


def test_ir3_initializer_no_node_reads_is_still_refused() -> None:
    # onnxruntime refuses it too ("Graph ctor should have created NodeArg for initializer")
    with pytest.warns(UserWarning, match=IR3_WARNING), \
            pytest.raises(FrontendError, match="unused in initializer but not in graph input"):
        from_onnx(_ir3_model(True))


# --------------------------------------------------------------------------- NaN

QUANT_TYPES = [(np.uint8, TensorProto.UINT8, 13), (np.int8, TensorProto.INT8, 13),
               (np.int16, TensorProto.INT16, 21), (np.uint16, TensorProto.UINT16, 21)]


def test_quantize_linear_of_nan_and_infinity() -> None:
    """NaN quantizes to the type's minimum (int8 -128, before: 0), +-inf saturate
    (onnxruntime's MLAS), for every type kiln quantizes to."""
    x = np.array([np.nan, np.inf, -np.inf, 0.5, -0.5, 1e30, -1e30, 3.0], np.float32)
    for dtype, elem, opset in QUANT_TYPES:
        b = GraphBuilder()
        b.input("x", [8])
        b.consts({"s": np.float32(0.1), "z": np.asarray(3, dtype)})
        b.node("QuantizeLinear", ["x", "s", "z"], ["y"])
        b.output("y", [8], elem)
        model = b.model(opset=opset)
        got = kiln.compile(from_onnx(model), "llvm")["main"](x)
        want = onnxruntime_outputs(model, {"x": x})[0]
        assert np.array_equal(got, want), (dtype, got, want)


@pytest.mark.parametrize("case", ["nan", "nan-first", "-inf", "nan-and-inf", "nan-and--inf"])
def test_dynamic_quantize_linear_skips_nan(case: str) -> None:
    """DynamicQuantizeLinear's range skips a NaN (which quantizes to 0); an infinite range
    gives an infinite scale and onnxruntime's zero point (255 for -inf)."""
    b = GraphBuilder()
    b.input("x", [16])
    b.node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    b.output("y", [16], TensorProto.UINT8)
    b.output("s", [], TensorProto.FLOAT)
    b.output("z", [], TensorProto.UINT8)
    model = b.model(opset=13)
    x = np.linspace(-1, 2, 16).astype(np.float32)
    for position, value in {"nan": [(5, np.nan)], "nan-first": [(0, np.nan)],
                            "nan-and-inf": [(2, np.nan), (5, np.inf)], "-inf": [(5, -np.inf)],
                            "nan-and--inf": [(3, np.nan), (7, -np.inf)]}[case]:
        x[position] = value
    got = kiln.compile(from_onnx(model), "llvm")["main"](x)
    for got_k, want_k in zip(got, onnxruntime_outputs(model, {"x": x}), strict=True):
        assert np.array_equal(got_k, want_k, equal_nan=True), (got, want_k)


def _runtime_scale_conv(dtype: type, elem: int, which: int) -> onnx.ModelProto:
    """A QLinearConv whose input `which` (1: x_scale, 4: w_scale, 6: y_scale) is a graph
    input."""
    rng = np.random.default_rng(8)
    b = GraphBuilder()
    b.input("x", [1, 2, 4, 4], elem)
    b.input("scale", [])
    consts = {"xs": np.float32(0.02), "xz": np.asarray(5, dtype),
              "w": rng.integers(-100, 100, (3, 2, 3, 3)).astype(np.int8),
              "ws": np.float32(0.01), "wz": np.int8(0), "ys": np.float32(0.05),
              "yz": np.asarray(7, dtype)}
    names = ["x", *consts]
    names[which] = "scale"
    b.consts({k: v for k, v in consts.items() if k in names})
    b.node("QLinearConv", names, ["y"], pads=[1, 1, 1, 1])
    b.output("y", [1, 3, 4, 4], elem)
    return b.model(opset=13)


@pytest.mark.parametrize(("dtype", "elem"), [(np.uint8, TensorProto.UINT8),
                                             (np.int8, TensorProto.INT8)])
@pytest.mark.parametrize("which", [1, 4, 6])
def test_qlinear_conv_with_a_nan_scale_at_run_time(dtype: type, elem: int, which: int) -> None:
    """A NaN scale given at run time requantizes every output to the type's minimum, as
    onnxruntime's kernels do (infinite ones saturate or give the zero point)."""
    model = _runtime_scale_conv(dtype, elem, which)
    lo = int(np.iinfo(dtype).min)
    x = np.random.default_rng(9).integers(lo, lo + 256, (1, 2, 4, 4)).astype(dtype)
    fn = kiln.compile(from_onnx(model), "llvm")["main"]
    for scale in (np.nan, np.inf, 0.0):
        feeds = {"x": x, "scale": np.array(scale, np.float32)}
        got = fn(x, feeds["scale"])
        assert np.array_equal(got, onnxruntime_outputs(model, feeds)[0]), scale


@pytest.mark.parametrize("op", ["QLinearMatMul", "QuantizeLinear"])
def test_nan_scale_at_run_time(op: str) -> None:
    b = GraphBuilder()
    b.input("scale", [])
    if op == "QLinearMatMul":
        b.input("x", [2, 3], TensorProto.UINT8)
        b.consts({"xz": np.uint8(5), "b": np.arange(12, dtype=np.uint8).reshape(3, 4) * 20,
                  "bs": np.float32(0.01), "bz": np.uint8(100), "ys": np.float32(0.05),
                  "yz": np.uint8(7)})
        b.node(op, ["x", "scale", "xz", "b", "bs", "bz", "ys", "yz"], ["y"])
        b.output("y", [2, 4], TensorProto.UINT8)
        x = np.arange(6, dtype=np.uint8).reshape(2, 3) * 40
    else:  # and its DequantizeLinear, which only multiplies (NaN and inf pass)
        b.input("x", [6])
        b.consts({"z": np.int8(3)})
        b.node(op, ["x", "scale", "z"], ["y"])
        b.node("DequantizeLinear", ["y", "scale", "z"], ["yf"])
        b.output("y", [6], TensorProto.INT8)
        b.output("yf", [6])
        x = np.array([-2, -0.0, 0.0, 1, 3, np.nan], np.float32)
    model = b.model(opset=13)
    fn = kiln.compile(from_onnx(model), "llvm")["main"]
    for scale in (np.nan, np.inf, 0.0):
        s = np.array(scale, np.float32)
        got = fn(s, x)
        got = list(got) if isinstance(got, tuple) else [got]
        for got_k, want_k in zip(got, onnxruntime_outputs(model, {"scale": s, "x": x}),
                                 strict=True):
            assert np.array_equal(got_k, want_k, equal_nan=True), (scale, got_k, want_k)


# --------------------------------------------------------------------------- full size

def _host_fma() -> Target:
    host = Target.from_host()
    if "fma" not in isa_for(host).features:
        pytest.skip("onnxruntime's float kernels on this host use no FMA: "
                    "compare on a CPU with FMA")
    return host


@pytest.mark.skipif(not FULL, reason="a full-size ResNet-50 (KILN_FULL_MODELS=1)")
def test_full_resnet50_zoo_style_equals_onnxruntime() -> None:
    b = ZooBuilder(14)
    h = b.op("MaxPool", b.conv_bn_relu("data", 3, 64, 7, 2), kernel_shape=[3, 3],
             strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            y = b.conv_bn_relu(h, cin, width, 1, stride)
            y = b.conv_bn_relu(b.conv_bn_relu(y, width, width, 3), width, 4 * width, 1,
                               relu=False)
            shortcut = b.conv_bn_relu(h, cin, 4 * width, 1, stride, relu=False) if i == 0 \
                else h
            h = b.op("Relu", b.op("Add", shortcut, y))
            cin = 4 * width
    flat = b.op("Flatten", b.op("GlobalAveragePool", h), axis=1)
    w = b.const((b.rng.standard_normal((1000, 2048)) / 45).astype(np.float32), "fc_w")
    b.node("Gemm", [flat, w, b.const(np.zeros(1000, np.float32), "fc_b")], ["logits"],
           transB=1)
    model = quantized(_finish(b, 224, "logits", 1000, 13, 3))
    _assert_equal(model, str(_host_fma()), "ResNet-50")


@pytest.mark.skipif(not FULL, reason="a 6-layer DistilBERT (KILN_FULL_MODELS=1)")
def test_full_distilbert_dynamic_equals_onnxruntime() -> None:
    """quantize_dynamic's DistilBERT, compiled for this host's CPU (onnxruntime's float
    kernels follow its CPU, docs/quantization.md)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.DistilBertConfig(vocab_size=1000, max_position_embeddings=128)
    torch.manual_seed(0)
    net = transformers.DistilBertModel(config).eval()
    ids = torch.randint(0, 1000, (1, 128))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        src, out = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        torch.onnx.export(net, (ids, torch.ones_like(ids)), str(src), dynamo=False,
                          input_names=["input_ids", "attention_mask"], opset_version=17)
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
        model = onnx.load(str(out))
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((1, 128), np.int64)}
    got = kiln.compile(from_onnx(model), _host_fma())["main"](*feeds.values())
    got = got[0] if isinstance(got, tuple) else got
    assert np.array_equal(got, onnxruntime_outputs(model, feeds)[0])
