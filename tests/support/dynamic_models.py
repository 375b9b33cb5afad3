"""ONNX models with symbolic dimensions, built with onnx.helper (deterministic weights).

- `encoder(batch, seq, layers, width)`: a transformer encoder over `features`
  `[batch, seq, width]` with an attention `mask` `[batch, seq]` (int64, 1 = keep)
  sharing `seq`; multi-head attention (MatMul, Transpose, Softmax, the mask applied
  with Where), LayerNormalization, GELU as Erf (`gelu_op`: the Gelu operator). With
  `torch_style=False` the head reshapes use 0/-1 targets; with `torch_style=True`
  they take their targets from Shape -> Gather -> Unsqueeze -> Concat subgraphs, as
  PyTorch exports them.
- `cnn(batch)`: Conv, BatchNormalization, Relu, MaxPool, GlobalAveragePool, Flatten,
  Gemm over `image` `[batch, 3, 16, 16]`.

A dimension argument that is a str is a `dim_param`; an int fixes it; None leaves it
dynamic and unnamed. `feeds(model, sizes)` draws inputs for given dimension values.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from support.graphs import GraphBuilder
from support.graphs import value_info as vi
from support.reference import onnxruntime_outputs

Dim = int | str | None



def encoder(batch: Dim = "batch", seq: Dim = "seq", layers: int = 2, width: int = 64,
            heads: int = 4, ffn: int = 128, torch_style: bool = False,
            gelu_op: bool = False) -> onnx.ModelProto:
    """A `layers`-layer transformer encoder with symbolic `(batch, seq)` (module docstring)."""
    b = GraphBuilder(12)
    dh = width // heads
    i64 = lambda *v: b.const(np.array(v, np.int64), "shape")  # noqa: E731

    proj = b.proj

    def layer_norm(x: str) -> str:
        return b.layer_norm(x, width)

    def dims_of(x: str) -> tuple[str, str]:
        shape = b.op("Shape", x)
        return tuple(b.op("Unsqueeze", b.op("Gather", shape, b.const(np.array(a, np.int64), "i"),
                                            axis=0), i64(0)) for a in (0, 1))  # type: ignore[return-value]

    def split_heads(x: str) -> str:
        if torch_style:
            n, s = dims_of(x)
            target = b.op("Concat", n, s, i64(heads, dh), axis=0)
        else:
            target = i64(0, 0, heads, dh)
        return b.op("Transpose", b.op("Reshape", x, target), perm=[0, 2, 1, 3])

    def merge_heads(ctx: str, like: str) -> str:
        ctx = b.op("Transpose", ctx, perm=[0, 2, 1, 3])
        if torch_style:
            n, s = dims_of(like)
            target = b.op("Concat", n, s, i64(-1), axis=0)
        else:
            target = i64(0, 0, -1)
        return b.op("Reshape", ctx, target)

    # mask [batch, seq] -> padded positions [batch, 1, 1, seq]
    padded = b.op("Unsqueeze", b.op("Equal", "mask", i64(0)), i64(1, 2))
    big_negative = b.const(np.array(-1e4, np.float32), "neg")

    def attention(x: str) -> str:
        q, k, v = (split_heads(proj(x, width, width)) for _ in range(3))
        scores = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])),
                      b.const(np.array(math.sqrt(dh), np.float32), "scale"))
        scores = b.op("Where", padded, big_negative, scores)
        ctx = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
        return proj(merge_heads(ctx, x), width, width)

    def gelu(x: str) -> str:
        return b.op("Gelu", x) if gelu_op else b.gelu_erf(x)  # Gelu: the opset-20 operator

    h = "features"
    for _ in range(layers):
        h = layer_norm(b.op("Add", h, attention(h)))
        h = layer_norm(b.op("Add", h, proj(gelu(proj(h, width, ffn)), ffn, width)))
    b.nodes.append(helper.make_node("Identity", [h], ["encoded"]))
    return b.model([vi("features", [batch, seq, width]),
                    vi("mask", [batch, seq], TensorProto.INT64)],
                   [vi("encoded", [batch, seq, width])], 20 if gelu_op else 17,
                   "encoder_torch" if torch_style else "encoder")


def cnn(batch: Dim = "batch") -> onnx.ModelProto:
    """A small CNN with a symbolic batch (module docstring)."""
    b = GraphBuilder(13)
    h = b.op("Relu", b.bn(b.conv("image", 3, 8, 3), 8))
    h = b.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Relu", b.conv(h, 8, 16, 3, stride=2))
    h = b.op("Flatten", b.op("GlobalAveragePool", h), axis=1)
    out = b.linear(h, 16, 10)
    b.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return b.model([vi("image", [batch, 3, 16, 16])], [vi("logits", [batch, 10])], 13, "cnn")


def feeds(model: onnx.ModelProto, sizes: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for `model` with its dimensions named in `sizes` at those values.

    An int64 input is an attention mask: each row keeps a random prefix (at least one).
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for v in model.graph.input:
        tt = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param]
                 for d in tt.shape.dim]
        if tt.elem_type == TensorProto.INT64:
            keep = rng.integers(1, shape[-1] + 1, size=shape[:-1])
            out[v.name] = (np.arange(shape[-1]) < keep[..., None]).astype(np.int64)
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def reference(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's first output of `model` on `feed` (the tests' reference)."""
    return onnxruntime_outputs(model, feed)[0]
