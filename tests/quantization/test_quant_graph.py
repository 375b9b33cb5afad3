"""Integer elementwise ops of quantized graphs against onnxruntime, element for element.

onnxruntime runs `DequantizeLinear x2 -> Add|Mul -> QuantizeLinear` (and the
com.microsoft QLinearAdd/QLinearMul nodes) with its MLAS float32 formulas, not
dequantize-add-quantize; kiln's `qlinear_add`/`qlinear_mul` compute the same numbers.
Scales and zero points are graph inputs in the QOperator models, so one compiled module
checks many parameter sets against onnxruntime over every pair of 8-bit values.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal, verify
from kiln.script import from_source, print_module
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import ort_session

ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}
MS = {"": 13, "com.microsoft": 1}


#: (op, A shape, B shape) of the QOperator checks: every byte pair, a per-channel operand
#: on either side (onnxruntime swaps the roles of A and B when A is the constant one
#: along the innermost axis), a scalar, both varying along the innermost axis, and equal
#: shapes (kiln's flat kernel: whole tiles, and [3, 5, 7] a partial last tile).
CASES = [("QLinearAdd", [256, 256], [256, 256]), ("QLinearAdd", [2, 16, 7, 9], [1, 16, 1, 1]),
         ("QLinearAdd", [1, 16, 1, 1], [2, 16, 7, 9]), ("QLinearAdd", [1], [3, 40]),
         ("QLinearAdd", [5, 1, 33], [5, 8, 33]), ("QLinearAdd", [3, 5, 7], [3, 5, 7]),
         ("QLinearMul", [256, 256], [256, 256]), ("QLinearMul", [3, 40], [1])]


def _qlinear_model(dtype: str, cases: list[tuple[str, list[int], list[int]]]
                   ) -> onnx.ModelProto:
    """One com.microsoft node per case; tensors, scales and zero points are all inputs."""
    b = GraphBuilder()
    for name in ("sa", "sb", "sy"):
        b.input(name, [], TensorProto.FLOAT)
    for name in ("za", "zb", "zy"):
        b.input(name, [], ELEM[dtype])
    for k, (op, a_shape, b_shape) in enumerate(cases):
        b.node(op, [f"a{k}", "sa", "za", f"b{k}", "sb", "zb", "sy", "zy"], [f"y{k}"],
               domain="com.microsoft")
        b.input(f"a{k}", a_shape, ELEM[dtype])
        b.input(f"b{k}", b_shape, ELEM[dtype])
        b.output(f"y{k}", list(np.broadcast_shapes(tuple(a_shape), tuple(b_shape))),
                 ELEM[dtype])
    return b.model(opset=MS)


def _operands(dtype: str, a_shape: list[int], b_shape: list[int],
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Operands covering every (a, b) byte pair when both are [256, 256] (else random)."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    if a_shape == b_shape == [256, 256]:
        return np.repeat(values, 256).reshape(256, 256), np.tile(values, 256).reshape(256, 256)
    return (rng.integers(info.min, info.max + 1, a_shape).astype(dtype),
            rng.integers(info.min, info.max + 1, b_shape).astype(dtype))


def _params(dtype: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    info = np.iinfo(dtype)
    out = {k: np.asarray(rng.uniform(0.005, 0.2), np.float32) for k in ("sa", "sb", "sy")}
    out.update({k: np.asarray(rng.integers(info.min, info.max + 1), dtype)
                for k in ("za", "zb", "zy")})
    return out


@pytest.mark.parametrize("dtype,target,cases", [("uint8", "llvm", CASES),
                                                ("int8", "llvm", CASES),
                                                ("uint8", "c", CASES[3:6] + CASES[7:])])
def test_qlinear_add_mul_equal_onnxruntime(dtype: str, target: str,
                                           cases: list[tuple[str, list[int], list[int]]]
                                           ) -> None:
    model = _qlinear_model(dtype, cases)
    ex = kiln.compile(from_onnx(model), target)
    fn = ex["main"]
    # the equal-shape adds run on the flat kernel
    assert any(f.attrs.get("kiln.qlinear_add") == "flat" for f in ex.ir.functions.values())
    session = ort_session(model)
    rng = np.random.default_rng(5)
    for _ in range(10):  # parameter sets
        feed = _params(dtype, rng)
        for k, (_, a_shape, b_shape) in enumerate(cases):
            feed[f"a{k}"], feed[f"b{k}"] = _operands(dtype, a_shape, b_shape, rng)
        want = session.run(None, feed)
        got = fn(*(feed[v.name] for v in model.graph.input))
        for k, case in enumerate(cases):
            assert np.asarray(got[k]).dtype == want[k].dtype
            np.testing.assert_array_equal(np.asarray(got[k]), want[k],
                                          err_msg=f"{case} {dtype} {target}")


def _equals_onnxruntime(model: onnx.ModelProto, seed: int, target: str = "llvm") -> None:
    """Every output of `model` on random byte inputs (uint8 or int8, as declared), kiln's
    against onnxruntime's."""
    rng = np.random.default_rng(seed)
    feed = {}
    for v in model.graph.input:
        np_type = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        info = np.iinfo(np_type)
        feed[v.name] = rng.integers(info.min, info.max + 1, [
            d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np_type)
    want = ort_session(model).run(None, feed)
    got = kiln.compile(from_onnx(model), target)["main"](*feed.values())
    for w, g_ in zip(want, got if len(want) > 1 else [got], strict=True):
        np.testing.assert_array_equal(np.asarray(g_), w)


def _qdq_binary(op: str, dtype: str, shape_b: list[int]) -> onnx.ModelProto:
    """DQ(a), DQ(b) -> op -> Q -> DQ, constant per-tensor parameters (QDQ form)."""
    b = GraphBuilder()
    b.consts({"sa": np.float32(0.037), "za": np.asarray(131 if dtype == "uint8" else 3, dtype),
              "sb": np.float32(0.021), "zb": np.asarray(119 if dtype == "uint8" else -5, dtype),
              "sy": np.float32(0.05), "zy": np.asarray(128 if dtype == "uint8" else 0, dtype)})
    b.node("DequantizeLinear", ["a", "sa", "za"], ["af"])
    b.node("DequantizeLinear", ["b", "sb", "zb"], ["bf"])
    b.node(op, ["af", "bf"], ["s"])
    b.node("QuantizeLinear", ["s", "sy", "zy"], ["q"])
    b.node("DequantizeLinear", ["q", "sy", "zy"], ["y"])
    b.input("a", [2, 8, 12, 12], ELEM[dtype])
    b.input("b", shape_b, ELEM[dtype])
    b.output("y", [2, 8, 12, 12])
    return b.model(opset=13)


@pytest.mark.parametrize("op,dtype,shape_b", [("Add", "uint8", [2, 8, 12, 12]),
                                              ("Add", "uint8", [1, 8, 1, 1]),
                                              ("Mul", "uint8", [1, 8, 1, 1])])
def test_qdq_binary_becomes_integer_op(op: str, dtype: str, shape_b: list[int]) -> None:
    model = _qdq_binary(op, dtype, shape_b)
    mod = QuantizeOps()(from_onnx(model))
    text = print_module(mod)
    name = {"Add": "qlinear_add", "Mul": "qlinear_mul"}[op]
    assert f'"{name}"' in text and '"add"' not in text and '"multiply"' not in text
    verify(mod)
    assert_structural_equal(from_source(text), mod)  # the DSL round-trips
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    feed = {"a": rng.integers(info.min, info.max + 1, (2, 8, 12, 12)).astype(dtype),
            "b": rng.integers(info.min, info.max + 1, shape_b).astype(dtype)}
    want = ort_session(model).run(None, feed)[0]   # ORT_ENABLE_ALL: its QLinear op
    got = np.asarray(kiln.compile(from_onnx(model), "llvm")["main"](feed["a"], feed["b"]))
    np.testing.assert_array_equal(got, want)


def test_qdq_int8_add_stays_float() -> None:
    """onnxruntime (x86) runs the int8 group as dequantize, add, quantize; so does kiln."""
    model = _qdq_binary("Add", "int8", [1, 8, 1, 1])
    text = print_module(QuantizeOps()(from_onnx(model)))
    assert '"add"' in text and "qlinear_add" not in text
    rng = np.random.default_rng(3)
    feed = {"a": rng.integers(-128, 128, (2, 8, 12, 12)).astype(np.int8),
            "b": rng.integers(-128, 128, (1, 8, 1, 1)).astype(np.int8)}
    want = ort_session(model).run(None, feed)[0]
    got = np.asarray(kiln.compile(from_onnx(model), "llvm")["main"](feed["a"], feed["b"]))
    np.testing.assert_array_equal(got, want)


def test_qdq_add_dequantized_per_channel_stays_float() -> None:
    """A float add whose inputs are dequantized per channel is not QLinearAdd's."""
    b = GraphBuilder()
    b.consts({"sa": np.asarray([0.03, 0.05], np.float32), "za": np.zeros(2, np.uint8),
              "sb": np.float32(0.02), "zb": np.asarray(7, np.uint8),
              "sy": np.float32(0.05), "zy": np.asarray(128, np.uint8)})
    b.node("DequantizeLinear", ["a", "sa", "za"], ["af"], axis=1)
    b.node("DequantizeLinear", ["b", "sb", "zb"], ["bf"])
    b.node("Add", ["af", "bf"], ["s"])
    b.node("QuantizeLinear", ["s", "sy", "zy"], ["y"])
    b.input("a", [1, 2, 3], TensorProto.UINT8)
    b.input("b", [1, 2, 3], TensorProto.UINT8)
    b.output("y", [1, 2, 3], TensorProto.UINT8)
    text = print_module(QuantizeOps()(from_onnx(b.model(opset=13))))
    assert '"add"' in text and "qlinear_add" not in text


@pytest.mark.parametrize("dtype,channels_last", [("uint8", 0), ("int8", 1)])
def test_qlinear_global_average_pool_equals_onnxruntime(dtype: str, channels_last: int
                                                        ) -> None:
    """The int32 sum requantized with x_scale / (y_scale * size), as MLAS computes it."""
    b = GraphBuilder()
    b.node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"],
           domain="com.microsoft", channels_last=channels_last)
    shape, out = ([2, 7, 9, 24], [2, 1, 1, 24]) if channels_last else ([2, 24, 7, 9],
                                                                       [2, 24, 1, 1])
    b.input("x", shape, ELEM[dtype])
    b.input("sx", [], TensorProto.FLOAT)
    b.input("zx", [], ELEM[dtype])
    b.input("sy", [], TensorProto.FLOAT)
    b.input("zy", [], ELEM[dtype])
    b.output("y", out, ELEM[dtype])
    model = b.model(opset=MS)
    fn = kiln.compile(from_onnx(model), "llvm")["main"]
    session = ort_session(model)
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    for _ in range(20):
        feed = {"x": rng.integers(info.min, info.max + 1, shape).astype(dtype),
                "sx": np.asarray(rng.uniform(0.01, 0.1), np.float32),
                "zx": np.asarray(rng.integers(info.min, info.max + 1), dtype),
                "sy": np.asarray(rng.uniform(0.002, 0.05), np.float32),
                "zy": np.asarray(rng.integers(info.min, info.max + 1), dtype)}
        want = session.run(None, feed)[0]
        got = np.asarray(fn(*(feed[v.name] for v in model.graph.input)))
        np.testing.assert_array_equal(got, want)


def test_qdq_global_average_pool_becomes_integer_op() -> None:
    b = GraphBuilder()
    b.consts({"sx": np.float32(0.047), "zx": np.asarray(121, np.uint8),
              "sy": np.float32(0.0123), "zy": np.asarray(3, np.uint8)})
    b.node("DequantizeLinear", ["x", "sx", "zx"], ["xf"])
    b.node("GlobalAveragePool", ["xf"], ["p"])
    b.node("QuantizeLinear", ["p", "sy", "zy"], ["y"])
    b.input("x", [1, 64, 7, 7], TensorProto.UINT8)
    b.output("y", [1, 64, 1, 1], TensorProto.UINT8)
    model = b.model(opset=13)
    mod = QuantizeOps()(from_onnx(model))
    text = print_module(mod)
    assert '"qlinear_global_average_pool"' in text and "dequantize_linear" not in text
    assert_structural_equal(from_source(text), mod)
    _equals_onnxruntime(model, 2, "c")


def test_qdq_concat_and_average_pools_equal_onnxruntime() -> None:
    """onnxruntime's QLinearConcat (inputs of other scales requantized through a table of
    quantize(dequantize(v))) gives the integers of dequantize -> concat -> quantize; its
    QLinearAveragePool averages the dequantized floats in window order but rounds
    `average / y_scale + y_zp`: a 2x2 average's exact halves round the other way in
    about a fifth of the elements unless the quantize adds the zero point first."""
    b = GraphBuilder()
    b.consts({"s1": np.float32(0.031), "z1": np.asarray(120, np.uint8),
              "s2": np.float32(0.047), "z2": np.asarray(133, np.uint8),
              "sy": np.float32(0.031), "zy": np.asarray(119, np.uint8)})
    b.node("DequantizeLinear", ["x1", "s1", "z1"], ["f1"])
    b.node("DequantizeLinear", ["x2", "s2", "z2"], ["f2"])
    b.node("Concat", ["f1", "f2"], ["c"], axis=1)
    b.node("QuantizeLinear", ["c", "sy", "zy"], ["y"])
    for name, attrs in (("p2", {"kernel_shape": [2, 2], "strides": [2, 2]}),
                        ("p3", {"kernel_shape": [3, 3], "strides": [2, 2],
                                "pads": [1, 1, 1, 1]})):
        b.node("AveragePool", ["f1"], [name], **attrs)
        b.node("QuantizeLinear", [name, "sy", "zy"], [f"y{name}"])
    b.input("x1", [1, 8, 10, 10], TensorProto.UINT8)
    b.input("x2", [1, 5, 10, 10], TensorProto.UINT8)
    b.output("y", [1, 13, 10, 10], TensorProto.UINT8)
    b.output("yp2", [1, 8, 5, 5], TensorProto.UINT8)
    b.output("yp3", [1, 8, 5, 5], TensorProto.UINT8)
    model = b.model(opset=13)
    text = print_module(QuantizeOps()(from_onnx(model)))
    assert text.count("zero_point_first") == 2
    _equals_onnxruntime(model, 8)


def test_qdq_data_movement_runs_on_integers() -> None:
    """DQ -> Reshape/Transpose/Gather -> Q with equal parameters: the op on the integers
    (onnxruntime drops these pairs); another output scale keeps the float form."""
    b = GraphBuilder()
    b.consts({"s": np.float32(0.05), "z": np.asarray(128, np.uint8), "s2": np.float32(0.07),
              "shape": np.asarray([2, 48], np.int64), "idx": np.asarray([3, 0, 2], np.int64)})
    b.node("DequantizeLinear", ["x", "s", "z"], ["f"])
    b.node("Reshape", ["f", "shape"], ["r"])
    b.node("QuantizeLinear", ["r", "s", "z"], ["yr"])
    b.node("Transpose", ["f"], ["t"], perm=[0, 2, 1, 3])
    b.node("QuantizeLinear", ["t", "s", "z"], ["yt"])
    b.node("Gather", ["f", "idx"], ["g"], axis=1)
    b.node("QuantizeLinear", ["g", "s2", "z"], ["yg"])
    b.input("x", [2, 4, 3, 4], TensorProto.UINT8)
    for name, shape in (("yr", [2, 48]), ("yt", [2, 3, 4, 4]), ("yg", [2, 3, 3, 4])):
        b.output(name, shape, TensorProto.UINT8)
    model = b.model(opset=13)
    text = print_module(QuantizeOps()(from_onnx(model)))
    assert text.count('"dequantize_linear"') == 1 and text.count('"quantize_linear"') == 1
    _equals_onnxruntime(model, 4)


def test_qlinear_average_pool_equals_onnxruntime() -> None:
    """com.microsoft QLinearAveragePool, channels first and last: 2x2 averages whose exact
    halves onnxruntime rounds after adding the zero point."""
    b = GraphBuilder()
    b.consts({"sx": np.float32(0.11), "zx": np.asarray(119, np.uint8),
              "sy": np.float32(0.11), "zy": np.asarray(119, np.uint8)})
    b.node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
           kernel_shape=[2, 2], strides=[2, 2])
    b.node("QLinearAveragePool", ["xl", "sx", "zx", "sy", "zy"], ["yl"],
           domain="com.microsoft", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
           channels_last=1)
    b.input("x", [1, 6, 8, 8], TensorProto.UINT8)
    b.input("xl", [1, 8, 8, 6], TensorProto.UINT8)
    b.output("y", [1, 6, 4, 4], TensorProto.UINT8)
    b.output("yl", [1, 4, 4, 6], TensorProto.UINT8)
    model = b.model(opset=MS)
    _equals_onnxruntime(model, 6)


def test_residual_cnn_quantized_by_onnxruntime_equals_it() -> None:
    """A small CNN with ResNet's residual addition, DenseNet's 2x2 transition average and
    a global average, quantized by onnxruntime's own quantizer (QDQ, per channel): every
    group onnxruntime runs as an integer op is one here, and the integer outputs are
    equal, not just within a quantum."""
    from quantized_models import RandomReader, integer_outputs, quantize_static_model

    from support.reference import like_onnxruntime

    b = GraphBuilder(seed=3)
    x = b.input("x", [1, 8, 16, 16])
    a = b.op("Relu", b.conv(x, 8, 16, 3))
    c = b.conv(b.op("Relu", b.conv(a, 16, 16, 3)), 16, 16, 1)
    r = b.op("Relu", b.op("Add", a, c))
    p = b.op("AveragePool", r, kernel_shape=[2, 2], strides=[2, 2])
    g = b.op("Flatten", b.op("GlobalAveragePool", b.op("Relu", b.conv(p, 16, 24, 1))))
    b.output(b.linear(g, 24, 10), [1, 10])
    model = quantize_static_model(b.model(opset=13), "QDQ")
    text = print_module(QuantizeOps()(from_onnx(model)))
    for op in ('"qlinear_add"', '"qlinear_global_average_pool"', "zero_point_first"):
        assert op in text, op
    q = integer_outputs(model)
    fn = kiln.compile(from_onnx(q), like_onnxruntime("llvm"))["main"]
    session = ort_session(q)
    reader = RandomReader(model, count=3, seed=9)
    while (feed := reader.get_next()) is not None:
        np.testing.assert_array_equal(np.asarray(fn(feed["x"])), session.run(None, feed)[0])


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_qdq_softmax_equals_onnxruntime_qlinear_softmax(target: str) -> None:
    """DQ -> Softmax -> Q (uint8 and int8) runs as onnxruntime's QLinearSoftmax: an exp
    table, a float32 sum in row order and a division."""
    b = GraphBuilder()
    b.consts({"sx": np.float32(0.173), "zx": np.asarray(97, np.uint8),
              "sy": np.float32(1 / 256), "zy": np.asarray(0, np.uint8),
              "zx2": np.asarray(-3, np.int8),
              "sy2": np.float32(0.0061), "zy2": np.asarray(-128, np.int8)})
    b.node("DequantizeLinear", ["x", "sx", "zx"], ["f"])
    b.node("Softmax", ["f"], ["s"], axis=-1)
    b.node("QuantizeLinear", ["s", "sy", "zy"], ["y"])
    b.node("DequantizeLinear", ["x2", "sx", "zx2"], ["f2"])
    b.node("Softmax", ["f2"], ["s2"], axis=-1)
    b.node("QuantizeLinear", ["s2", "sy2", "zy2"], ["y2"])
    b.input("x", [3, 1000], TensorProto.UINT8)
    b.input("x2", [2, 3, 37], TensorProto.INT8)
    b.output("y", [3, 1000], TensorProto.UINT8)
    b.output("y2", [2, 3, 37], TensorProto.INT8)
    model = b.model(opset=13)
    text = print_module(QuantizeOps()(from_onnx(model)))
    assert text.count('"qlinear_softmax"') == 2 and '"softmax"' not in text
    _equals_onnxruntime(model, 12, target)


def test_qdq_product_of_two_activations_is_an_integer_product() -> None:
    """DQ(a) @ DQ(b) -> Q with two uint8 activations (attention's Q K^T and P V, as
    onnxruntime's quantizer writes them): quantize-ops makes it `qlinear_matmul` reading B
    at run time, onnxruntime's QLinearMatMul, so the integers equal onnxruntime's, where
    the float product had rounded some of them a quantum apart."""
    b = GraphBuilder()
    # scales whose float products round: the float form was a quantum off on 0.1% of
    # these outputs
    b.consts({"sa": np.float32(0.1), "za": np.asarray(121, np.uint8),
              "sb": np.float32(0.1), "zb": np.asarray(134, np.uint8),
              "sy": np.float32(0.7), "zy": np.asarray(117, np.uint8)})
    b.node("DequantizeLinear", ["a", "sa", "za"], ["af"])
    b.node("DequantizeLinear", ["b", "sb", "zb"], ["bf"])
    b.node("MatMul", ["af", "bf"], ["p"])
    b.node("QuantizeLinear", ["p", "sy", "zy"], ["y"])
    b.input("a", [1, 4, 64, 64], TensorProto.UINT8)
    b.input("b", [1, 4, 64, 64], TensorProto.UINT8)
    b.output("y", [1, 4, 64, 64], TensorProto.UINT8)
    model = b.model(opset=13)
    text = print_module(QuantizeOps()(from_onnx(model)))
    assert '"qlinear_matmul"' in text and '"matmul"' not in text
    _equals_onnxruntime(model, 34)
    _equals_onnxruntime(model, 34, "c")


#: Row lengths of the layer norms below: tails of 4 + 3 and of 1 after chunks of 8.
LN_ROWS = (15, 17)


def _layer_norms(quantized: bool) -> onnx.ModelProto:
    """A LayerNormalization per row length of `LN_ROWS` on dequantized uint8 (each output
    quantized again when `quantized`: a static model's), or on float inputs."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    b.consts({"s": np.float32(0.05), "z": np.asarray(120, np.uint8),
              "s2": np.float32(1e-4), "z2": np.asarray(128, np.uint8)})
    for n in LN_ROWS:
        b.consts({f"g{n}": rng.normal(1, 0.2, n).astype(np.float32),
                  f"b{n}": rng.normal(0, 0.2, n).astype(np.float32)})
        if quantized:
            b.node("DequantizeLinear", [f"x{n}", "s", "z"], [f"f{n}"])
        b.node("LayerNormalization", [f"f{n}" if quantized else f"x{n}", f"g{n}", f"b{n}"],
               [f"y{n}"], axis=-1, epsilon=1e-5)
        b.input(f"x{n}", [9, n], TensorProto.UINT8 if quantized else TensorProto.FLOAT)
        b.output(f"y{n}", [9, n])
        if quantized:
            b.node("QuantizeLinear", [f"y{n}", "s2", "z2"], [f"q{n}"])
            b.output(f"q{n}", [9, n], TensorProto.UINT8)
    return b.model(opset=17)


def test_layer_norms_where_activations_are_quantized_are_marked() -> None:
    """recognize-composites marks the layer norms of a statically quantized function
    `like_onnxruntime` (onnxruntime's LayerNormalization arithmetic), not a float
    model's (which keeps the faster kernel)."""
    from kiln.transform.composite_ops import RecognizeComposites

    for quantized, marks in ((True, len(LN_ROWS)), (False, 0)):
        text = print_module(RecognizeComposites()(QuantizeOps()(from_onnx(
            _layer_norms(quantized)))))
        assert text.count("like_onnxruntime=True") == marks


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_layer_norm_between_quantized_tensors_equals_onnxruntime(kind: str) -> None:
    """A statically quantized model's LayerNormalization equals onnxruntime's bit for bit
    on a CPU where onnxruntime runs MLAS's AVX2 LayerNorm kernel (a float64 mean, FMA
    squares, its tail's order: kiln.kernels.rows.layer_norm_onnxruntime's
    `layer_norm_mlas_row`), the target being this CPU."""
    from kiln.kernels.rows.layer_norm_onnxruntime import mlas_layer_norm
    from kiln.target import Target
    from kiln.target.isa import isa_for

    if not mlas_layer_norm(isa_for(Target.from_host())):
        pytest.skip("onnxruntime runs MLAS's LayerNorm kernel on x86 with AVX2 and FMA")
    model = _layer_norms(True)
    config = Target.from_host().export()
    config["kind"] = kind
    rng = np.random.default_rng(8)
    feed = {f"x{n}": rng.integers(0, 256, (9, n)).astype(np.uint8) for n in LN_ROWS}
    feed[f"x{LN_ROWS[0]}"][0] = 7  # a constant row: variance 0
    want = ort_session(model).run(None, feed)
    got = kiln.compile(from_onnx(model), Target(config))["main"](*feed.values())
    for g_, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g_), w)
