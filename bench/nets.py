"""The benchmark models, built with onnx.helper (deterministic weights, batch 1).

Not a benchmark itself: bench/models.py times these against onnxruntime.
Each builder returns `(model, {input name: shape})`.

Small models (fast to compile; the figures of docs/performance.md):

- `mlp`: 784-512-512-10 (Gemm + Relu);
- `cnn`: three 3x3 convolutions (3->16->32->64 channels) with ReLU and 2x2
  max pooling on a 64x64 image, then global average pooling and a dense layer;
- `resnet`: a 3x3 stem (3->32) and three residual basic blocks
  (conv-relu-conv + identity, relu) at 32x32, then global average pooling and
  a dense layer.

Full-size models (the shapes of the published networks; random weights):

- `resnet18`: ResNet-18 on a 224x224 image (7x7/2 stem, 3x3/2 max pool, four
  stages of two basic blocks at 64/128/256/512 channels, 1x1/2 projection
  shortcuts, BatchNormalization after every convolution, 1000 classes);
- `mobilenetv2`: MobileNetV2 (width 1.0) on a 224x224 image (inverted
  residuals with expansion 6, depthwise 3x3 convolutions, ReLU6 as Clip,
  1280-channel head, 1000 classes);
- `encoder`: a 2-layer transformer encoder, width 256, 4 heads, FFN 1024,
  on 128 embedded tokens (MatMul + Add projections, softmax attention,
  LayerNormalization, GELU written with Erf);
- `bert`: the same layer at BERT-base size: 12 layers, width 768, 12 heads,
  FFN 3072, on 128 embedded tokens (about 200 weight tensors, 85M weights).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization needs 17

Shapes = dict[str, list[int]]


class Graph:
    """Nodes and initializers of one ONNX graph, with deterministic weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = value.astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, *shape: int) -> str:
        fan_in = int(np.prod(shape[1:]))
        return self.const(self.rng.normal(0, 1 / math.sqrt(fan_in), shape), "w")

    def bias(self, n: int) -> str:
        return self.const(self.rng.normal(0, 0.1, n), "b")

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    # ---------------------------------------------------------------- layers

    def dense(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Gemm", x, self.weight(n_out, n_in), self.bias(n_out), transB=1)

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
             bias: bool = True) -> str:
        inputs = [x, self.weight(cout, cin // group, k, k)]
        if bias:
            inputs.append(self.bias(cout))
        return self.op("Conv", *inputs, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[k // 2] * 4, group=group)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        return self.op("BatchNormalization", x, self.const(r.uniform(0.5, 1.5, c), "gamma"),
                       self.const(r.normal(0, 0.1, c), "beta"),
                       self.const(r.normal(0, 0.1, c), "mean"),
                       self.const(r.uniform(0.5, 1.5, c), "var"), epsilon=1e-5)

    def relu6(self, x: str) -> str:
        return self.op("Clip", x, self.const(np.array(0.0), "min"),
                       self.const(np.array(6.0), "max"))

    def model(self, name: str, inputs: Shapes, y: str, out_shape: list[int]
              ) -> tuple[onnx.ModelProto, Shapes]:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, s) for x, s in inputs.items()],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model, inputs


def symbolic_dims(model: onnx.ModelProto, dims: dict[int, str]) -> onnx.ModelProto:
    """A copy of `model` whose inputs' and outputs' dimension `k` is the symbol `dims[k]`
    (e.g. `{0: "batch", 1: "seq"}`): what an exporter writes for dynamic axes. An
    output without axis `k` (a classifier's `[batch, classes]` for an image's height
    and width) keeps its dims."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    values = [(v, False) for v in out.graph.input] + [(v, True) for v in out.graph.output]
    for value, output in values:
        shape = value.type.tensor_type.shape.dim
        for k, name in dims.items():
            if output and k >= len(shape):
                continue
            dim = shape[k]
            dim.Clear()
            dim.dim_param = name
    onnx.checker.check_model(out)
    return out


# -------------------------------------------------------------- small models


def mlp() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(0)
    h = g.op("Relu", g.dense("x", 784, 512))
    h = g.op("Relu", g.dense(h, 512, 512))
    y = g.dense(h, 512, 10)
    return g.model("mlp", {"x": [1, 784]}, y, [1, 10])


def cnn(image: int = 64) -> tuple[onnx.ModelProto, Shapes]:
    """Three 3x3 conv + ReLU + 2x2 max-pool stages, global pooling, a dense layer,
    on a 3 x `image` x `image` input."""
    g = Graph(1)
    h = "x"
    for cin, cout in ((3, 16), (16, 32), (32, 64)):
        h = g.op("Relu", g.conv(h, cin, cout))
        h = g.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, 64, 10)
    return g.model("cnn", {"x": [1, 3, image, image]}, y, [1, 10])


def resnet() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(2)
    c = 32
    h = g.op("Relu", g.conv("x", 3, c))
    for _ in range(3):
        r = g.op("Relu", g.conv(h, c, c))
        r = g.conv(r, c, c)
        h = g.op("Relu", g.op("Add", r, h))
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, c, 10)
    return g.model("resnet", {"x": [1, 3, 32, 32]}, y, [1, 10])


# --------------------------------------------------------- full-size models


def resnet18() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(3)
    h = g.op("Relu", g.bn(g.conv("x", 3, 64, 7, stride=2, bias=False), 64))
    h = g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = g.op("Relu", g.bn(g.conv(h, cin, width, 3, stride, bias=False), width))
            y = g.bn(g.conv(y, width, width, 3, bias=False), width)
            shortcut = h
            if stride != 1 or cin != width:
                shortcut = g.bn(g.conv(h, cin, width, 1, stride, bias=False), width)
            h = g.op("Relu", g.op("Add", y, shortcut))
            cin = width
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, 512, 1000)
    return g.model("resnet18", {"x": [1, 3, 224, 224]}, y, [1, 1000])


def mobilenetv2() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(4)
    h = g.relu6(g.bn(g.conv("x", 3, 32, 3, stride=2, bias=False), 32))
    cin = 32
    # (expansion t, output channels c, repeats n, first stride s), as published
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = h
            if t != 1:
                y = g.relu6(g.bn(g.conv(y, cin, hidden, 1, bias=False), hidden))
            y = g.relu6(g.bn(g.conv(y, hidden, hidden, 3, stride, group=hidden, bias=False),
                             hidden))
            y = g.bn(g.conv(y, hidden, c, 1, bias=False), c)
            h = g.op("Add", h, y) if stride == 1 and cin == c else y
            cin = c
    h = g.relu6(g.bn(g.conv(h, cin, 1280, 1, bias=False), 1280))
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, 1280, 1000)
    return g.model("mobilenetv2", {"x": [1, 3, 224, 224]}, y, [1, 1000])


def transformer_encoder(name: str, seed: int, layers: int, dim: int, heads: int, ffn: int,
                        seq: int) -> tuple[onnx.ModelProto, Shapes]:
    """Post-norm encoder layers on `seq` embedded tokens, batch 1 (static reshapes)."""
    g = Graph(seed)
    dh = dim // heads

    def proj(x: str, din: int, dout: int) -> str:
        w = g.const(g.rng.normal(0, 1 / math.sqrt(din), (din, dout)), "w")
        return g.op("Add", g.op("MatMul", x, w), g.bias(dout))

    def layer_norm(x: str) -> str:
        return g.op("LayerNormalization", x, g.const(g.rng.uniform(0.8, 1.2, dim), "ln_g"),
                    g.const(g.rng.normal(0, 0.1, dim), "ln_b"), axis=-1, epsilon=1e-5)

    # 0 copies the input's dimension: the same model serves any (batch, seq)
    # once its input dims are made symbolic (`symbolic_dims`).
    heads_shape = g.const(np.array([0, 0, heads, dh], np.int64), "heads")
    merged_shape = g.const(np.array([0, 0, dim], np.int64), "merged")
    scale = g.const(np.array(math.sqrt(dh)), "scale")
    sqrt2 = g.const(np.array(math.sqrt(2)), "sqrt2")
    one = g.const(np.array(1.0), "one")
    half = g.const(np.array(0.5), "half")

    def split_heads(x: str, perm: list[int]) -> str:
        return g.op("Transpose", g.op("Reshape", x, heads_shape), perm=perm)

    def attention(x: str) -> str:
        q = split_heads(proj(x, dim, dim), [0, 2, 1, 3])
        k = split_heads(proj(x, dim, dim), [0, 2, 3, 1])  # K transposed for Q @ K^T
        v = split_heads(proj(x, dim, dim), [0, 2, 1, 3])
        scores = g.op("Div", g.op("MatMul", q, k), scale)
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), merged_shape)
        return proj(ctx, dim, dim)

    def gelu(x: str) -> str:
        erf = g.op("Erf", g.op("Div", x, sqrt2))
        return g.op("Mul", g.op("Mul", x, g.op("Add", erf, one)), half)

    h = "x"
    for _ in range(layers):
        h = layer_norm(g.op("Add", h, attention(h)))
        h = layer_norm(g.op("Add", h, proj(gelu(proj(h, dim, ffn)), ffn, dim)))
    return g.model(name, {"x": [1, seq, dim]}, h, [1, seq, dim])


def encoder() -> tuple[onnx.ModelProto, Shapes]:
    return transformer_encoder("encoder", 5, layers=2, dim=256, heads=4, ffn=1024, seq=128)


def bert() -> tuple[onnx.ModelProto, Shapes]:
    return transformer_encoder("bert", 6, layers=12, dim=768, heads=12, ffn=3072, seq=128)


def lstm() -> tuple[onnx.ModelProto, Shapes]:
    """A bidirectional LSTM (128 -> 256, 50 steps, batch 1) and a linear head: a tagger."""
    g = Graph(7)
    seq, inp, hid = 50, 128, 256
    w, r = g.weight(2, 4 * hid, inp), g.weight(2, 4 * hid, hid)
    y = g.op("LSTM", "x", w, r, g.const(g.rng.normal(0, 0.1, (2, 8 * hid)), "b"),
             hidden_size=hid, direction="bidirectional")  # [seq, 2, 1, hid]
    y = g.op("Transpose", y, perm=[0, 2, 1, 3])
    y = g.op("Reshape", y, g.const(np.array([seq, 2 * hid], np.int64), "shape"))
    return g.model("lstm", {"x": [seq, 1, inp]}, g.dense(y, 2 * hid, 10), [seq, 10])


SMALL: dict[str, Callable[[], tuple[onnx.ModelProto, Shapes]]] = {
    "mlp": mlp, "cnn": cnn, "resnet": resnet,
}
FULL: dict[str, Callable[[], tuple[onnx.ModelProto, Shapes]]] = {
    "resnet18": resnet18, "mobilenetv2": mobilenetv2, "encoder": encoder, "bert": bert,
    "lstm": lstm,
}
MODELS = {**SMALL, **FULL}
