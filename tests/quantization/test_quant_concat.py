"""Quantized data movement: QDQ Concat, Split and nearest Resize run on the integers.

A Concat between DequantizeLinear and QuantizeLinear nodes becomes `qlinear_concat`
(onnxruntime's QLinearConcat): an input with the output's scale and zero point is
copied, another one requantized, quantize(dequantize(v)) in float32. A Split or a
nearest Resize with one scale and zero point around it moves the integers. The
results equal onnxruntime's, every value of each input type included.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir import graph as g
from kiln.script import from_source, print_module
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import ort_session

U8, I8 = TensorProto.UINT8, TensorProto.INT8
#: each input 2**16 elements: qlinear_concat's tile loops run in parallel (worth_parallel)
SHAPE = (1, 2, 128, 256)


def _model() -> onnx.ModelProto:
    """Three integer inputs: a (uint8), b (uint8, other parameters), c (int8).
    y1 = concat(a, b, c) quantized with a's parameters (a copied, b and c requantized);
    y2 = concat(b, a) quantized with parameters no input has, along the last axis;
    y3, y4 = the parts of split(a); y5 = resize(a, nearest, x2); y6 = concat(a, a
    quantized per channel): per-channel parameters stay float."""
    b = GraphBuilder()
    b.consts({"sa": np.float32(0.05), "za": np.uint8(120), "sb": np.float32(0.0731),
              "zb": np.uint8(3), "sc": np.float32(0.031), "zc": np.int8(-7),
              "sy": np.float32(0.0437), "zy": np.uint8(131),
              "sp": np.array([0.05, 0.06], np.float32), "zp": np.array([120, 0], np.uint8),
              "scales": np.array([1, 1, 2, 2], np.float32)})
    b.node("DequantizeLinear", ["a", "sa", "za"], ["fa"])
    b.node("DequantizeLinear", ["b", "sb", "zb"], ["fb"])
    b.node("DequantizeLinear", ["c", "sc", "zc"], ["fc"])
    b.node("Concat", ["fa", "fb", "fc"], ["cat1"], axis=1)
    b.node("QuantizeLinear", ["cat1", "sa", "za"], ["y1"])
    b.node("Concat", ["fb", "fa"], ["cat2"], axis=-1)
    b.node("QuantizeLinear", ["cat2", "sy", "zy"], ["y2"])
    b.node("Split", ["fa"], ["s1", "s2"], axis=1)
    b.node("QuantizeLinear", ["s1", "sa", "za"], ["y3"])
    b.node("QuantizeLinear", ["s2", "sa", "za"], ["y4"])
    b.node("Resize", ["fa", "", "scales"], ["r"], mode="nearest")
    b.node("QuantizeLinear", ["r", "sa", "za"], ["y5"])
    b.node("DequantizeLinear", ["a", "sp", "zp"], ["fp"], axis=1)
    b.node("Concat", ["fa", "fp"], ["cat3"], axis=1)
    b.node("QuantizeLinear", ["cat3", "sa", "za"], ["y6"])
    for name, dtype in (("a", U8), ("b", U8), ("c", I8)):
        b.input(name, list(SHAPE), dtype)
    n, c, h, w = SHAPE
    for name, shape in (("y1", [n, 3 * c, h, w]), ("y2", [n, c, h, 2 * w]),
                        ("y3", [n, 1, h, w]), ("y4", [n, 1, h, w]),
                        ("y5", [n, c, 2 * h, 2 * w]), ("y6", [n, 2 * c, h, w])):
        b.output(name, shape, U8)
    return b.model(opset=13)


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return _model()


def _feed() -> dict[str, np.ndarray]:
    # every value of each type, in a shuffled order
    rng = np.random.default_rng(3)
    size = int(np.prod(SHAPE))
    return {"a": rng.permutation(size).astype(np.uint8).reshape(SHAPE),
            "b": rng.permutation(size).astype(np.uint8).reshape(SHAPE),
            "c": (rng.permutation(size) % 256 - 128).astype(np.int8).reshape(SHAPE)}


def test_qdq_data_movement_runs_on_integers(model: onnx.ModelProto) -> None:
    mod = QuantizeOps()(from_onnx(model))
    fn = mod["main"]
    ops = Counter(b.value.op for b in fn.bindings if isinstance(b.value, g.Call))
    # two concats of integers; the per-channel one (y6) stays float: its two
    # dequantizations and one quantization are all that is left of the QDQ pairs
    assert ops["qlinear_concat"] == 2 and ops["concat"] == 1
    assert ops["dequantize_linear"] == 2 and ops["quantize_linear"] == 1
    assert ops["split"] == 0 and ops["strided_slice"] == 2 and ops["resize"] == 1
    # the parameters print and parse back exactly
    assert_structural_equal(from_source(print_module(mod)), mod)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_qdq_data_movement_equals_onnxruntime(model: onnx.ModelProto, target: str) -> None:
    feed = _feed()
    want = ort_session(model).run(None, feed)
    got = kiln.compile(from_onnx(model), target)["main"](*feed.values())
    for k, (x, y) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(x), y, err_msg=f"output y{k + 1}")
