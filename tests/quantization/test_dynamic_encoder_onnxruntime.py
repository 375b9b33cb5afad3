"""A dynamically quantized encoder computed as onnxruntime computes it, bit for bit.

In an int8 BERT the float ops between the quantized products (softmax, GELU, the
residual layer norms) decide which integer each value quantizes to in the next
DynamicQuantizeLinear: a difference of one float32 ulp flips a few of them, and over
12 layers the flips compound to a relative L2 of about 2e-2 (onnxruntime against its
own unfused graph). kiln computes those ops with onnxruntime's arithmetic: its MLAS
exp, softmax lane sums and erf (kiln.kernels.math, kiln.kernels.rows.loops'
`folded_sum`), its Gelu fusion's formula (recognize-composites) and its
SkipLayerNormalization's Welford statistics (kiln.kernels.rows.layer_norm_onnxruntime's
`layer_norm_welford_rows`). Here a 2-layer encoder quantized by
`quantize_dynamic` runs in kiln and onnxruntime with every layer's softmax, GELU and
layer norms exposed as outputs: each equals onnxruntime's to the bit (0 ulp), on llvm
and on C compiled for this CPU. The MLAS kernels matched are onnxruntime's AVX-512 and
AVX2 ones (with FMA; their softmax lane sums reduce in different orders,
RowLoops.folded_sum): elsewhere the test skips.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.target import Target
from kiln.target.host import machine_config
from kiln.target.isa import isa_for
from quantization.quantized_models import quantize_dynamic_model
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

LAYERS, SEQ, DIM, HEADS, FFN = 2, 32, 256, 4, 512


def _encoder() -> tuple[onnx.ModelProto, list[str]]:
    """Post-norm encoder layers (as bench/nets.py's), every softmax, GELU and layer norm
    also a graph output; those output names, in graph order."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    consts: dict[str, np.ndarray] = {
        "heads": np.array([0, 0, HEADS, DIM // HEADS], np.int64),
        "merged": np.array([0, 0, DIM], np.int64),
        "scale": np.array(math.sqrt(DIM // HEADS), np.float32),
        "sqrt2": np.array(math.sqrt(2), np.float32),
        "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    count = iter(range(10_000))
    watched: list[tuple[str, list[int]]] = []

    def name(kind: str) -> str:
        return f"{kind}{next(count)}"

    def op(kind: str, *inputs: str, **attrs: object) -> str:
        out = name(kind.lower())
        b.node(kind, list(inputs), [out], **attrs)
        return out

    def proj(x: str, din: int, dout: int) -> str:
        w, bias = name("w"), name("b")
        consts[w] = rng.normal(0, 1 / math.sqrt(din), (din, dout)).astype(np.float32)
        consts[bias] = rng.normal(0, 0.1, dout).astype(np.float32)
        return op("Add", op("MatMul", x, w), bias)

    def layer_norm(x: str) -> str:
        g, beta = name("ln_g"), name("ln_b")
        consts[g] = rng.uniform(0.8, 1.2, DIM).astype(np.float32)
        consts[beta] = rng.normal(0, 0.1, DIM).astype(np.float32)
        out = op("LayerNormalization", x, g, beta, axis=-1, epsilon=1e-5)
        watched.append((out, [1, SEQ, DIM]))
        return out

    def heads(x: str, perm: list[int]) -> str:
        return op("Transpose", op("Reshape", x, "heads"), perm=perm)

    h = "x"
    for _ in range(LAYERS):
        q, k, v = (heads(proj(h, DIM, DIM), p) for p in ([0, 2, 1, 3], [0, 2, 3, 1],
                                                           [0, 2, 1, 3]))
        probs = op("Softmax", op("Div", op("MatMul", q, k), "scale"), axis=-1)
        watched.append((probs, [1, HEADS, SEQ, SEQ]))
        ctx = op("Reshape", op("Transpose", op("MatMul", probs, v), perm=[0, 2, 1, 3]),
                 "merged")
        h = layer_norm(op("Add", h, proj(ctx, DIM, DIM)))
        hidden = proj(h, DIM, FFN)
        erf = op("Erf", op("Div", hidden, "sqrt2"))
        gelu = op("Mul", op("Mul", hidden, op("Add", erf, "one")), "half")
        watched.append((gelu, [1, SEQ, FFN]))
        h = layer_norm(op("Add", h, proj(gelu, FFN, DIM)))
    b.consts(consts)
    b.input("x", [1, SEQ, DIM])
    for out, shape in watched:
        b.output(out, shape)
    return b.model(opset=17, name="encoder"), [out for out, _ in watched]


@pytest.fixture(scope="module")
def encoder() -> tuple[onnx.ModelProto, list[str], dict[str, np.ndarray], list[np.ndarray]]:
    host = isa_for(Target(machine_config()))  # onnxruntime runs the machine's kernels
    if not ((host.has("avx512f") or host.has("avx2")) and host.fma):
        pytest.skip("the MLAS kernels matched are onnxruntime's AVX-512 and AVX2 ones")
    model, names = _encoder()
    qmodel = quantize_dynamic_model(model)
    feed = {"x": np.random.default_rng(42).standard_normal((1, SEQ, DIM)).astype(np.float32)}
    return qmodel, names, feed, onnxruntime_outputs(qmodel, feed)


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in float32 ulps (ordered bit patterns) between a and b."""
    ia, ib = (np.asarray(v, np.float32).view(np.int32).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(i < 0, -(i & 0x7FFFFFFF), i) for i in (ia, ib))
    return int(np.abs(ia - ib).max())


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_softmax_gelu_layer_norm_equal_onnxruntime(
        encoder: tuple[onnx.ModelProto, list[str], dict[str, np.ndarray], list[np.ndarray]],
        kind: str) -> None:
    qmodel, names, feed, expected = encoder
    config = Target(machine_config()).export()  # the machine's CPU, as onnxruntime's
    config["kind"] = kind  # C compiled for this CPU: its FMA, as onnxruntime's kernels
    # the quantized products as this host's onnxruntime computes them (AVX2: saturating)
    got = kiln.compile(from_onnx(qmodel), like_onnxruntime(Target(config)))["main"](feed["x"])
    # in graph order: the first op that differs is named, with its distance in ulps
    for name, g, want in zip(names, got, expected):
        assert _ulps(np.asarray(g), want) == 0, (name, _ulps(np.asarray(g), want))
