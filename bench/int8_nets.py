"""The CNNs of the int8 model set that bench/nets.py does not have, built with its `Graph`
(deterministic random weights, batch 1, 224x224; the shapes of the published networks).

Not a benchmark itself: `bench/models.py --int8` quantizes and times them.

- `resnet50`: ResNet-50 (7x7/2 stem, 3x3/2 max pool, bottleneck blocks 3/4/6/3 at
  64/128/256/512 x4 channels, stride on the 3x3, 1x1 projection shortcuts);
- `squeezenet`: SqueezeNet 1.1 (fire modules: 1x1 squeeze, 1x1 and 3x3 expand, concat);
- `inception`: GoogLeNet (Inception v1: nine inception modules of 1x1, 3x3, 5x5 and
  pooled 1x1 branches, concatenated; no auxiliary heads);
- `densenet121`: DenseNet-121 (growth 32, blocks of 6/12/24/16 BN-ReLU-1x1-BN-ReLU-3x3
  layers whose outputs are concatenated, transitions halving channels and size).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from nets import Graph, Shapes

IMAGE = {"x": [1, 3, 224, 224]}


def _conv_bn_relu(g: Graph, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
    return g.op("Relu", g.bn(g.conv(x, cin, cout, k, stride, bias=False), cout))


def _head(g: Graph, h: str, c: int, name: str) -> tuple[onnx.ModelProto, Shapes]:
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    return g.model(name, IMAGE, g.dense(h, c, 1000), [1, 1000])


def resnet50() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(7)
    h = _conv_bn_relu(g, "x", 3, 64, 7, 2)
    h = g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = _conv_bn_relu(g, h, cin, width, 1)
            y = _conv_bn_relu(g, y, width, width, 3, stride)
            y = g.bn(g.conv(y, width, 4 * width, 1, bias=False), 4 * width)
            shortcut = h
            if stride != 1 or cin != 4 * width:
                shortcut = g.bn(g.conv(h, cin, 4 * width, 1, stride, bias=False), 4 * width)
            h = g.op("Relu", g.op("Add", y, shortcut))
            cin = 4 * width
    return _head(g, h, cin, "resnet50")


def squeezenet() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(8)

    def pool(h: str) -> str:
        return g.op("MaxPool", h, kernel_shape=[3, 3], strides=[2, 2])

    def fire(h: str, cin: int, squeeze: int, expand: int) -> str:
        s = g.op("Relu", g.conv(h, cin, squeeze, 1))
        return g.op("Concat", g.op("Relu", g.conv(s, squeeze, expand, 1)),
                    g.op("Relu", g.conv(s, squeeze, expand, 3)), axis=1)

    h = pool(g.op("Relu", g.conv("x", 3, 64, 3, 2)))
    h = pool(fire(fire(h, 64, 16, 64), 128, 16, 64))
    h = pool(fire(fire(h, 128, 32, 128), 256, 32, 128))
    for cin, squeeze, expand in ((256, 48, 192), (384, 48, 192), (384, 64, 256),
                                 (512, 64, 256)):
        h = fire(h, cin, squeeze, expand)
    h = g.op("Relu", g.conv(h, 512, 1000, 1))
    y = g.op("Flatten", g.op("GlobalAveragePool", h))
    return g.model("squeezenet", IMAGE, y, [1, 1000])


def inception() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(9)

    def pool(h: str, stride: int = 2) -> str:
        return g.op("MaxPool", h, kernel_shape=[3, 3], strides=[stride, stride],
                    pads=[1, 1, 1, 1])

    def module(h: str, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, cp: int) -> str:
        b1 = _conv_bn_relu(g, h, cin, c1, 1)
        b3 = _conv_bn_relu(g, _conv_bn_relu(g, h, cin, r3, 1), r3, c3, 3)
        b5 = _conv_bn_relu(g, _conv_bn_relu(g, h, cin, r5, 1), r5, c5, 5)
        bp = _conv_bn_relu(g, pool(h, 1), cin, cp, 1)
        return g.op("Concat", b1, b3, b5, bp, axis=1)

    h = pool(_conv_bn_relu(g, "x", 3, 64, 7, 2))
    h = pool(_conv_bn_relu(g, _conv_bn_relu(g, h, 64, 64, 1), 64, 192, 3))
    # (c1, r3, c3, r5, c5, pool proj) of modules 3a-3b, 4a-4e, 5a-5b, as published
    specs = ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), None,
             (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64),
             (128, 128, 256, 24, 64, 64), (112, 144, 288, 32, 64, 64),
             (256, 160, 320, 32, 128, 128), None,
             (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128))
    cin = 192
    for spec in specs:
        if spec is None:
            h = pool(h)
            continue
        h = module(h, cin, *spec)
        cin = spec[0] + spec[2] + spec[4] + spec[5]
    return _head(g, h, cin, "inception")


def densenet121() -> tuple[onnx.ModelProto, Shapes]:
    g = Graph(10)
    growth = 32

    def bn_relu(h: str, c: int) -> str:
        return g.op("Relu", g.bn(h, c))

    h = g.op("MaxPool", _conv_bn_relu(g, "x", 3, 64, 7, 2), kernel_shape=[3, 3],
             strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for i, layers in enumerate((6, 12, 24, 16)):
        for _ in range(layers):
            y = g.conv(bn_relu(h, c), c, 4 * growth, 1, bias=False)
            y = g.conv(bn_relu(y, 4 * growth), 4 * growth, growth, 3, bias=False)
            h = g.op("Concat", h, y, axis=1)
            c += growth
        if i < 3:
            h = g.conv(bn_relu(h, c), c, c // 2, 1, bias=False)
            h = g.op("AveragePool", h, kernel_shape=[2, 2], strides=[2, 2])
            c //= 2
    return _head(g, bn_relu(h, c), c, "densenet121")


INT8_CNNS: dict[str, Callable[[], tuple[onnx.ModelProto, Shapes]]] = {
    "resnet50": resnet50, "squeezenet": squeezenet, "inception": inception,
    "densenet121": densenet121,
}
