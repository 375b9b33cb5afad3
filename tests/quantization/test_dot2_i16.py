"""The int16-pair dot form (x86 without VNNI: AVX2, AVX-512BW; docs/quantization.md,
"Without VNNI: int16 pairs"): the `dot2_i16` intrinsic (two signed int16 products added
to an int32) on the reference interpreter, c and llvm, exact against numpy and one
`vpmaddwd` on x86; and the int8 products packed as int16 pairs equal the portable
(element tiles) and VNNI builds on extreme values: 255 / -128 / 127, u8 and s8
activations, per-channel weight zero points, an odd K."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from quantized_models import qlinear_conv_model
from test_dot_intrinsic import assembly, host_runs

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRModule, assert_structural_equal, evaluate
from kiln.ir.tensor import DOT2_I16, Buffer, Const, For, Intrin, PrimFunc, Store, Var
from kiln.ops import quant_words
from kiln.script import from_source, print_module
from support.graphs import GraphBuilder

N = 37  # not a multiple of any instruction's lanes


def _module() -> IRModule:
    acc, a, b, out = (Buffer(n, (N,), "int32") for n in ("acc", "a", "b", "out"))
    i = Var("i", "int64")
    body = For(i, Const(0, "int64"), Const(N, "int64"), "vectorized",
               Store(out, Intrin(DOT2_I16, (acc[i], a[i], b[i])), (i,)))
    return IRModule({"dot": PrimFunc((acc, a, b, out), body)})


def _operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    acc, a, b = (rng.integers(-2 ** 31, 2 ** 31, N, dtype=np.int64).astype(np.int32)
                 for _ in range(3))
    halves = np.array([[255, -128], [255, 127], [-128, -128], [-32768, -32768]], np.int16)
    weights = np.array([[-128, -128], [127, 127], [-128, 127], [-32768, -32768]], np.int16)
    a[:4], b[:4] = halves.view(np.int32)[:, 0], weights.view(np.int32)[:, 0]
    acc[3] = 0  # -32768 * -32768 twice: 2^31, the one sum vpmaddwd wraps
    acc[4], a[4], b[4] = 2 ** 31 - 1, 0x7FFF7FFF, 0x7FFF7FFF  # the accumulator wraps
    return acc, a, b


def _expected(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    products = (a.view(np.int16).reshape(-1, 2).astype(np.int64)
                * b.view(np.int16).reshape(-1, 2).astype(np.int64)).sum(axis=1)
    return ((acc.astype(np.int64) + products) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def test_interpreter_and_script() -> None:
    out = np.zeros(N, np.int32)
    evaluate(_module(), "dot", *_operands(), out)
    np.testing.assert_array_equal(out, _expected(*_operands()))
    text = print_module(_module())
    assert "T.dot2_i16(" in text
    assert_structural_equal(from_source(text), _module())


@pytest.mark.parametrize("target", ["c", "llvm", "llvm -mcpu=haswell", "llvm -mcpu=skylake-avx512",
                                    "llvm -mtriple=aarch64-linux-gnu -mattr=+dotprod"])
def test_backends(target: str) -> None:
    if target.startswith("llvm -"):
        asm = assembly(target, _module())
        if "aarch64" not in target:  # one vpmaddwd per vector, no widening shifts
            assert re.search(r"\bvpmaddwd\b", asm) and not re.search(r"\bvps(ll|ra)w\b", asm)
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}: compiled only")
    out = np.zeros(N, np.int32)
    kiln.compile(_module(), target)["dot"](*_operands(), out)
    np.testing.assert_array_equal(out, _expected(*_operands()))


def test_pair_words() -> None:
    b = np.random.default_rng(5).integers(-128, 128, (7, 5)).astype(np.int8)
    words = quant_words.words(b, quant_words.PAIR_GROUP)
    rows = np.concatenate([b, np.zeros((1, 5), np.int8)]).astype(np.int64)
    np.testing.assert_array_equal(words, (rows[0::2] & 0xFFFF) + (rows[1::2] << 16))
    np.testing.assert_array_equal(quant_words.unwords(words, 7, quant_words.PAIR_GROUP), b)


# generic x86-64 (element tiles) is the reference; int16 pairs on AVX2 (llvm and c) and
# AVX-512BW; VNNI (vpdpbusd words)
REFERENCE = "llvm"
TARGETS = ["llvm -mcpu=haswell", "c -mcpu=haswell", "llvm -mcpu=skylake-avx512",
           "llvm -mcpu=znver4"]


def _extreme_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """QLinearConvs (u8 x: C = 3, an odd K = 27, stride 2; s8 x: C = 8, 7 x 7) with int8
    weights of -128 / 127 next to each other and per-channel zero points of 0, 1 and -1,
    against inputs of 255 (s8: 127); and a MatMulInteger of s8 A with uint8 B and
    per-column zero points (int32 outputs: exact)."""
    rng = np.random.default_rng(31)
    gb = GraphBuilder()
    feeds: dict[str, np.ndarray] = {}
    for tag, shape, oc, stride, signed in (("u", (1, 3, 9, 9), 10, 2, False),
                                           ("s", (1, 8, 7, 7), 20, 1, True)):
        conv = qlinear_conv_model(shape, oc, 3, stride, 1, signed, rng)
        inits = {t.name: numpy_helper.to_array(t).copy() for t in conv.graph.initializer}
        w, wz = inits["w"].astype(np.int64), np.resize([0, 1, -1], oc)
        w[0] = np.where(np.arange(w[0].size).reshape(w[0].shape) % 2, 127, -128)
        w[1] = np.where(np.arange(w[1].size).reshape(w[1].shape) // 2 % 2, 127, -128)
        w = np.clip(w, wz.reshape(-1, 1, 1, 1) - 128, wz.reshape(-1, 1, 1, 1) + 127)
        inits["w"], inits["wz"] = np.clip(w, -128, 127).astype(np.int8), wz.astype(np.int8)
        x = rng.integers(-128 if signed else 0, 128 if signed else 256, shape)
        x[:, :, :3] = 127 if signed else 255
        feeds[f"x{tag}"] = x.astype(np.int8 if signed else np.uint8)
        node = conv.graph.node[0]
        gb.node("QLinearConv", [f"{i}{tag}" if i != "x" else f"x{tag}" for i in node.input],
                [f"y{tag}"], pads=[1] * 4, strides=[stride] * 2)
        gb.consts({f"{k}{tag}": v for k, v in inits.items()})
        gb.input(f"x{tag}", list(shape), TensorProto.INT8 if signed else TensorProto.UINT8)
        out = conv.graph.output[0].type.tensor_type.shape.dim
        gb.output(f"y{tag}", [d.dim_value for d in out],
                  TensorProto.INT8 if signed else TensorProto.UINT8)
    m, k, n = 3, 27, 20
    a = rng.integers(-128, 128, (m, k))
    a[0], a[1] = 127, -128
    bz = np.resize([127, 128, 129], n).astype(np.uint8)
    b = np.clip(np.where(np.arange(k * n).reshape(k, n) % 2, 255, 0), bz - 128, bz + 127)
    feeds["a"] = a.astype(np.int8)
    gb.consts({"b": b.astype(np.uint8), "az": np.int8(-3), "bz": bz})
    gb.node("MatMulInteger", ["a", "b", "az", "bz"], ["ym"])
    gb.input("a", [m, k], TensorProto.INT8)
    gb.output("ym", [m, n], TensorProto.INT32)
    return gb.model(opset=13), feeds


@pytest.fixture(scope="module")
def extreme() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    model, feeds = _extreme_model()
    ex = kiln.compile(from_onnx(model), REFERENCE)
    assert "dot2_i16" not in print_module(ex.ir) and "dot4_u8s8" not in print_module(ex.ir)
    return model, feeds, [np.asarray(y) for y in ex["main"](*feeds.values())]


@pytest.mark.parametrize("target", TARGETS)
def test_int16_pairs_equal_the_portable_and_vnni_products(
        target: str, extreme: tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]
) -> None:
    model, feeds, want = extreme
    ex = kiln.compile(from_onnx(model), target)
    text = print_module(ex.ir)
    # the three products took the dot form: int16 pairs without VNNI, byte words with it
    assert len(re.findall(r"def qlinear_conv_dot", text)) == 2
    assert "def matmul_integer_packed" in text
    used, other = ("T.dot4_u8s8(", "T.dot2_i16(") if "znver4" in target else (
        "T.dot2_i16(", "T.dot4_u8s8(")
    assert used in text and other not in text
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}: compiled only")
    for y, y_want, name in zip(ex["main"](*feeds.values()), want, ("yu", "ys", "ym"),
                               strict=True):
        np.testing.assert_array_equal(np.asarray(y), y_want, err_msg=name)
