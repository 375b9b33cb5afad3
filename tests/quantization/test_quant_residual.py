"""`quant-residual` (kiln/transform/quant_residual.py): a residual QLinearAdd fused into
the dot-form convolution producing one of its operands, added in the tiles' epilogues
(kiln/kernels/int8/conv_residual.py). Blocks of QLinearConv nodes ending in residual
adds (the convolution's output as the add's first and as its second operand; 1x1
layers on the positions tile, 3x3 ones in place, layers on the channels tile) must
compute exactly what onnxruntime computes: on VNNI, on AVX2 with
`int8-pairs=saturate` (haswell and znver3), on the c backend, through the op's
tensor-expression definition, and, fused on request, on the int16 pairs (AVX-512
without VNNI), whose convolutions store NCHW bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from test_dot_gemm import host_runs
from test_quant_layout import _Chain

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ops.quant_conv_words import CONV_DOT
from kiln.script import from_source, print_module
from kiln.transform import PassContext
from kiln.transform.quant_layout import QuantLayout
from kiln.transform.quant_residual import QuantResidual
from kiln.transform.quantize_ops import QuantizeOps
from support.reference import onnxruntime_outputs

VNNI = "llvm -mcpu=znver4"
AVX2 = "llvm -mcpu=haswell -int8-pairs=saturate"
ZNVER3 = "llvm -mcpu=znver3 -int8-pairs=saturate"
C_AVX2 = "c -mcpu=haswell -int8-pairs=saturate"
PAIRS = "llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni"
#: the blocks' image: the 3x3 layer runs in place on VNNI and AVX2 at 56 x 56
SIZE = 56
#: the deep blocks' image: 4 positions, the channels tile on every x86 family
DEEP = 2


def _blocks(signed: bool, batch: int = 1, size: int = SIZE) -> onnx.ModelProto:
    """x [batch, 16, size, size] -> two residual blocks, the convolution's output the
    add's first operand in one and its second in the other, the first a 1x1 layer (the
    positions tile, in place), the second a 3x3 one (at 56 x 56 in place on a padded
    grid: its rows copied out of the tiles' grid) -> a strided block at size / 2 -> 1x1
    (NCHW output)."""
    c = _Chain(signed)
    a = c.conv("x", 16, 16, 3)
    r = c.add(c.conv(a, 16, 32, 1), c.conv("x", 16, 32, 1))
    s = c.add(r, c.conv(c.conv(r, 32, 32, 1), 32, 32, 3))
    d = c.add(c.conv(s, 32, 64, 3, 2), c.conv(s, 32, 64, 1, 2))
    half = size // 2
    return c.model([batch, 16, size, size], c.conv(d, 64, 16, 1), [batch, 16, half, half])


def _deep(signed: bool) -> onnx.ModelProto:
    """x [1, 64, DEEP, DEEP] -> residual blocks at 7 x 7 (49 positions: the channels tile on
    every x86 family), 128 channels: a ResNet's last stage."""
    c = _Chain(signed)
    y = c.conv("x", 64, 128, 1)
    r = c.add(c.conv(c.conv(y, 128, 32, 1), 32, 128, 1), y)
    r = c.add(r, c.conv(c.conv(r, 128, 32, 3), 32, 128, 1))
    return c.model([1, 64, DEEP, DEEP], c.conv(r, 128, 16, 1), [1, 16, DEEP, DEEP])


def _input(signed: bool, shape: list[int], seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, shape).astype(np.int8 if signed else np.uint8)


def _fused(mod: IRModule | Any) -> int:
    """The fused convolutions of a compiled module's graph or of a graph module."""
    text = print_module(mod)
    return text.count("residual_operand=")


def _compile(mod: Any, target: str) -> Any:
    with PassContext(config={"kiln.cache": False}):
        return kiln.compile(mod, target)


def _graph(model: onnx.ModelProto, target: str, **options: Any) -> IRModule:
    with kiln.Target(target):
        return QuantResidual(**options)(QuantLayout()(QuantizeOps()(from_onnx(model))))


def _check(model: onnx.ModelProto, mod: Any, target: str, x: np.ndarray) -> None:
    ex = _compile(mod, target)
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


@pytest.mark.parametrize(("target", "signed", "fuses"), [
    (VNNI, False, True), (VNNI, True, True), (AVX2, False, True), (ZNVER3, False, True),
    (C_AVX2, False, True),
    # s8 on AVX2 takes the exact int16 pairs (NCHW), the int16 pairs store NCHW bytes:
    # the adds keep their kernel
    (AVX2, True, False), (PAIRS, False, False)])
def test_blocks_with_fused_adds_compute_what_onnxruntime_does(target: str, signed: bool,
                                                              fuses: bool) -> None:
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    model = _blocks(signed)
    assert _fused(_graph(model, target)) == 3 * fuses
    ex = _compile(from_onnx(model), target)
    # the 3x3 layer in place adds its residual as its rows are copied out of its grid
    assert ("residual_out_rows" in print_module(ex.ir)) == fuses
    x = _input(signed, [1, 16, SIZE, SIZE])
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


@pytest.mark.parametrize("target", [VNNI, AVX2])
def test_a_batch_and_a_symbolic_batch(target: str) -> None:
    # the residual's view follows the output's: images of a batch, chunks of a symbolic one
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    model = _blocks(False, 3)
    _check(model, from_onnx(model), target, _input(False, [3, 16, SIZE, SIZE]))
    symbolic = _blocks(False, 3)
    dim = symbolic.graph.input[0].type.tensor_type.shape.dim[0]
    dim.dim_param = "n"
    for out in symbolic.graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "n"
    ex = _compile(from_onnx(symbolic), target)
    assert "residual_out_words4" in print_module(ex.ir)
    for n in (1, 9):
        x = _input(False, [n, 16, SIZE, SIZE], seed=n)
        np.testing.assert_array_equal(ex["main"](x),
                                      onnxruntime_outputs(symbolic, {"x": x})[0])


@pytest.mark.parametrize(("target", "signed"), [(VNNI, False), (VNNI, True), (ZNVER3, False),
                                               ("c -mcpu=znver4", True)])
def test_channels_tiles_fuse_on_request(target: str, signed: bool) -> None:
    # not by default (a scalar copy of each tile's residual elements): asked for, the
    # channels tile adds them along its lanes
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    model = _deep(signed)
    assert _fused(_graph(model, target)) == 0
    mod = _graph(model, target, channels_tiles=True)
    assert _fused(mod) == 2
    _check(model, mod, target, _input(signed, [1, 64, DEEP, DEEP]))


@pytest.mark.parametrize("model", ["blocks", "deep"])
def test_nchw_bytes_fuse_on_request(model: str) -> None:
    # the int16 pairs store NCHW bytes: the positions tile adds the residual's bytes, the
    # 3x3 layers' rows as they are copied out, the channels tile its copied bytes
    if not host_runs(PAIRS):
        pytest.skip(f"this host cannot run {PAIRS}")
    onnx_model = _blocks(False) if model == "blocks" else _deep(False)
    mod = _graph(onnx_model, PAIRS, words_only=False, channels_tiles=True)
    assert _fused(mod) == (3 if model == "blocks" else 2)
    shape = [1, 16, SIZE, SIZE] if model == "blocks" else [1, 64, DEEP, DEEP]
    _check(onnx_model, mod, PAIRS, _input(False, shape))


def test_the_tensor_expression_definition_computes_the_fused_add() -> None:
    # packed for aarch64's sdot (4 k a word), lowered for x86's int16 pairs (2 k a word):
    # the op's te definition computes the convolution, then the add
    lowered = "llvm -mcpu=haswell"
    if not host_runs(lowered):
        pytest.skip(f"this host cannot run {lowered}")
    model = _blocks(False)
    mod = _graph(model, "llvm -mcpu=neoverse-n1 -mtriple=aarch64-linux-gnu", words_only=False)
    assert _fused(mod) > 0
    ex = _compile(mod, lowered)
    assert "residual_add" not in print_module(ex.ir)  # no tile: the te definition
    x = _input(False, [1, 16, SIZE, SIZE])
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])


def test_a_convolution_read_elsewhere_keeps_its_own_output() -> None:
    # y is read by the first add and by a convolution: each add takes the other operand's
    # convolution (its second), and y's convolution stays an op of its own
    c = _Chain(False)
    y = c.conv("x", 16, 32, 1)
    r = c.add(y, c.conv("x", 16, 32, 1))
    out = c.conv(c.add(r, c.conv(y, 32, 32, 1)), 32, 16, 1)
    model = c.model([1, 16, 28, 28], out, [1, 16, 28, 28])
    func = _graph(model, VNNI)["main"]
    assert isinstance(func, g.Function)
    calls = {b.var: b.value for b in func.bindings if isinstance(b.value, g.Call)}
    fused = [v for v in calls.values() if v.op == CONV_DOT and "residual_operand" in v.attrs]
    assert len(fused) == 2 and all(len(f.args) == 13 for f in fused)
    assert [f.attrs["residual_operand"] for f in fused] == [1, 1]
    assert not any(v.op == "qlinear_add" for v in calls.values())
    first = fused[0].args[6]  # y, the first add's residual, is read by a convolution too
    assert isinstance(first, g.Var) and "residual_operand" not in calls[first].attrs
    assert sum(first in v.args for v in calls.values()) == 2
    if host_runs(VNNI):
        _check(model, from_onnx(model), VNNI, _input(False, [1, 16, 28, 28]))


def test_the_fused_op_round_trips_through_kiln_script() -> None:
    mod = _graph(_blocks(False), AVX2)
    text = print_module(mod)
    assert "residual_operand=" in text and "residual_as_uint8=" in text
    assert_structural_equal(from_source(text), mod)
