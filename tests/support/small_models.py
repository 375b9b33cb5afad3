"""Small but real model families built with onnx.helper (deterministic weights).

Each builder returns an onnx.ModelProto; shapes are small so the models compile
and run fast: an MLP, a VGG-style CNN, a ResNet-18-like network (basic blocks,
BatchNormalization, projection shortcuts), a MobileNetV2-like network
(inverted residuals, depthwise convolutions, ReLU6 as Clip) and a 2-layer
transformer encoder (multi-head attention whose reshapes take their shapes
from Shape -> Gather -> Concat subgraphs, LayerNormalization, GELU as Erf and
as the Gelu op).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from support.graphs import GraphBuilder
from support.graphs import value_info as vi


def mlp(batch: int = 4) -> onnx.ModelProto:
    b = GraphBuilder(0)
    h = b.op("Relu", b.linear("x", 64, 128))
    h = b.op("Relu", b.linear(h, 128, 64))
    logits = b.linear(h, 64, 10)
    b.nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    return b.model([vi("x", [batch, 64])], [vi("probs", [batch, 10])], 13, "mlp")


def vgg(batch: int = 2) -> onnx.ModelProto:
    b = GraphBuilder(1)
    h = "image"
    cin = 3
    for width in (16, 32):
        for _ in range(2):
            h = b.op("Relu", b.conv(h, cin, width, 3))
            cin = width
        h = b.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Flatten", h, axis=1)
    h = b.op("Relu", b.linear(h, 32 * 8 * 8, 64))
    h = b.op("Dropout", h)
    out = b.linear(h, 64, 10)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, 32, 32])], [vi("logits", [batch, 10])], 12, "vgg")


def resnet18(batch: int = 1, widths: tuple[int, ...] = (8, 16, 24, 32)) -> onnx.ModelProto:
    """ResNet-18's layout: two basic blocks per stage of `widths` (the first stage at
    stride 1, each later one opening with a stride-2 block and a projection shortcut)."""
    b = GraphBuilder(2)
    h = b.op("Relu", b.bn(b.conv("image", 3, 8, 7, stride=2, bias=False), 8))
    h = b.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 8
    for stage, width in enumerate(widths):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = b.op("Relu", b.bn(b.conv(h, cin, width, 3, stride, bias=False), width))
            y = b.bn(b.conv(y, width, width, 3, bias=False), width)
            if stride != 1 or cin != width:
                shortcut = b.bn(b.op("Conv", h, b.weight(width, cin, 1, 1), kernel_shape=[1, 1],
                                     strides=[stride, stride]), width)
            else:
                shortcut = h
            h = b.op("Relu", b.op("Add", y, shortcut))
            cin = width
    h = b.op("Flatten", b.op("GlobalAveragePool", h))
    out = b.linear(h, cin, 10)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, 32, 32])], [vi("logits", [batch, 10])], 15,
                   "resnet18")


def mobilenet_v2(batch: int = 1) -> onnx.ModelProto:
    b = GraphBuilder(3)
    h = b.relu6(b.bn(b.conv("image", 3, 16, 3, stride=2, bias=False), 16))
    cin = 16
    # (expansion t, output channels, stride)
    for t, cout, stride in ((1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 32, 2), (4, 32, 1)):
        hidden = cin * t
        y = h
        if t != 1:
            y = b.relu6(b.bn(b.conv(y, cin, hidden, 1, bias=False), hidden))
        y = b.relu6(b.bn(b.conv(y, hidden, hidden, 3, stride, group=hidden, bias=False),
                         hidden))
        y = b.bn(b.conv(y, hidden, cout, 1, bias=False), cout)
        h = b.op("Add", h, y) if stride == 1 and cin == cout else y
        cin = cout
    h = b.relu6(b.bn(b.conv(h, cin, 64, 1, bias=False), 64))
    h = b.op("Flatten", b.op("GlobalAveragePool", h))
    out = b.linear(h, 64, 10)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, 32, 32])], [vi("logits", [batch, 10])], 13,
                   "mobilenet_v2")


def transformer(batch: int = 2, seq: int = 8, dim: int = 32, heads: int = 4,
                ffn: int = 64) -> onnx.ModelProto:
    b = GraphBuilder(4)
    dh = dim // heads

    def dims_of(x: str, *axes: int) -> list[str]:
        shape = b.op("Shape", x)
        return [b.op("Unsqueeze", b.op("Gather", shape, b.const(np.array(a, np.int64), "i"),
                                       axis=0), b.const(np.array([0], np.int64), "ax"))
                for a in axes]

    proj = b.proj

    def layer_norm(x: str) -> str:
        return b.layer_norm(x, dim)

    def split_heads(x: str) -> str:
        n, s = dims_of(x, 0, 1)
        shape = b.op("Concat", n, s, b.const(np.array([heads, dh], np.int64), "hd"), axis=0)
        return b.op("Transpose", b.op("Reshape", x, shape), perm=[0, 2, 1, 3])

    def attention(x: str) -> str:
        q, k, v = (split_heads(proj(x, dim, dim)) for _ in range(3))
        scores = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])),
                      b.const(np.array(math.sqrt(dh), np.float32), "scale"))
        ctx = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
        ctx = b.op("Transpose", ctx, perm=[0, 2, 1, 3])
        n, s = dims_of(x, 0, 1)
        merged = b.op("Reshape", ctx, b.op("Concat", n, s, b.const(
            np.array([-1], np.int64), "m1"), axis=0))
        return proj(merged, dim, dim)

    h = "tokens"
    for layer in range(2):
        h = layer_norm(b.op("Add", h, attention(h)))
        inner = proj(h, dim, ffn)
        inner = b.gelu_erf(inner) if layer == 0 else b.op("Gelu", inner)
        h = layer_norm(b.op("Add", h, proj(inner, ffn, dim)))
    b.nodes.append(helper.make_node("Identity", [h], ["encoded"]))
    return b.model([vi("tokens", [batch, seq, dim])], [vi("encoded", [batch, seq, dim])], 20,
                   "transformer")


MODELS = {"mlp": mlp, "vgg": vgg, "resnet18": resnet18, "mobilenet_v2": mobilenet_v2,
          "transformer": transformer}


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        out[v.name] = rng.normal(0, 1, shape).astype(np.float32)
    return out
