"""The quantize-ops pass on hand-built QDQ graphs, and what the frontend refuses.

A QDQ convolution with per-channel weights, an int32 bias and a ReLU or Clip before
the QuantizeLinear becomes one `qlinear_conv` whose output range is the activation's;
its result equals onnxruntime's (which fuses the same pattern). Patterns that are not
the computation onnxruntime runs stay in float, unchanged.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.version_converter import convert_version
from test_dot_intrinsic import host_runs

import kiln
from kiln import evaluate
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.codegen import compile_module
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.kernels.registry import select
from kiln.ops import call as call_op
from kiln.ops import evaluate_call
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_saturates, ort_session


def g_tensor_type(a: np.ndarray) -> TensorType:
    return TensorType(a.shape, str(a.dtype))

R = np.random.default_rng(7)
X_SCALE, W_SCALES, Y_SCALE = np.float32(0.02), np.array([0.004, 0.01, 0.007], np.float32), \
    np.float32(0.03)


def _qdq_conv(activation: str, bias_scale: np.ndarray) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(w), DQ(b)) -> activation -> Q -> DQ -> y (opset 13)."""
    inits = {
        "xs": X_SCALE, "xz": np.array(120, np.uint8), "ws": W_SCALES,
        "wz": np.zeros(3, np.int8), "w": R.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8),
        "b": R.integers(-2000, 2000, (3,)).astype(np.int32), "bs": bias_scale,
        "bz": np.zeros(3, np.int32), "ys": Y_SCALE, "yz": np.array(90, np.uint8),
        "lo": np.array(0.0, np.float32), "hi": np.array(1.5, np.float32)}
    b = GraphBuilder()
    b.node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])
    b.node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"])
    b.node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0)
    b.node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0)
    b.node("Conv", ["xf", "wf", "bf"], ["c"], pads=[1, 1, 1, 1])
    if activation == "relu":
        b.node("Relu", ["c"], ["a"])
    elif activation == "clip":
        b.node("Clip", ["c", "lo", "hi"], ["a"])
    else:
        b.node("Identity", ["c"], ["a"])
    b.node("QuantizeLinear", ["a", "ys", "yz"], ["y"])
    b.input("x", [1, 2, 6, 6])
    b.output("y", [1, 3, 6, 6], TensorProto.UINT8)
    b.consts(inits)
    return b.model(opset=13)


def _ops(mod: object) -> Counter[str]:
    return Counter(b.value.op for b in mod["main"].bindings  # type: ignore[index]
                   if isinstance(b.value, g.Call))


@pytest.mark.parametrize("activation", ["none", "relu", "clip"])
def test_qdq_conv_fuses_into_qlinear_conv(activation: str) -> None:
    model = _qdq_conv(activation, X_SCALE * W_SCALES)
    x = R.uniform(-2.5, 2.5, (1, 2, 6, 6)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})[0]
    mod = QuantizeOps()(from_onnx(model))
    ops = _ops(mod)
    assert ops["qlinear_conv_packed"] == 1 and "conv2d" not in ops and "relu" not in ops
    fused = next(b.value for b in mod["main"].bindings
                 if isinstance(b.value, g.Call) and b.value.op == "qlinear_conv_packed")
    # the activation is the output range: relu -> [y_zp, 255]; clip(0, 1.5) -> [90, 140]
    expected_range = {"none": (0, 255), "relu": (90, 255), "clip": (90, 140)}[activation]
    assert (fused.attrs["qmin"], fused.attrs["qmax"]) == expected_range
    got = evaluate(mod, "main", x)
    if onnxruntime_saturates() and activation == "none":
        # this host's onnxruntime clamps its pair sums (quantized_models.like_onnxruntime)
        # where it runs the group as its QLinearConv (here: without the activation; with
        # Relu/Clip it keeps a float Conv, exact): the opt-in computes that, and the
        # default ONNX's exact integer result, which the QDQ graph's reference gives
        with Target(like_onnxruntime("llvm")):
            saturating = QuantizeOps()(from_onnx(model))
            np.testing.assert_array_equal(evaluate(saturating, "main", x), want)
        want = ReferenceEvaluator(convert_version(model, 21)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale", ["ys", "xs", "ws"])
def test_a_scale_below_zero_keeps_the_float_ops(scale: str) -> None:
    """Every fusion assumes quantization increases with its input (a ReLU as the output
    range, the requantizing multiplier); a scale below 0 reverses it, so the graph keeps
    its float ops and computes what the spec says, as onnxruntime does."""
    model = _qdq_conv("relu", X_SCALE * W_SCALES)
    for init in model.graph.initializer:
        if init.name == scale:
            init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), scale))
    x = R.uniform(-2.5, 2.5, (1, 2, 6, 6)).astype(np.float32)
    mod = QuantizeOps()(from_onnx(model))
    assert "qlinear_conv_packed" not in _ops(mod) and _ops(mod)["relu"] == 1
    want = ReferenceEvaluator(convert_version(model, 21)).run(None, {"x": x})[0].astype(int)
    # a float convolution's sums round their own way: a value at a rounding boundary of
    # the QuantizeLinear may land one quantum apart (a ReLU taken the wrong way round
    # is dozens)
    for got in (evaluate(mod, "main", x), kiln.compile(from_onnx(model), "llvm")["main"](x)):
        assert np.abs(np.asarray(got).astype(int) - want).max() <= 1


@pytest.mark.parametrize("weight_zero_point", [0, 3])
@pytest.mark.parametrize("op", ["qlinear_conv", "qlinear_matmul"])
def test_packed_kernels_compute_the_unpacked_ops(op: str, weight_zero_point: int) -> None:
    # weights shifted by their zero point (int16 when it is not 0), x_zp folded into the
    # bias: the packed call computes what the original does, bit for bit
    x_zp = g.Constant(np.array(117, np.uint8))
    multiplier = g.Constant(np.array([0.003, 0.001, 0.002, 0.004], np.float32))
    bias = g.Constant(R.integers(-900, 900, (4,)).astype(np.int32))
    w_zp = g.Constant(np.full(4, weight_zero_point, np.int8))
    y_zp = g.Constant(np.array(-5, np.int8))
    if op == "qlinear_conv":
        x = R.integers(0, 256, (1, 6, 5, 5)).astype(np.uint8)
        w = g.Constant(np.concatenate([[-128], R.integers(-128, 128, 107)]).astype(np.int8)
                       .reshape(4, 3, 3, 3))
        attrs = {"group": 2, "pads": (1, 2, 0, 1), "strides": (1, 2), "dilations": (1, 1)}
    else:
        x = R.integers(0, 256, (2, 3, 7)).astype(np.uint8)
        w = g.Constant(np.concatenate([[-128], R.integers(-128, 128, 27)]).astype(np.int8)
                       .reshape(4, 7))
        attrs = {"transpose_b": True}
    xv = g.Var("x", g_tensor_type(x))
    call = call_op(op, xv, w, bias, x_zp, w_zp, multiplier, y_zp, qmin=-100, **attrs)
    family = select(call, isa_for(None))  # the int8 kernel family of the call
    packed = family.pack(call, isa_for(None)) if family is not None else None
    # a grouped convolution takes the vector-tile kernel (kiln/kernels/int8/grouped.py)
    want_op = "qlinear_conv_grouped" if op == "qlinear_conv" else f"{op}_packed"
    assert packed is not None and packed.op == want_op
    shifted = w.data.astype(np.int64) - weight_zero_point
    assert packed.args[1].data.dtype == (np.int8 if shifted.min() >= -128 else np.int16)
    want = evaluate_call(op, [x, *(a.data for a in call.args[1:])], call.attrs)
    got = evaluate_call(packed.op, [x, *(a.data for a in packed.args[1:])], packed.attrs)
    np.testing.assert_array_equal(got, want)


def test_bias_with_another_scale_stays_float() -> None:
    # a bias quantized with a scale other than x_scale * w_scale is not what the fused
    # integer op computes: the pattern stays dequantize -> conv -> quantize
    # (summed in float as onnxruntime's MLAS sums a convolution it keeps in float)
    model = _qdq_conv("relu", X_SCALE * W_SCALES * 2)
    ops = _ops(QuantizeOps()(from_onnx(model)))
    assert not ops.keys() & {"qlinear_conv", "qlinear_conv_packed"}
    assert ops["conv2d_mlas"] == 1


@pytest.mark.parametrize(("zp", "out_scale"), [(np.uint8(120), 0.05), (np.int8(-3), 0.05),
                                              (np.uint8(120), 0.1)])
def test_qdq_max_pool_runs_on_integers(zp: np.generic, out_scale: float) -> None:
    # quantize(max_pool(dequantize(x))) with one scale and zero point is max_pool(x):
    # padded windows included; another output scale keeps the float pool
    b = GraphBuilder()
    b.consts({"s": np.float32(0.05), "z": zp, "ys": np.float32(out_scale)})
    b.node("QuantizeLinear", ["x", "s", "z"], ["xq"])
    b.node("DequantizeLinear", ["xq", "s", "z"], ["xf"])
    b.node("MaxPool", ["xf"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.node("QuantizeLinear", ["p", "ys", "z"], ["y"])
    b.input("x", [1, 2, 7, 7])
    b.output("y", [1, 2, 4, 4], TensorProto.UINT8 if zp.dtype == np.uint8 else TensorProto.INT8)
    model = b.model(opset=13)
    x = R.uniform(-8, 8, (1, 2, 7, 7)).astype(np.float32)
    mod = QuantizeOps()(from_onnx(model))
    ops = _ops(mod)
    assert ops["dequantize_linear"] == (0 if out_scale == 0.05 else 1)
    np.testing.assert_array_equal(evaluate(mod, "main", x),
                                  ort_session(model).run(None, {"x": x})[0])


# target -> the byte vector the integer max pool's rows must compile to (its lanes come
# from the ISA: 32 bytes with AVX2, 64 with AVX-512; C: the vector extension's type)
BYTE_POOL_VECTORS = {"llvm -mcpu=haswell": "<32 x i8>", "c -mcpu=haswell": "kiln_{t}8x32 load",
                     "llvm -mcpu=skylake-avx512": "<64 x i8>"}


@pytest.mark.parametrize("target", sorted(BYTE_POOL_VECTORS))
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_integer_max_pool_rows_are_byte_vectors(target: str, dtype: type) -> None:
    """A uint8 / int8 MaxPool's row loops (loads, max, stores of bytes) are vector loops
    of the ISA's byte lanes (kiln.ir.analysis.vector_loops), and equal onnxruntime's."""
    elem = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    b = GraphBuilder()
    b.node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.input("x", [1, 2, 5, 72], elem)
    b.output("y", [1, 2, 3, 36], elem)
    model = b.model(opset=13)
    info = np.iinfo(dtype)
    x = R.integers(info.min, info.max + 1, (1, 2, 5, 72)).astype(dtype)
    ex = kiln.compile(from_onnx(model), target)
    if target.startswith("c"):
        text = next(a.content.decode() for a in ex.artifacts if a.file_name == "kernels.c")
    else:
        text = str(compile_module(ex.ir, Target(target), prefix="kiln_",
                                  pool=ConstantPool.from_module(ex.ir)).module)
    assert BYTE_POOL_VECTORS[target].format(t="u" if dtype == np.uint8 else "i") in text
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}: compiled only")
    np.testing.assert_array_equal(ex["main"](x), ort_session(model).run(None, {"x": x})[0])


def _single_node(node: onnx.NodeProto, inits: list[onnx.TensorProto],
                 x_type: int = TensorProto.FLOAT, opset: int = 21) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(node)
    b.consts(inits)
    b.input("x", [2, 3], x_type)
    b.output("y", None, TensorProto.UNDEFINED)
    # Unchecked: the output's type is left to the importer, and some nodes are refused.
    return b.model(opset=opset, ir_version=10, check=False)


SCALE = numpy_helper.from_array(np.array(0.1, np.float32), "s")


def _qlinear_matmul(scales: dict[str, float]) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(scales.get(n, 0.05), np.float32), n)
             for n in ("as", "bs", "ys")]
    inits += [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in (
        ("az", 0, np.uint8), ("bz", 0, np.int8), ("yz", 0, np.uint8))]
    inits.append(numpy_helper.from_array(np.ones((3, 4), np.int8), "b"))
    return _single_node(helper.make_node(
        "QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="qmm"),
        inits, TensorProto.UINT8, 13)


@pytest.mark.parametrize("value", [0.0, np.inf, np.nan])
@pytest.mark.parametrize("where", ["QuantizeLinear", "as", "bs", "ys"])
def test_a_scale_of_zero_inf_or_nan_is_a_frontend_error(where: str, value: float) -> None:
    """Quantizing divides by the scale and a requantizing product multiplies by
    `a_scale * b_scale / y_scale`: at 0, inf or NaN the spec's arithmetic divides by zero
    or rounds NaN, which runtimes do each their own way. (onnxruntime runs such files.)"""
    if where == "QuantizeLinear":
        model = _single_node(helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="q"),
                             [numpy_helper.from_array(np.array(value, np.float32), "s")])
        node = r"node 'q' \(QuantizeLinear\)"
    else:
        model, node = _qlinear_matmul({where: value}), r"node 'qmm' \(QLinearMatMul\)"
    shown = {0.0: "0.0", np.inf: "inf"}.get(value, "nan")
    with pytest.raises(FrontendError, match=rf"{node}: .*scale {shown}: a quantization scale "
                                            "must be a finite number other than 0"):
        from_onnx(model)


@pytest.mark.parametrize(("model", "message"), [
    (_single_node(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q4"),
                  [SCALE, helper.make_tensor("z", TensorProto.INT4, [], [0])]),
     r"node 'q4' \(QuantizeLinear\): .*int4"),
    (_single_node(helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="qf8",
                                   output_dtype=TensorProto.FLOAT8E4M3FN), [SCALE]),
     r"node 'qf8' \(QuantizeLinear\): output_dtype float8e4m3fn is not supported"),
    (_single_node(helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq8"),
                  [SCALE, helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [2], [1.0, 2.0])]),
     r"node 'dq8' \(DequantizeLinear\): .*float8"),
    (_single_node(helper.make_node("MatMulInteger", ["x", "b", "az"], ["y"], name="mmi"),
                  [numpy_helper.from_array(np.ones((3, 4), np.uint8), "b"),
                   numpy_helper.from_array(np.array([1, 2], np.uint8), "az")],
                  TensorProto.UINT8, 13),
     r"node 'mmi' \(MatMulInteger\): .*per-row zero points of A are not supported"),
])
def test_unsupported_quantization_is_a_frontend_error(model: onnx.ModelProto,
                                                       message: str) -> None:
    with pytest.raises(FrontendError, match=message):
        from_onnx(model)
