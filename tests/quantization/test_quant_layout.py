"""`quant-layout` (kiln/transform/quant_layout.py): activations between dot-form int8
convolutions in words of 4 channels (NCHW4c), which the convolutions write and read in
place. A chain of QLinearConv nodes (3x3 and 1x1, stride 1 and 2, residual QLinearAdds,
a max pool and the output reading NCHW) must compute exactly what onnxruntime computes
(weights of at most 63 in magnitude keep every pair of products inside int16, so
saturating and exact products agree on any host), on the AVX2 tiles with
`int8-pairs=saturate`, on VNNI and on the c backend, u8 and s8."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_dot_gemm import host_runs

import kiln
from kiln.errors import IRError
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops.quant_conv_words import CONV_DOT, WORDS_LAYOUT
from kiln.ops.registry import call
from kiln.script import from_source, print_module
from kiln.transform import PassContext
from kiln.transform.quant_layout import QuantLayout
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

# (target, signed activations, whether values take NCHW4c): AVX2 with
# `int8-pairs=saturate` (s8 activations take the exact int16 pairs there, as onnxruntime's
# products are exact for them); the int16 pairs read words of 2 k, so their convolutions
# keep NCHW; VNNI's positions tiles (at most 3 vectors: 8 rows) store words
# (kiln.kernels.int8.conv_tile.stores_words)
CASES = [("llvm -mcpu=haswell -int8-pairs=saturate", False, True),
         ("c -mcpu=haswell -int8-pairs=saturate", False, True),
         ("llvm -mcpu=haswell -int8-pairs=saturate", True, False),
         ("llvm -mcpu=znver4", False, True),
         ("llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni", False, False)]
#: a batch of images: every layer's loops and views over the images
BATCH = 3


class _Chain:
    """QLinearConv nodes (random weights |w| <= 63, per-channel scales) and QLinearAdds."""

    def __init__(self, signed: bool, seed: int = 3) -> None:
        self.b = GraphBuilder()
        self.rng = np.random.default_rng(seed)
        self.signed = signed
        self.q = np.int8 if signed else np.uint8
        self.elem = TensorProto.INT8 if signed else TensorProto.UINT8
        self.count = 0
        self.b.consts({"s": np.float32(0.05), "z": self.q(-7 if signed else 121)})

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1,
             dilation: int = 1) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.b.consts({
            f"{name}_w": self.rng.integers(-63, 64, (cout, cin, k, k)).astype(np.int8),
            f"{name}_ws": self.rng.uniform(0.002, 0.006, cout).astype(np.float32),
            f"{name}_wz": np.zeros(cout, np.int8),
            f"{name}_b": self.rng.integers(-3000, 3000, cout).astype(np.int32)})
        self.b.add(helper.make_node(
            "QLinearConv", [x, "s", "z", f"{name}_w", f"{name}_ws", f"{name}_wz", "s", "z",
                            f"{name}_b"], [name], strides=[stride, stride],
            pads=[k // 2 * dilation] * 4, dilations=[dilation] * 2))
        return name

    def add(self, a: str, b: str) -> str:
        self.count += 1
        name = f"a{self.count}"
        self.b.add(helper.make_node("QLinearAdd", [a, "s", "z", b, "s", "z", "s", "z"],
                                    [name], domain="com.microsoft"))
        return name

    def model(self, x_shape: list[int], y: str, y_shape: list[int]) -> onnx.ModelProto:
        self.b.input("x", x_shape, self.elem)
        self.b.output(y, y_shape, self.elem)
        return self.b.model(opset={"": 13, "com.microsoft": 1})


def _chain(signed: bool, batch: int = 1) -> onnx.ModelProto:
    """x [batch, 16, 28, 28] -> 3x3 -> 1x1 (+ a 1x1 shortcut) -> residual add -> 3x3/2
    and 1x1/2 -> add -> 3x3 dilated 2 -> 3x3/2 -> 1x1 -> max pool (NCHW) -> 1x1 -> output
    (NCHW): on AVX2 the positions tile at 28 x 28 (in place, an im2col of phase planes),
    the channels tile at 14 x 14 and 7 x 7 (in place, strided ones at the stride); on
    VNNI the 1x1 layers at 28 x 28 (784 positions, no whole tiles of 32 or 48) in place,
    the last tile narrowed to one vector."""
    c = _Chain(signed)
    a = c.conv("x", 16, 16, 3)
    r = c.add(c.conv(a, 16, 32, 1), c.conv("x", 16, 32, 1))
    d = c.add(c.conv(r, 32, 32, 3, 2), c.conv(r, 32, 32, 1, 2))
    e = c.conv(c.conv(c.conv(d, 32, 32, 3, dilation=2), 32, 48, 3, 2), 48, 48, 1)
    c.b.add(helper.make_node("MaxPool", [e], ["p"], kernel_shape=[2, 2], strides=[1, 1]))
    return c.model([batch, 16, 28, 28], c.conv("p", 48, 16, 1), [batch, 16, 6, 6])


def _small_chain(signed: bool) -> onnx.ModelProto:
    """x [1, 64, 2, 2] -> 3x3 -> 1x1 -> 1x1 (4 positions: channels tiles on every x86
    family, VNNI's too) -> global average pool (reading the last layer's words, as a
    ResNet's last stage ends)."""
    c = _Chain(signed)
    y = c.conv(c.conv(c.conv("x", 64, 32, 3), 32, 64, 1), 64, 32, 1)
    c.b.add(helper.make_node("QLinearGlobalAveragePool", [y, "s", "z", "s", "z"], ["pool"],
                             domain="com.microsoft", channels_last=0))
    return c.model([1, 64, 2, 2], "pool", [1, 32, 1, 1])


def _compile(model: onnx.ModelProto, target: str) -> Any:
    with PassContext(config={"kiln.cache": False}):
        return kiln.compile(from_onnx(model), target)


@pytest.mark.parametrize(("target", "signed", "takes_words"), CASES)
def test_a_chain_in_words_computes_what_onnxruntime_does(target: str, signed: bool,
                                                         takes_words: bool) -> None:
    batch = BATCH if target.startswith("llvm -mcpu=haswell") and not signed else 1
    model = _chain(signed, batch)
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (batch, 16, 28, 28)).astype(np.int8 if signed else np.uint8)
    ex = _compile(model, target)
    text = print_module(ex.ir)
    # the tiles' views of words written (out_words4) and read in place (x_in_words)
    assert ("out_words4" in text and "x_in_words" in text) == takes_words
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


@pytest.mark.parametrize(("target", "signed"), [("llvm -mcpu=znver4", False),
                                               ("llvm -mcpu=znver4", True),
                                               ("c -mcpu=znver4", True)],
                         ids=["llvm-u8", "llvm-s8", "c-s8"])
def test_channel_tiles_write_words_on_vnni(target: str, signed: bool) -> None:
    # s8 words are read with their top bits flipped (the dot form's unsigned bytes); the
    # c backend prints the same kernels, the flip included
    model = _small_chain(signed)
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    x = np.random.default_rng(6).integers(-128, 128, (1, 64, 2, 2)).astype(
        np.int8 if signed else np.uint8)
    ex = _compile(model, target)
    text = print_module(ex.ir)
    # the pool sums whole word rows (kiln.kernels.int8.pool_words)
    assert "out_words4" in text and "x_in_words" in text and "word_rows" in text
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


def _graph(model: onnx.ModelProto, target: str) -> g.Function:
    with kiln.Target(target):
        mod = QuantLayout()(QuantizeOps()(from_onnx(model)))
    func = mod["main"]
    assert isinstance(func, g.Function)
    return func


def _layouts(func: g.Function) -> list[tuple[str, str]]:
    return [(b.value.attrs.get("in_layout", "NCHW"), b.value.attrs.get("out_layout", "NCHW"))
            for b in func.bindings if isinstance(b.value, g.Call) and b.value.op == CONV_DOT]


def test_values_take_words_only_between_convolutions_that_handle_them() -> None:
    func = _graph(_chain(False), "llvm -mcpu=haswell -int8-pairs=saturate")
    nchw, words = "NCHW", WORDS_LAYOUT
    # in graph order: the first 3x3 and the shortcut read the NCHW input; the 1x1 before
    # the max pool and the last one (the output) write NCHW
    assert _layouts(func) == [(nchw, words), (words, words), (nchw, words), *[(words, words)] * 4,
                              (words, nchw), (nchw, nchw)]
    adds = [b for b in func.bindings if isinstance(b.value, g.Call)
            and b.value.op == "qlinear_add"]
    assert len(adds) == 2
    for b in adds:
        t = b.var.type
        assert isinstance(t, TensorType) and t.ndim == 5 and t.shape[4] == 4


def test_a_reader_that_needs_nchw_keeps_its_producer_nchw() -> None:
    # aarch64's sdot: channels tiles write words (at 28 x 28 and 7 x 7), positions tiles of
    # 5 rows do not, so each value in words is one a channels tile writes and a
    # convolution reads, and every other value is NCHW
    func = _graph(_chain(False), "llvm -mcpu=neoverse-n1 -mtriple=aarch64-linux-gnu")
    layouts = _layouts(func)
    words = WORDS_LAYOUT
    assert layouts[0] == ("NCHW", words) and layouts[1] == (words, "NCHW")
    assert sum(out == words for _, out in layouts) == sum(in_ == words for in_, _ in layouts) > 0


def test_the_layout_round_trips_through_kiln_script() -> None:
    with kiln.Target("llvm -mcpu=haswell -int8-pairs=saturate"):
        mod = QuantLayout()(QuantizeOps()(from_onnx(_chain(False))))
    text = print_module(mod)
    assert f'in_layout="{WORDS_LAYOUT}"' in text
    assert_structural_equal(from_source(text), mod)


def test_words_packed_for_another_target_take_the_tensor_expression() -> None:
    # packed for aarch64's sdot (4 k a word), lowered for x86's int16 pairs (2 k a word):
    # the op's te definition reads and writes the words layout
    model = _chain(False)
    lowered = "llvm -mcpu=haswell"
    if not host_runs(lowered):
        pytest.skip(f"this host cannot run {lowered}")
    with kiln.Target("llvm -mcpu=neoverse-n1 -mtriple=aarch64-linux-gnu"):
        mod = QuantLayout()(QuantizeOps()(from_onnx(model)))
    assert WORDS_LAYOUT in print_module(mod)
    x = np.random.default_rng(2).integers(0, 256, (1, 16, 28, 28)).astype(np.uint8)
    with PassContext(config={"kiln.cache": False}):
        ex = kiln.compile(mod, lowered)
    assert "out_words4" not in print_module(ex.ir)
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


def _conv_call(func: g.Function, index: int) -> g.Call:
    calls = [b.value for b in func.bindings if isinstance(b.value, g.Call)
             and b.value.op == CONV_DOT]
    c = calls[index]
    assert isinstance(c, g.Call)
    return c


def test_words_the_convolution_cannot_read_or_write_are_refused() -> None:
    # int16 pairs: words of 2 k, not 4 channels of a tap
    func = _graph(_chain(False), "llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni")
    pairs = _conv_call(func, 0)
    x = pairs.args[0]
    assert isinstance(x.type, TensorType)
    n, ch, h, w = x.type.static_shape
    words = g.Var("w", TensorType((n, ch // 4, h, w, 4), x.type.dtype))
    with pytest.raises(IRError, match="words of 4 channels of one tap"):
        call(CONV_DOT, words, *pairs.args[1:], **{**pairs.attrs, "in_layout": WORDS_LAYOUT})
    with pytest.raises(IRError, match="in_layout must be"):
        call(CONV_DOT, *pairs.args, **{**pairs.attrs, "in_layout": "NHWC"})
    with pytest.raises(IRError, match="5-D"):
        call(CONV_DOT, *pairs.args, **{**pairs.attrs, "in_layout": WORDS_LAYOUT})
