"""`int8-pairs=saturate`: onnxruntime's AVX2 u8 x s8 products, and ONNX's exact ones by
default (docs/quantization.md, "Without VNNI").

MLAS's u8 x s8 kernels on x86 hosts without VNNI add each pair of products (k = 2p and
2p + 1) into a saturating int16 (`vpmaddubsw`): 255 x -128 twice is -65280, stored as
-32768. kiln computes ONNX's exact sums unless the target says `int8-pairs=saturate`;
then every backend computes the saturated pairs (x86: `vpmaddubsw`; elsewhere the
`dot4_u8s8_sat16` intrinsic's portable form), so a library's result does not depend on
the host. Convolutions pair k in onnxruntime's order, (tap, channel)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper
from quantized_models import qlinear_conv_model
from test_dot_intrinsic import assembly, host_runs, operands

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRModule, assert_structural_equal, evaluate
from kiln.ir.tensor import Buffer, Const, For, Intrin, PrimFunc, Store, Var
from kiln.kernels.int8 import dot
from kiln.ops import quant_words
from kiln.script import from_source, print_module
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs, onnxruntime_saturates

# the portable form (generic x86-64, c), vpmaddubsw on ymm and on zmm
TARGETS = ["llvm", "c", "llvm -mcpu=haswell", "c -mcpu=haswell", "llvm -mcpu=znver4"]
K, N = 8, 16


def _b() -> np.ndarray:
    b = np.full((K, N), -128, np.int8)
    b[:, 1] = 127           # 255 x 127 twice: +64770 saturates to 32767
    b[1::2, 2] = 127        # -128, 127 in every pair: fits
    b[::4, 3] = 0           # (0, -128) fits, (-128, -128) saturates
    b[:, 4] = np.resize([-128, -128, 127, 127], K)
    return b


def _matmul_model() -> object:
    gb = GraphBuilder()
    gb.add(helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"]))
    gb.input("a", [2, K], TensorProto.UINT8)
    gb.output("y", [2, N], TensorProto.UINT8)
    gb.consts({"as": np.float32(1.0), "az": np.uint8(0), "b": _b(), "bs": np.float32(1.0),
               "bz": np.int8(0), "ys": np.float32(2048.0), "yz": np.uint8(128)})
    return gb.model(opset=13)


def _quantized(acc: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(acc / 2048.0) + 128, 0, 255).astype(np.uint8)


def _a() -> np.ndarray:
    a = np.full((2, K), 255, np.uint8)
    a[1] = np.arange(K) * 30
    return a


def test_reference_pairs() -> None:
    a, b = _a().astype(np.int64), _b().astype(np.int64)
    sat = quant_words.saturated_matmul(a, b)
    assert sat[0, 0] == 4 * -32768 != (a @ b)[0, 0] == -261120
    assert sat[0, 3] == 2 * (-32640 - 32768)
    assert sat[0, 1] == 4 * 32767
    np.testing.assert_array_equal(sat[:, 2], (a @ b)[:, 2])


@pytest.mark.parametrize("target", TARGETS)
def test_saturation_is_an_opt_in(target: str) -> None:
    a = _a()
    model = _matmul_model()
    exact = _quantized(a.astype(np.int64) @ _b().astype(np.int64))
    saturated = _quantized(quant_words.saturated_matmul(a, _b()))
    assert (exact != saturated).any()
    if not host_runs(target):
        # compile-only: the zmm form is vpmaddubsw + vpmaddwd by ones
        ex = kiln.compile(from_onnx(model), f"{target} -int8-pairs=saturate")
        assert ex is not None
        pytest.skip(f"this host cannot run {target}")
    for pairs, want in (("", exact), (" -int8-pairs=exact", exact),
                        (" -int8-pairs=saturate", saturated)):
        got = kiln.compile(from_onnx(model), target + pairs)["main"](a)
        np.testing.assert_array_equal(got, want, err_msg=target + pairs)
    # this host's onnxruntime is one of the two
    ort = onnxruntime_outputs(model, {"a": a})[0]
    np.testing.assert_array_equal(ort, saturated if onnxruntime_saturates() else exact)


CONVOLUTIONS = [
    ((1, 3, 11, 10), 16, 3, 2, 1),   # C = 3: words straddle taps (the im2col path)
    ((1, 8, 7, 7), 16, 3, 1, 1),     # 4 channels of one tap a word (MLAS's ConvSym)
    ((1, 12, 6, 6), 8, 1, 1, 0),     # 1x1
]
# llvm only (each case compiles twice): 4 channels of a tap a word (the dot-form
# convolution's words of the input), strided on the positions tile (an im2col copying them), strided
# on the channels tile and stride 1 on the positions tile (read in place)
WORD_CONVOLUTIONS = [((1, 8, 9, 9), 4, 3, 2, 1), ((1, 8, 9, 9), 16, 3, 2, 1),
                     ((1, 8, 26, 26), 8, 3, 1, 1)]


@pytest.mark.parametrize(("target", "shape", "oc", "k", "stride", "pad"), [
    *((t, *case) for t in ["llvm -mcpu=haswell", "c"] for case in CONVOLUTIONS),
    *(("llvm -mcpu=haswell", *case) for case in WORD_CONVOLUTIONS)])
def test_saturating_convolution_pairs_like_onnxruntime(
        target: str, shape: tuple[int, int, int, int], oc: int, k: int, stride: int,
        pad: int) -> None:
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(3)
    model = qlinear_conv_model(shape, oc, k, stride, pad, False, rng)
    x = rng.integers(0, 256, shape).astype(np.uint8)
    x[..., ::2] = 255
    mod = from_onnx(model)
    exact = kiln.compile(mod, target)["main"](x)
    saturated = kiln.compile(mod, f"{target} -int8-pairs=saturate")["main"](x)
    assert (exact != saturated).any()
    ort = onnxruntime_outputs(model, {"x": x})[0]
    np.testing.assert_array_equal(ort, saturated if onnxruntime_saturates() else exact)


def _sat_module() -> IRModule:
    n = len(operands()[0])
    acc, a, b, out = (Buffer(name, (n,), "int32") for name in ("acc", "a", "b", "out"))
    i = Var("i", "int64")
    body = For(i, Const(0, "int64"), Const(n, "int64"), "vectorized",
               Store(out, Intrin("dot4_u8s8_sat16", (acc[i], a[i], b[i])), (i,)))
    return IRModule({"dot": PrimFunc((acc, a, b, out), body)})


def _sat_expected(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = (a.view(np.uint8).reshape(-1, 4).astype(np.int64)
         * b.view(np.int8).reshape(-1, 4).astype(np.int64))
    pairs = np.clip(p[:, 0::2] + p[:, 1::2], -32768, 32767).sum(axis=1)
    return ((acc.astype(np.int64) + pairs) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("target", ["interpreter", *TARGETS])
def test_the_intrinsic(target: str) -> None:
    acc, a, b = operands()
    want = _sat_expected(acc, a, b)
    assert want[0] != acc[0] - 4 * 255 * 128  # the first operands saturate
    if target == "interpreter":
        out = np.zeros_like(acc)
        evaluate(_sat_module(), "dot", acc, a, b, out)
        np.testing.assert_array_equal(out, want)
        return
    if "znver4" in target or "haswell" in target:
        asm = assembly(target, _sat_module())
        assert "vpmaddubsw" in asm and "vpmaddwd" in asm
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    out = np.zeros_like(acc)
    kiln.compile(_sat_module(), target)["dot"](acc, a, b, out)
    np.testing.assert_array_equal(out, want)


def _symbolic_batch(model: Any) -> Any:
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    return model


SATURATE = "llvm -mcpu=haswell -int8-pairs=saturate"


def test_the_matmul_tensor_expression_saturates_too() -> None:
    # a symbolic batch: the packed op's te definition instead of the static tiles
    if not host_runs(SATURATE):
        pytest.skip(f"this host cannot run {SATURATE}")
    a = _a()
    model = _symbolic_batch(_matmul_model())
    got = kiln.compile(from_onnx(model), SATURATE)["main"](a)
    np.testing.assert_array_equal(got, _quantized(quant_words.saturated_matmul(a, _b())))


@pytest.mark.parametrize(("shape", "oc", "group"), [
    ((2, 8, 7, 7), 16, 1), ((2, 6, 9, 8), 12, 3), ((1, 3, 9, 9), 8, 1)])
def test_tensor_expression_definitions_saturate_too(shape: tuple[int, int, int, int], oc: int,
                                                    group: int) -> None:
    # a symbolic batch: the packed conv's te definition instead of the static tiles
    target = SATURATE
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(1)
    static = qlinear_conv_model(shape, oc, 3, 1, 1, False, rng, group=group)
    x = rng.integers(0, 256, shape).astype(np.uint8)
    x[..., ::2] = 255
    tiles = kiln.compile(from_onnx(static), target)["main"](x)
    got = kiln.compile(from_onnx(_symbolic_batch(static)), target)["main"](x)
    exact = kiln.compile(from_onnx(static), "llvm -mcpu=haswell")["main"](x)
    assert (np.asarray(tiles) != np.asarray(exact)).any()
    np.testing.assert_array_equal(got, tiles)
    if onnxruntime_saturates():
        np.testing.assert_array_equal(got, onnxruntime_outputs(static, {"x": x})[0])


def test_the_saturating_build_round_trips_through_kiln_script() -> None:
    ex = kiln.compile(from_onnx(_matmul_model()), "llvm -mcpu=haswell -int8-pairs=saturate")
    text = print_module(ex.ir)
    assert "T.dot4_u8s8_sat16(" in text
    assert_structural_equal(from_source(text), ex.ir)


# (target, input [C, H, W], output channels): 14 x 14 = 196 positions and K = 1152 with
# saturating pairs on AVX2; 2 x 2 = 4 positions on VNNI (every x86 family's rule takes
# 4 rows there), u8 and s8, llvm and c
FOUR_ROW_TILES = [("llvm -mcpu=haswell -int8-pairs=saturate", (128, 14, 14), 64, False),
                  ("c -mcpu=haswell -int8-pairs=saturate", (128, 14, 14), 64, False),
                  ("llvm -mcpu=znver4", (64, 2, 2), 32, True),
                  ("c -mcpu=znver4", (64, 2, 2), 32, True),
                  ("llvm -mcpu=znver4", (64, 2, 2), 32, False)]


@pytest.mark.parametrize(("target", "chw", "oc", "signed"), FOUR_ROW_TILES)
def test_channel_tiles_of_four_rows_store_words(target: str, chw: tuple[int, int, int],
                                                oc: int, signed: bool) -> None:
    """A channels tile of 4 rows over whole words of each channel's output bytes
    (`word_stores`) packs them along the lanes and stores one word per channel. Weights
    of at most 63 in magnitude keep every pair sum inside int16, so saturating and exact
    products agree and onnxruntime's result is the reference on any host; u8 and s8
    outputs (the word's top byte), llvm and c."""
    from kiln.kernels.int8.conv_tile import choose_tile

    c, h, w = chw
    with kiln.Target(target):
        isa = dot.target_isa(isa_for(None), dot.target_saturates(isa_for(None)))
    assert isa is not None
    tile = choose_tile(isa, h * w, oc, c * 9)
    assert tile.channels_as_lanes and tile.rows == 4
    rng = np.random.default_rng(11)
    model = qlinear_conv_model((1, *chw), oc, 3, 1, 1, signed, rng)
    for init in model.graph.initializer:
        if init.name == "w":
            small = rng.integers(-63, 64, (oc, c, 3, 3)).astype(np.int8)
            init.CopyFrom(helper.make_tensor("w", TensorProto.INT8, small.shape,
                                             small.tobytes(), raw=True))
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    x = rng.integers(-128, 128, (1, *chw)).astype(np.int8 if signed else np.uint8)
    ex = kiln.compile(from_onnx(model), target)
    assert "out_words" in print_module(ex.ir)
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])
