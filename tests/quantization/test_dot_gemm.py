"""The dot-product form of the int8 matrix products and convolutions (kiln/kernels/int8/dot.py,
conv_dot.py): weights
packed in words of 4 k at compile time for targets with a dot-product family, A packed
at run time, one `dot4_u8s8` per accumulator. Exact against onnxruntime (QLinearMatMul)
and numpy (MatMulInteger) on vpdpbusd (znver4) and the exact vpmaddwd path (haswell),
u8 and s8 activations, sizes that leave partial row, column and k tiles."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from quantized_models import qlinear_conv_model

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.kernels.int8 import dot
from kiln.kernels.registry import select
from kiln.ops import call as call_op
from kiln.ops import evaluate_call, quant_words
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

ort = pytest.importorskip("onnxruntime")

TARGETS = ["llvm -mcpu=znver4", "llvm -mcpu=haswell"]
SHAPES = [(5, 13, 70), (1, 100, 130), (9, 64, 33)]


def host_runs(target: str) -> bool:
    return isa_for(Target(target)).features <= isa_for(Target.from_host()).features


def _model(node: onnx.NodeProto, a_type: int, m: int, k: int, y_type: int, n: int,
           consts: dict[str, np.ndarray]) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(node)
    b.input("a", [m, k], a_type)
    b.output("y", [m, n], y_type)
    b.consts(consts)
    return b.model(opset=13)


def qlinear_matmul(m: int, k: int, n: int, signed: bool,
                   rng: np.random.Generator) -> onnx.ModelProto:
    q = np.int8 if signed else np.uint8
    ty = TensorProto.INT8 if signed else TensorProto.UINT8
    consts = {"as": np.float32(0.02), "az": q(-3 if signed else 131),
              "b": rng.integers(-128, 128, (k, n)).astype(np.int8),
              "bs": np.float32(0.01), "bz": np.int8(0),
              "ys": np.float32(0.0002 * np.sqrt(k) * 40), "yz": q(5 if signed else 128)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    return _model(node, ty, m, k, ty, n, consts)


def activations(m: int, k: int, signed: bool, rng: np.random.Generator) -> np.ndarray:
    lo, hi, q = (-128, 128, np.int8) if signed else (0, 256, np.uint8)
    a = rng.integers(lo, hi, (m, k)).astype(q)
    a[0, :] = hi - 1  # the largest bytes: a plain vpmaddubsw would saturate on them
    return a


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("signed", [False, True])
def test_qlinear_matmul_equals_onnxruntime(target: str, signed: bool) -> None:
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(3)
    for m, k, n in SHAPES:
        model = qlinear_matmul(m, k, n, signed, rng)
        tgt = Target(target)
        with tgt:
            mod = kiln.transform.get_pipeline("default", "graph", target=tgt)(from_onnx(model))
        # the dot form was chosen (int16 pairs where the x86 target has no VNNI)
        assert re.search(r"T\.dot(4_u8s8|2_i16)\(", kiln.script.print_module(mod))
        a = activations(m, k, signed, rng)
        got = kiln.compile(from_onnx(model), like_onnxruntime(target))["main"](a)
        np.testing.assert_array_equal(got, onnxruntime_outputs(model, {"a": a})[0])


@pytest.mark.parametrize("signed", [False, True])
def test_matmul_integer_equals_numpy(signed: bool) -> None:
    target = TARGETS[0] if host_runs(TARGETS[0]) else TARGETS[1]
    if not host_runs(target):
        pytest.skip("this host has no x86 dot-product family")
    rng = np.random.default_rng(4)
    m, k, n = 6, 37, 45
    q = np.int8 if signed else np.uint8
    b = rng.integers(0, 256, (k, n)).astype(np.uint8)
    a_zp = q(-7 if signed else 100)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = _model(node, TensorProto.INT8 if signed else TensorProto.UINT8, m, k,
                   TensorProto.INT32, n, {"b": b, "az": a_zp, "bz": np.uint8(128)})
    a = activations(m, k, signed, rng)
    got = kiln.compile(from_onnx(model), like_onnxruntime(target))["main"](a)
    want = (a.astype(np.int64) - int(a_zp)) @ (b.astype(np.int64) - 128)
    np.testing.assert_array_equal(got, want.astype(np.int32))


def test_words_round_trip_and_generic_targets_keep_the_element_layout() -> None:
    b = np.random.default_rng(5).integers(-128, 128, (7, 5)).astype(np.int8)
    np.testing.assert_array_equal(quant_words.unwords(quant_words.words(b), 7), b)
    # the documented value: byte i of word g is row 4g + i, the top byte signed, rows
    # past K zero; the same from any integer dtype holding the values
    rows = np.concatenate([b, np.zeros((1, 5), np.int8)]).astype(np.int64)
    unsigned = rows & 0xFF
    value = (unsigned[0::4] + (unsigned[1::4] << 8) + (unsigned[2::4] << 16)
             + (rows[3::4] << 24))
    for dtype in (np.int8, np.int16, np.int64):
        words = quant_words.words(b.astype(dtype))
        assert words.dtype == np.int32
        np.testing.assert_array_equal(words, value)
    with Target("llvm -mcpu=x86-64"):
        assert dot.target_isa(isa_for(None)) is None  # SSE2: the int32 multiply-add tiles
    with Target("llvm -mtriple=aarch64-linux-gnu -mattr=+dotprod"):
        isa = dot.target_isa(isa_for(None))
        assert isa is not None and dot.tile_cols(isa) == 16


def qlinear_conv(shape: tuple[int, int, int, int], oc: int, k: int, stride: int,
                 pad: int | tuple[int, int, int, int], signed: bool, rng: np.random.Generator,
                 dilation: int = 1) -> onnx.ModelProto:
    return qlinear_conv_model(shape, oc, k, stride, pad, signed, rng, dilation=dilation)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("shape", "oc", "k", "stride", "pad", "signed", "dilation"), [
    ((1, 5, 7, 6), 9, 3, 1, 1, False, 1),    # K = 45: a partial word; pads read x_zp
    ((2, 8, 9, 9), 20, 1, 2, 0, True, 1),    # 1x1, strided, batch 2, s8 shifted to u8
    ((1, 3, 9, 8), 6, 3, 2, (2, 0, 1, 3), False, 2),  # uneven pads, dilated, strided
    ((1, 4, 9, 9), 6, 3, 2, 0, True, 1),     # 3x3/2 unpadded: phase planes one by one
])
def test_qlinear_conv_equals_onnxruntime(target: str, shape: tuple[int, int, int, int],
                                         oc: int, k: int, stride: int,
                                         pad: int | tuple[int, int, int, int], signed: bool,
                                         dilation: int) -> None:
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(6)
    model = qlinear_conv(shape, oc, k, stride, pad, signed, rng, dilation)
    lo, hi, q = (-128, 128, np.int8) if signed else (0, 256, np.uint8)
    x = rng.integers(lo, hi, shape).astype(q)
    ex = kiln.compile(from_onnx(model), like_onnxruntime(target))
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])



@pytest.mark.parametrize("signed", [False, True])
def test_packed_conv_reference_computes_the_unpacked_op(signed: bool) -> None:
    # the words, the shift of an s8 input and the padding with x_zp, bit for bit
    rng = np.random.default_rng(8)
    q = np.int8 if signed else np.uint8
    x = rng.integers(-128 if signed else 0, 128 if signed else 256, (1, 6, 5, 5)).astype(q)
    args = [g.Constant(np.concatenate([[-128], rng.integers(-128, 128, 4 * 6 * 9 - 1)])
                       .astype(np.int8).reshape(4, 6, 3, 3)),
            g.Constant(rng.integers(-900, 900, (4,)).astype(np.int32)),
            g.Constant(np.array(-7 if signed else 117, q)),
            g.Constant(np.zeros(4, np.int8)),
            g.Constant(np.array([0.003, 0.001, 0.002, 0.004], np.float32)),
            g.Constant(np.array(-5, np.int8))]
    attrs = {"pads": (1, 2, 0, 1), "strides": (1, 2)}
    call = call_op("qlinear_conv", g.Var("x", TensorType(x.shape, str(x.dtype))), *args, **attrs)
    with Target("llvm -mcpu=znver4"):
        family = select(call, isa_for(None))
        packed = family.pack(call, isa_for(None)) if family is not None else None
    assert packed is not None and packed.op == "qlinear_conv_dot"
    want = evaluate_call("qlinear_conv", [x, *(a.data for a in args)], call.attrs)
    got = evaluate_call(packed.op, [x, *(a.data for a in packed.args[1:])], packed.attrs)
    np.testing.assert_array_equal(got, want)
