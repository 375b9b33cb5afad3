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
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Accumulates nodes and initializers; names values uniquely."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape: int, fan_in: int | None = None, hint: str = "w") -> str:
        fan = fan_in or int(np.prod(shape[1:])) or 1
        w = self.rng.normal(0, 1 / math.sqrt(fan), shape).astype(np.float32)
        return self.const(w, hint)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: object) -> str:
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0]

    # ---------------------------------------------------------------- layers

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = True) -> str:
        w = self.weight(cout, cin // group, k, k)
        args = [x, w] + ([self.const(self.rng.normal(0, 0.1, cout).astype(np.float32), "b")]
                         if bias else [])
        return self.op("Conv", *args, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[k // 2] * 4, group=group)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        scale = self.const(r.uniform(0.5, 1.5, c).astype(np.float32), "gamma")
        shift = self.const(r.normal(0, 0.1, c).astype(np.float32), "beta")
        mean = self.const(r.normal(0, 0.1, c).astype(np.float32), "mean")
        var = self.const(r.uniform(0.5, 1.5, c).astype(np.float32), "var")
        return self.op("BatchNormalization", x, scale, shift, mean, var, epsilon=1e-5)

    def relu6(self, x: str) -> str:
        return self.op("Clip", x, self.const(np.array(0.0, np.float32), "min"),
                       self.const(np.array(6.0, np.float32), "max"))

    def linear(self, x: str, din: int, dout: int) -> str:
        return self.op("Gemm", x, self.weight(dout, din), self.const(
            self.rng.normal(0, 0.1, dout).astype(np.float32), "b"), transB=1)

    def proj(self, x: str, din: int, dout: int) -> str:
        """A transformer's dense layer: MatMul by a `[din, dout]` weight, then a bias Add."""
        return self.op("Add", self.op("MatMul", x, self.weight(din, dout, fan_in=din)),
                       self.const(self.rng.normal(0, 0.1, dout).astype(np.float32), "b"))

    def layer_norm(self, x: str, dim: int) -> str:
        """LayerNormalization over the last axis (`dim` wide), random scale and bias."""
        return self.op("LayerNormalization", x,
                       self.const(self.rng.uniform(0.8, 1.2, dim).astype(np.float32), "ln_g"),
                       self.const(self.rng.normal(0, 0.1, dim).astype(np.float32), "ln_b"),
                       axis=-1, epsilon=1e-5)

    def gelu_erf(self, x: str) -> str:
        """GELU spelled with Erf, as exporters before the opset-20 Gelu write it."""
        erf = self.op("Erf", self.op("Div", x, self.const(np.array(math.sqrt(2), np.float32),
                                                           "r2")))
        one = self.const(np.array(1.0, np.float32), "one")
        half = self.const(np.array(0.5, np.float32), "half")
        return self.op("Mul", self.op("Mul", x, self.op("Add", erf, one)), half)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              opset: int, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="kiln-tests")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _vi(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def mlp(batch: int = 4) -> onnx.ModelProto:
    b = GraphBuilder(0)
    h = b.op("Relu", b.linear("x", 64, 128))
    h = b.op("Relu", b.linear(h, 128, 64))
    logits = b.linear(h, 64, 10)
    b.nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    return b.model([_vi("x", [batch, 64])], [_vi("probs", [batch, 10])], 13, "mlp")


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
    return b.model([_vi("image", [batch, 3, 32, 32])], [_vi("logits", [batch, 10])], 12, "vgg")


def resnet18(batch: int = 1) -> onnx.ModelProto:
    b = GraphBuilder(2)
    h = b.op("Relu", b.bn(b.conv("image", 3, 8, 7, stride=2, bias=False), 8))
    h = b.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 8
    for stage, width in enumerate((8, 16, 24, 32)):
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
    return b.model([_vi("image", [batch, 3, 32, 32])], [_vi("logits", [batch, 10])], 15,
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
    return b.model([_vi("image", [batch, 3, 32, 32])], [_vi("logits", [batch, 10])], 13,
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
    return b.model([_vi("tokens", [batch, seq, dim])], [_vi("encoded", [batch, seq, dim])], 20,
                   "transformer")


MODELS = {"mlp": mlp, "vgg": vgg, "resnet18": resnet18, "mobilenet_v2": mobilenet_v2,
          "transformer": transformer}


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.normal(0, 1, shape).astype(np.float32)
    return out
