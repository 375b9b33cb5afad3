"""A model set at real depth and width, built with onnx.helper (deterministic weights).

Every builder reproduces its architecture's real layer layout and channel widths
and takes the input resolution (or sequence length) as a parameter, so tests can
run the full depth on small inputs while the benchmark uses the published sizes:

- `squeezenet` (opset 9): SqueezeNet 1.0, 8 fire modules, 26 convs, Dropout,
  2-D Softmax;
- `inception` (10): GoogLeNet, 9 inception modules (1x1/3x3/5x5/pool branches),
  LRN, ceil-mode max pools, 57 convs;
- `mobilenet_v2` (11): 17 inverted residuals, depthwise convs, ReLU6 as Clip with
  bound inputs, 52 convs;
- `shufflenet` (12): ShuffleNet v1 (g=3), grouped 1x1 convs, channel shuffle by
  Reshape/Transpose/Reshape;
- `resnet50` (13): 3-4-6-3 bottlenecks with BatchNormalization, 53 convs, Squeeze
  axes as an input;
- `densenet121` (14): 6-12-24-16 dense layers, each concatenating every earlier
  output, 120 convs;
- `efficientnet` (15): EfficientNet-B0, 16 MBConv blocks, SiLU, squeeze-excite,
  SAME_UPPER padding;
- `gpt2` (16): GPT-2 decoder block, fused QKV cut by Split (sizes as an input),
  causal mask by Slice + Where, LayerNorm written with ReduceMean, tanh GELU;
- `bert` (17): BERT-base encoder, 12 layers, width 768, 12 heads, FFN 3072,
  LayerNormalization, GELU via Erf, attention mask applied by Where;
- `vit` (17): ViT-B/16 patch embedding (16x16 stride-16 conv, class token by
  Expand, position embedding) and a pre-norm encoder layer;
- `vgg19` (13, benchmark only): 16 convs and three dense layers, 575 MB
  (548 MiB) of weights at 224x224.

Weights are He-scaled (ReLU-family activations) or 1/sqrt(fan-in) (linear layers)
from a seeded numpy generator; BatchNormalization is present with running statistics
near (0, 1), and the last normalisation of every residual branch is scaled down so
activations stay O(1) through the full depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from support.graphs import GraphBuilder
from support.graphs import value_info as vi

VOCAB = 30522        # BERT-base's WordPiece vocabulary
MAX_POSITIONS = 512  # BERT's position table; GPT-2's causal mask buffer is 1024


class ZooBuilder(GraphBuilder):
    """GraphBuilder plus spatial bookkeeping and the layers the zoo shares."""

    def __init__(self, seed: int, batch: int, hw: int) -> None:
        super().__init__(seed)
        self.batch = batch
        self.hw = hw  # spatial size of the tensor being built (square images)

    def normal(self, std: float, *shape: int) -> np.ndarray:
        """float32 N(0, std^2) samples, drawn in float32 (fast for 100 M-element weights)."""
        return self.rng.standard_normal(shape, np.float32) * np.float32(std)

    def weight(self, *shape: int, fan_in: int | None = None, hint: str = "w") -> str:
        fan = fan_in or int(np.prod(shape[1:])) or 1
        return self.const(self.normal(1 / math.sqrt(fan), *shape), hint)

    # --------------------------------------------------------------- convolution

    def conv2d(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
               pad: int | None = None, auto_pad: str | None = None, bias: bool = False,
               gain: float = 2.0) -> str:
        """A k x k convolution; updates `hw`. gain 2 is He scaling (ReLU follows)."""
        fan_in = cin // group * k * k
        w = self.const(self.normal(math.sqrt(gain / fan_in), cout, cin // group, k, k), "w")
        args = [x, w]
        if bias:
            args.append(self.const(self.rng.normal(0, 0.02, cout).astype(np.float32), "b"))
        attrs: dict[str, object] = {"kernel_shape": [k, k], "strides": [stride, stride]}
        if group != 1:
            attrs["group"] = group
        if auto_pad is not None:
            attrs["auto_pad"] = auto_pad
            self.hw = -(-self.hw // stride)
        else:
            p = k // 2 if pad is None else pad
            attrs["pads"] = [p] * 4
            self.hw = (self.hw + 2 * p - k) // stride + 1
        return self.op("Conv", *args, **attrs)

    def pool(self, op_type: str, x: str, k: int, stride: int, pad: int = 0,
             ceil: bool = False) -> str:
        attrs: dict[str, object] = {"kernel_shape": [k, k], "strides": [stride, stride]}
        if pad:
            attrs["pads"] = [pad] * 4
        if ceil:
            attrs["ceil_mode"] = 1
        span = self.hw + 2 * pad - k
        self.hw = (-(-span // stride) if ceil else span // stride) + 1
        return self.op(op_type, x, **attrs)

    def bn(self, x: str, c: int, gain: float = 1.0) -> str:
        """BatchNormalization with gamma ~ gain * U(0.8, 1.2) and running stats near (0, 1)."""
        r = self.rng
        scale = self.const((gain * r.uniform(0.8, 1.2, c)).astype(np.float32), "gamma")
        shift = self.const(r.normal(0, 0.05, c).astype(np.float32), "beta")
        mean = self.const(r.normal(0, 0.05, c).astype(np.float32), "mean")
        var = self.const(r.uniform(0.8, 1.2, c).astype(np.float32), "var")
        return self.op("BatchNormalization", x, scale, shift, mean, var, epsilon=1e-5)

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = "relu", gain: float = 1.0, **conv: object) -> str:
        h = self.bn(self.conv2d(x, cin, cout, k, stride, group,
                                gain=2.0 if act else 1.0, **conv),
                    cout, gain)
        if act == "relu":
            return self.op("Relu", h)
        if act == "relu6":
            return self.relu6(h)
        if act == "silu":
            return self.silu(h)
        return h

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), "i")

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, np.float32), "s")

    def classifier(self, x: str, cin: int, classes: int) -> str:
        """Global average pooling, flatten, dense layer."""
        return self.linear(self.op("Flatten", self.op("GlobalAveragePool", x), axis=1),
                           cin, classes)

    # --------------------------------------------------------------- transformer

    def dense3(self, x: str, din: int, dout: int, std: float | None = None) -> str:
        """x @ W + b on a [batch, seq, din] tensor (MatMul + Add, as exporters emit it)."""
        w = self.const(self.normal(std or 1 / math.sqrt(din), din, dout), "w")
        return self.op("Add", self.op("MatMul", x, w), self.const(self.normal(0.02, dout), "b"))

    def layer_norm(self, x: str, dim: int, decomposed: bool = False) -> str:
        gamma = self.const(self.rng.uniform(0.8, 1.2, dim).astype(np.float32), "ln_g")
        beta = self.const(self.rng.normal(0, 0.05, dim).astype(np.float32), "ln_b")
        if not decomposed:
            return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-5)
        # the pre-opset-17 export: ReduceMean (axes attribute), Pow, Sqrt
        centred = self.op("Sub", x, self.op("ReduceMean", x, axes=[-1]))
        var = self.op("ReduceMean", self.op("Pow", centred, self.scalar(2.0)), axes=[-1])
        std = self.op("Sqrt", self.op("Add", var, self.scalar(1e-5)))
        return self.op("Add", self.op("Mul", self.op("Div", centred, std), gamma), beta)

    def gelu_erf(self, x: str) -> str:
        erf = self.op("Erf", self.op("Div", x, self.scalar(math.sqrt(2.0))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", erf, self.scalar(1.0))),
                       self.scalar(0.5))

    def gelu_tanh(self, x: str) -> str:
        cube = self.op("Mul", self.op("Pow", x, self.scalar(3.0)), self.scalar(0.044715))
        inner = self.op("Mul", self.op("Add", x, cube), self.scalar(math.sqrt(2 / math.pi)))
        return self.op("Mul", self.op("Mul", x, self.scalar(0.5)),
                       self.op("Add", self.op("Tanh", inner), self.scalar(1.0)))

    def split_heads(self, x: str, heads: int, dh: int, perm: Sequence[int]) -> str:
        shaped = self.op("Reshape", x, self.ints(0, 0, heads, dh))
        return self.op("Transpose", shaped, perm=list(perm))

    def attention(self, q: str, k: str, v: str, dim: int, heads: int,
                  mask: Callable[[str], str] | None = None) -> str:
        """Multi-head attention on projected q, k, v; `mask` edits the scores."""
        dh = dim // heads
        qh = self.split_heads(q, heads, dh, (0, 2, 1, 3))
        kt = self.split_heads(k, heads, dh, (0, 2, 3, 1))
        vh = self.split_heads(v, heads, dh, (0, 2, 1, 3))
        scores = self.op("Div", self.op("MatMul", qh, kt), self.scalar(math.sqrt(dh)))
        if mask is not None:
            scores = mask(scores)
        ctx = self.op("MatMul", self.op("Softmax", scores, axis=-1), vh)
        return self.op("Reshape", self.op("Transpose", ctx, perm=[0, 2, 1, 3]),
                       self.ints(0, 0, dim))

    def seq_len_1d(self, x: str) -> str:
        """[seq] of a [batch, seq, ...] value as a 1-element int64 tensor (Shape -> Slice)."""
        return self.op("Slice", self.op("Shape", x), self.ints(1), self.ints(2), self.ints(0))


# ------------------------------------------------------------------------ CNNs

def squeezenet(image: int = 224, batch: int = 1, classes: int = 1000) -> onnx.ModelProto:
    """SqueezeNet 1.0 at opset 9 (floor-mode pools, Dropout with a ratio attribute)."""
    b = ZooBuilder(10, batch, image)
    h = b.op("Relu", b.conv2d("image", 3, 96, 7, 2, pad=0, bias=True))
    h = b.pool("MaxPool", h, 3, 2)
    cin = 96

    def fire(x: str, cin: int, squeeze: int, expand: int) -> str:
        s = b.op("Relu", b.conv2d(x, cin, squeeze, 1, bias=True))
        e1 = b.op("Relu", b.conv2d(s, squeeze, expand, 1, bias=True))
        e3 = b.op("Relu", b.conv2d(s, squeeze, expand, 3, bias=True))
        return b.op("Concat", e1, e3, axis=1)

    for item in ((16, 64), (16, 64), (32, 128), "pool", (32, 128), (48, 192), (48, 192),
                 (64, 256), "pool", (64, 256)):
        if item == "pool":
            h = b.pool("MaxPool", h, 3, 2)
        else:
            squeeze, expand = item
            h = fire(h, cin, squeeze, expand)
            cin = 2 * expand
    h = b.op("Dropout", h, ratio=0.5)
    h = b.op("Relu", b.conv2d(h, cin, classes, 1, bias=True, gain=0.5))
    h = b.op("Reshape", b.op("GlobalAveragePool", h), b.ints(0, classes))  # 0: the batch
    b.nodes.append(helper.make_node("Softmax", [h], ["probs"], axis=1))
    return b.model([vi("image", [batch, 3, image, image])], [vi("probs", [batch, classes])],
                   9, "squeezenet")


INCEPTION_MODULES = (  # GoogLeNet: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj
    ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),
    ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
     (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)),
    ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)),
)


def inception(image: int = 224, batch: int = 1, classes: int = 1000,
              modules: Sequence[int] = (2, 5, 2)) -> onnx.ModelProto:
    """GoogLeNet (Inception v1) at opset 10: LRN, ceil-mode max pools, 2-D Softmax."""
    b = ZooBuilder(11, batch, image)

    def conv(x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        return b.op("Relu", b.conv2d(x, cin, cout, k, stride, bias=True))

    def lrn(x: str) -> str:
        return b.op("LRN", x, size=5, alpha=1e-4, beta=0.75, bias=1.0)

    h = b.pool("MaxPool", conv("image", 3, 64, 7, 2), 3, 2, ceil=True)
    h = lrn(h)
    h = conv(conv(h, 64, 64, 1), 64, 192, 3)
    h = b.pool("MaxPool", lrn(h), 3, 2, ceil=True)
    cin = 192
    for stage, count in enumerate(modules):
        if stage:
            h = b.pool("MaxPool", h, 3, 2, ceil=True)
        for c1, r3, c3, r5, c5, pp in INCEPTION_MODULES[stage][:count]:
            hw = b.hw
            branches = [conv(h, cin, c1, 1), conv(conv(h, cin, r3, 1), r3, c3, 3),
                        conv(conv(h, cin, r5, 1), r5, c5, 5)]
            pooled = b.op("MaxPool", h, kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)
            branches.append(conv(pooled, cin, pp, 1))
            b.hw = hw
            h = b.op("Concat", *branches, axis=1)
            cin = c1 + c3 + c5 + pp
    h = b.op("Dropout", b.op("GlobalAveragePool", h), ratio=0.4)
    logits = b.linear(b.op("Flatten", h, axis=1), cin, classes)
    b.nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=1))
    return b.model([vi("image", [batch, 3, image, image])], [vi("probs", [batch, classes])],
                   10, "inception")


MOBILENET_V2 = ((1, 16, 1), (6, 24, 2), (6, 32, 2), (6, 64, 2), (6, 96, 1), (6, 160, 2),
                (6, 320, 1))  # expansion t, output channels c, first stride s


def mobilenet_v2(image: int = 224, batch: int = 1, classes: int = 1000,
                 repeats: Sequence[int] = (1, 2, 3, 4, 3, 3, 1)) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0) at opset 11: Clip(min, max inputs), ReduceMean pooling."""
    b = ZooBuilder(12, batch, image)
    h = b.conv_bn("image", 3, 32, 3, 2, act="relu6")
    cin = 32
    for (t, cout, first_stride), n in zip(MOBILENET_V2, repeats):
        for i in range(n):
            stride = first_stride if i == 0 else 1
            hidden = cin * t
            y = h if t == 1 else b.conv_bn(h, cin, hidden, 1, act="relu6")
            y = b.conv_bn(y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            residual = stride == 1 and cin == cout
            y = b.conv_bn(y, hidden, cout, 1, act=None, gain=0.5 if residual else 1.0)
            h = b.op("Add", h, y) if residual else y
            cin = cout
    h = b.conv_bn(h, cin, 1280, 1, act="relu6")
    h = b.op("ReduceMean", h, axes=[2, 3], keepdims=0)
    out = b.linear(h, 1280, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   11, "mobilenet_v2")


def shufflenet(image: int = 224, batch: int = 1, classes: int = 1000, groups: int = 3,
               repeats: Sequence[int] = (4, 8, 4)) -> onnx.ModelProto:
    """ShuffleNet v1 (g=3, width 1.0) at opset 12: grouped 1x1 convs, channel shuffle."""
    b = ZooBuilder(13, batch, image)
    h = b.conv_bn("image", 3, 24, 3, 2)
    h = b.pool("MaxPool", h, 3, 2, pad=1)
    cin = 24

    def shuffle(x: str, c: int) -> str:
        hw = b.hw
        # 0 copies the batch, as exporters keep it (a symbolic batch stays symbolic)
        x = b.op("Reshape", x, b.ints(0, groups, c // groups, hw, hw))
        x = b.op("Transpose", x, perm=[0, 2, 1, 3, 4])
        return b.op("Reshape", x, b.ints(0, c, hw, hw))

    for stage, (cout, n) in enumerate(zip((240, 480, 960), repeats)):
        for i in range(n):
            stride = 2 if i == 0 else 1
            mid = cout // 4
            first_groups = 1 if stage == 0 and i == 0 else groups
            branch_out = cout - cin if stride == 2 else cout
            y = b.conv_bn(h, cin, mid, 1, group=first_groups)
            y = shuffle(y, mid)
            hw = b.hw
            y = b.conv_bn(y, mid, mid, 3, stride, group=mid, act=None)
            y = b.conv_bn(y, mid, branch_out, 1, group=groups, act=None,
                          gain=1.0 if stride == 2 else 0.5)
            if stride == 2:
                after = b.hw
                b.hw = hw
                shortcut = b.pool("AveragePool", h, 3, 2, pad=1)
                assert b.hw == after
                h = b.op("Relu", b.op("Concat", shortcut, y, axis=1))
            else:
                h = b.op("Relu", b.op("Add", h, y))
            cin = cout
    out = b.classifier(h, cin, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   12, "shufflenet")


def resnet50(image: int = 224, batch: int = 1, classes: int = 1000,
             blocks: Sequence[int] = (3, 4, 6, 3)) -> onnx.ModelProto:
    """ResNet-50 v1.5 at opset 13: bottlenecks, BatchNormalization, Squeeze(axes input)."""
    b = ZooBuilder(14, batch, image)
    h = b.conv_bn("image", 3, 64, 7, 2)
    h = b.pool("MaxPool", h, 3, 2, pad=1)
    cin = 64
    for stage, (width, n) in enumerate(zip((64, 128, 256, 512), blocks)):
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            cout = 4 * width
            hw = b.hw
            y = b.conv_bn(h, cin, width, 1)
            y = b.conv_bn(y, width, width, 3, stride)
            y = b.conv_bn(y, width, cout, 1, act=None, gain=0.3)
            if i == 0:
                b.hw = hw
                h = b.conv_bn(h, cin, cout, 1, stride, act=None)
            h = b.op("Relu", b.op("Add", y, h))
            cin = cout
    pooled = b.op("Squeeze", b.op("GlobalAveragePool", h), b.ints(2, 3))
    out = b.linear(pooled, cin, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   13, "resnet50")


def densenet121(image: int = 224, batch: int = 1, classes: int = 1000,
                blocks: Sequence[int] = (6, 12, 24, 16), growth: int = 32) -> onnx.ModelProto:
    """DenseNet-121 at opset 14: each layer's input concatenates every earlier output."""
    b = ZooBuilder(15, batch, image)
    h = b.conv_bn("image", 3, 64, 7, 2)
    h = b.pool("MaxPool", h, 3, 2, pad=1)
    cin = 64

    def bn_relu_conv(x: str, cin: int, cout: int, k: int) -> str:
        return b.conv2d(b.op("Relu", b.bn(x, cin)), cin, cout, k)

    for stage, n in enumerate(blocks):
        features = [h]
        for _ in range(n):
            x = features[0] if len(features) == 1 else b.op("Concat", *features, axis=1)
            width = cin + growth * (len(features) - 1)
            y = bn_relu_conv(x, width, 4 * growth, 1)
            features.append(bn_relu_conv(y, 4 * growth, growth, 3))
        h = b.op("Concat", *features, axis=1)
        cin += growth * n
        if stage < len(blocks) - 1:
            h = bn_relu_conv(h, cin, cin // 2, 1)
            h = b.pool("AveragePool", h, 2, 2)
            cin //= 2
    h = b.op("Relu", b.bn(h, cin))
    out = b.classifier(h, cin, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   14, "densenet121")


EFFICIENTNET_B0 = ((1, 3, 1, 16), (6, 3, 2, 24), (6, 5, 2, 40), (6, 3, 2, 80), (6, 5, 1, 112),
                   (6, 5, 2, 192), (6, 3, 1, 320))  # expansion, kernel, first stride, channels


def efficientnet(image: int = 224, batch: int = 1, classes: int = 1000,
                 repeats: Sequence[int] = (1, 2, 2, 3, 3, 4, 1)) -> onnx.ModelProto:
    """EfficientNet-B0 at opset 15: SiLU, squeeze-excite (GlobalAveragePool, Mul), and
    TensorFlow-style SAME_UPPER padding on the strided depthwise convs."""
    b = ZooBuilder(16, batch, image)
    h = b.conv_bn("image", 3, 32, 3, 2, act="silu", auto_pad="SAME_UPPER")
    cin = 32
    for (e, k, first_stride, cout), n in zip(EFFICIENTNET_B0, repeats):
        for i in range(n):
            stride = first_stride if i == 0 else 1
            hidden = cin * e
            y = h if e == 1 else b.conv_bn(h, cin, hidden, 1, act="silu")
            pad = {"auto_pad": "SAME_UPPER"} if stride == 2 else {}
            y = b.conv_bn(y, hidden, hidden, k, stride, group=hidden, act="silu", **pad)
            squeezed = max(1, cin // 4)
            hw = b.hw
            se = b.op("GlobalAveragePool", y)
            se = b.silu(b.conv2d(se, hidden, squeezed, 1, bias=True))
            se = b.op("Sigmoid", b.conv2d(se, squeezed, hidden, 1, bias=True, gain=1.0))
            b.hw = hw
            y = b.op("Mul", y, se)
            residual = stride == 1 and cin == cout
            y = b.conv_bn(y, hidden, cout, 1, act=None, gain=0.5 if residual else 1.0)
            h = b.op("Add", h, y) if residual else y
            cin = cout
    h = b.conv_bn(h, cin, 1280, 1, act="silu")
    out = b.classifier(h, 1280, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   15, "efficientnet")


def vgg19(image: int = 224, batch: int = 1, classes: int = 1000) -> onnx.ModelProto:
    """VGG-19 at opset 13: 16 3x3 convs, five max pools, 4096-4096-classes dense head
    (at 224x224: 143.7 M parameters, 575 MB = 548 MiB of float32 weights)."""
    b = ZooBuilder(17, batch, image)
    h, cin = "image", 3
    for width, n in ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)):
        for _ in range(n):
            h = b.op("Relu", b.conv2d(h, cin, width, 3, bias=True))
            cin = width
        h = b.pool("MaxPool", h, 2, 2)
    h = b.op("Flatten", h, axis=1)
    h = b.op("Relu", b.linear(h, cin * b.hw * b.hw, 4096))
    h = b.op("Relu", b.linear(h, 4096, 4096))
    out = b.linear(h, 4096, classes)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, image, image])], [vi("logits", [batch, classes])],
                   13, "vgg19")


# ---------------------------------------------------------------- transformers

def bert(seq: int = 128, batch: int = 2, layers: int = 12, dim: int = 768, heads: int = 12,
         ffn: int = 3072, vocab: int = VOCAB) -> onnx.ModelProto:
    """BERT-base encoder at opset 17: token + position + segment embeddings, post-norm
    layers with LayerNormalization, GELU via Erf and the attention mask applied by Where;
    outputs the last hidden state and the tanh pooler."""
    b = ZooBuilder(18, batch, 0)
    words = b.op("Gather", b.const(b.normal(1.0, vocab, dim), "wte"),
                 "input_ids", axis=0)
    # position ids: arange(512)[:, :seq], the slice bound read off input_ids' shape
    positions = b.op("Slice", b.const(np.arange(MAX_POSITIONS, dtype=np.int64)[None], "pos_ids"),
                     b.ints(0), b.seq_len_1d("input_ids"), b.ints(1))
    pos = b.op("Gather", b.const(b.normal(1.0, MAX_POSITIONS, dim), "wpe"), positions, axis=0)
    segment = b.const(b.rng.normal(0, 1, (1, dim)).astype(np.float32), "segment")
    h = b.layer_norm(b.op("Add", b.op("Add", words, pos), segment), dim)

    # attention_mask [batch, seq] (1 = attend) -> [batch, 1, 1, seq] bool
    keep = b.op("Cast", b.op("Unsqueeze", "attention_mask", b.ints(1, 2)), to=TensorProto.BOOL)
    masked = b.scalar(float(np.finfo(np.float32).min))

    def mask(scores: str) -> str:
        return b.op("Where", keep, scores, masked)

    for _ in range(layers):
        q, k, v = (b.dense3(h, dim, dim) for _ in range(3))
        ctx = b.attention(q, k, v, dim, heads, mask)
        h = b.layer_norm(b.op("Add", h, b.dense3(ctx, dim, dim)), dim)
        inner = b.gelu_erf(b.dense3(h, dim, ffn))
        h = b.layer_norm(b.op("Add", h, b.dense3(inner, ffn, dim)), dim)
    b.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    first = b.op("Gather", h, b.const(np.array(0, np.int64), "cls"), axis=1)
    b.nodes.append(helper.make_node("Tanh", [b.linear(first, dim, dim)], ["pooler_output"]))
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])
    attn = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq])
    return b.model([ids, attn], [vi("last_hidden_state", [batch, seq, dim]),
                                 vi("pooler_output", [batch, dim])], 17, "bert")


def gpt2(seq: int = 128, batch: int = 1, layers: int = 1, dim: int = 768, heads: int = 12,
         positions: int = 1024) -> onnx.ModelProto:
    """GPT-2 (small) decoder block(s) at opset 16: pre-norm LayerNorm written out with
    ReduceMean, fused QKV projection cut by Split(split input), the causal mask sliced
    from a [1, 1, 1024, 1024] buffer and applied by Where, tanh-approximated GELU."""
    b = ZooBuilder(19, batch, 0)
    bias = b.const(np.tril(np.ones((positions, positions), bool))[None, None], "causal")
    n = b.seq_len_1d("hidden")
    zero = b.ints(0)
    causal = b.op("Slice", b.op("Slice", bias, zero, n, b.ints(2)), zero, n, b.ints(3))
    masked = b.scalar(float(np.finfo(np.float32).min))

    def mask(scores: str) -> str:
        return b.op("Where", causal, scores, masked)

    h = "hidden"
    for _ in range(layers):
        qkv = b.dense3(b.layer_norm(h, dim, decomposed=True), dim, 3 * dim)
        q, k, v = (f"{qkv}_{part}" for part in "qkv")
        b.nodes.append(helper.make_node("Split", [qkv, b.ints(dim, dim, dim)], [q, k, v],
                                        axis=2))
        ctx = b.attention(q, k, v, dim, heads, mask)
        h = b.op("Add", h, b.dense3(ctx, dim, dim, std=0.5 / math.sqrt(dim)))
        inner = b.gelu_tanh(b.dense3(b.layer_norm(h, dim, decomposed=True), dim, 4 * dim))
        h = b.op("Add", h, b.dense3(inner, 4 * dim, dim, std=0.5 / math.sqrt(4 * dim)))
    b.nodes.append(helper.make_node("Identity", [b.layer_norm(h, dim, decomposed=True)],
                                    ["out"]))
    return b.model([vi("hidden", [batch, seq, dim])], [vi("out", [batch, seq, dim])], 16,
                   "gpt2")


def vit(image: int = 224, batch: int = 1, layers: int = 1, dim: int = 768, heads: int = 12,
        patch: int = 16) -> onnx.ModelProto:
    """ViT-B/16 patch embedding at opset 17: a patch x patch, stride-patch convolution,
    flattened to tokens, a class token broadcast by Expand, learned position embeddings,
    then `layers` pre-norm encoder layers and the final LayerNormalization."""
    b = ZooBuilder(20, batch, image)
    tokens = (image // patch) ** 2
    h = b.conv2d("image", 3, dim, patch, patch, pad=0, bias=True, gain=1.0)
    h = b.op("Transpose", b.op("Reshape", h, b.ints(0, dim, -1)), perm=[0, 2, 1])
    batch_1d = b.op("Slice", b.op("Shape", "image"), b.ints(0), b.ints(1))
    cls_shape = b.op("Concat", batch_1d, b.ints(1, dim), axis=0)
    cls = b.op("Expand", b.const(b.rng.normal(0, 1, (1, 1, dim)).astype(np.float32), "cls"),
               cls_shape)
    h = b.op("Concat", cls, h, axis=1)
    h = b.op("Add", h, b.const(b.rng.normal(0, 0.5, (1, tokens + 1, dim)).astype(np.float32),
                               "pos_embed"))
    for _ in range(layers):
        x = b.layer_norm(h, dim)
        q, k, v = (b.dense3(x, dim, dim) for _ in range(3))
        h = b.op("Add", h, b.dense3(b.attention(q, k, v, dim, heads), dim, dim))
        inner = b.gelu_erf(b.dense3(b.layer_norm(h, dim), dim, 4 * dim))
        h = b.op("Add", h, b.dense3(inner, 4 * dim, dim, std=0.5 / math.sqrt(4 * dim)))
    b.nodes.append(helper.make_node("Identity", [b.layer_norm(h, dim)], ["tokens"]))
    return b.model([vi("image", [batch, 3, image, image])],
                   [vi("tokens", [batch, tokens + 1, dim])], 17, "vit")


# ----------------------------------------------------------------- the model set

@dataclass(frozen=True)
class ZooEntry:
    """One model of the set: its builder and the arguments for each use.

    test: full depth and width at a reduced resolution / sequence length;
    full: the published input size (bench/compile.py);
    shallow: reduced depth as well, for quick checks of the compile path.
    """

    build: Callable[..., onnx.ModelProto]
    opset: int
    test: dict[str, object] = field(default_factory=dict)
    full: dict[str, object] = field(default_factory=dict)
    shallow: dict[str, object] = field(default_factory=dict)

    def model(self, size: str = "test") -> onnx.ModelProto:
        return self.build(**getattr(self, size))


ZOO: dict[str, ZooEntry] = {
    "squeezenet": ZooEntry(squeezenet, 9, {"image": 64}, {"image": 224}, {"image": 64}),
    "inception": ZooEntry(inception, 10, {"image": 64}, {"image": 224},
                          {"image": 64, "modules": (1, 1, 1)}),
    "mobilenet_v2": ZooEntry(mobilenet_v2, 11, {"image": 64}, {"image": 224},
                             {"image": 64, "repeats": (1, 1, 1, 1, 1, 1, 1)}),
    "shufflenet": ZooEntry(shufflenet, 12, {"image": 64}, {"image": 224},
                           {"image": 64, "repeats": (1, 1, 1)}),
    "resnet50": ZooEntry(resnet50, 13, {"image": 64}, {"image": 224},
                         {"image": 64, "blocks": (1, 1, 1, 1)}),
    "densenet121": ZooEntry(densenet121, 14, {"image": 64}, {"image": 224},
                            {"image": 64, "blocks": (2, 2, 2, 2)}),
    "efficientnet": ZooEntry(efficientnet, 15, {"image": 64}, {"image": 224},
                             {"image": 64, "repeats": (1, 1, 1, 1, 1, 1, 1)}),
    "gpt2": ZooEntry(gpt2, 16, {"seq": 32}, {"seq": 128}, {"seq": 32}),
    "bert": ZooEntry(bert, 17, {"seq": 16, "vocab": 1024}, {"seq": 128},
                     {"seq": 16, "vocab": 1024, "layers": 2}),
    "vit": ZooEntry(vit, 17, {"image": 64}, {"image": 224}, {"image": 64}),
}


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: N(0, 1) floats, token ids below the embedding table's size,
    and an attention mask whose last rows hide a growing tail of positions."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            out[v.name] = rng.normal(0, 1, shape).astype(np.float32)
        elif v.name == "input_ids":
            vocab = next(i.dims[0] for i in model.graph.initializer if i.name.startswith("wte"))
            out[v.name] = rng.integers(0, vocab, shape, dtype=np.int64)
        elif v.name == "attention_mask":
            batch, seq = shape
            lengths = [seq - (seq // 4) * i // max(1, batch - 1) for i in range(batch)]
            out[v.name] = (np.arange(seq)[None] < np.array(lengths)[:, None]).astype(np.int64)
        else:
            raise ValueError(f"no example values for input {v.name!r}")
    return out


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the float/int initializers (the weights a compiled library carries)."""
    return sum(int(np.prod(i.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(
        i.data_type).itemsize for i in model.graph.initializer)
