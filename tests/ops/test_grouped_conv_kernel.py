"""The grouped GEMM convolution kernel (kiln.kernels.conv.grouped) against
onnxruntime on llvm, llvm with AVX-512 off and c, one and two threads.

The cases are ShuffleNet's pointwise layers, small: a grouped 1x1 convolution with a
bias and a fused ReLU on positions that fill whole panels (read in place), one on a
14x14-like image whose last panel is partial (read in place too, the last panel shifted
back to end at the last position) with a fused residual add, and a strided one (batch
2: the input copied into panels). Then a whole ShuffleNet unit:
grouped 1x1, channel shuffle (Reshape-Transpose-Reshape), depthwise 3x3, grouped 1x1
and the residual add. Last, a symbolic batch (one product per image and group).
"""

from __future__ import annotations

from typing import Any

import kernel_checks
import numpy as np
import onnx
import pytest

import kiln
from kiln.ir.tensor import PrimFunc
from kiln.kernels.conv.grouped import choose_tile, takes
from kiln.ops.conv_geometry import ConvShape
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(25)
TOL = 1e-5

# (input NCHW, output channels, groups, stride, tail)
CASES: list[dict[str, Any]] = [
    # 12 -> 24 channels in 3 groups over 4x16 (whole panels), bias and ReLU
    dict(x=(1, 12, 4, 16), co=24, g=3, s=1, tail="relu"),
    # 2x31 positions (the last panel partial), a residual add of the output's shape
    dict(x=(1, 8, 2, 31), co=8, g=2, s=1, tail="add"),
    # stride 2 (1x31 outputs), batch 2
    dict(x=(2, 6, 2, 61), co=9, g=3, s=2, tail=None),
]


def build_model() -> onnx.ModelProto:
    b = GraphBuilder(seed=25)
    for i, case in enumerate(CASES):
        n, c, h, w = case["x"]
        x = b.input(f"x{i}", [n, c, h, w])
        bias = [b.const(RNG.standard_normal(case["co"]).astype(np.float32), "bias")]
        y = b.op("Conv", x, b.weight(case["co"], c // case["g"], 1, 1), *bias,
                 group=case["g"], strides=[case["s"]] * 2)
        if case["tail"] == "relu":
            y = b.op("Relu", y)
        elif case["tail"] == "add":
            y = b.op("Add", y, x)
        b.output(y)
    # a ShuffleNet unit on 24 channels of 8x8, 3 groups
    x = b.input("unit", [1, 24, 8, 8])
    h = b.op("Relu", b.op("Conv", x, b.weight(24, 8, 1, 1), group=3))
    h = b.op("Reshape", h, b.const(np.array([1, 3, 8, 8, 8], np.int64), "shape"))
    h = b.op("Transpose", h, perm=[0, 2, 1, 3, 4])
    h = b.op("Reshape", h, b.const(np.array([1, 24, 8, 8], np.int64), "shape"))
    h = b.op("Conv", h, b.weight(24, 1, 3, 3), group=24, pads=[1, 1, 1, 1])
    h = b.op("Conv", h, b.weight(24, 8, 1, 1), group=3)
    b.output(b.op("Relu", b.op("Add", h, x)))
    return b.model(opset=17, ir_version=8, name="grouped", check=False)


MODEL = build_model()
CHECK = kernel_checks.KernelCases(MODEL, [*CASES, dict(x="unit")], TOL, RNG)
reference = CHECK.reference_fixture()
native = CHECK.native_fixture()


def test_matches_onnxruntime(native: kiln.driver.Executable, reference: list[np.ndarray],
                             tmp_path: Any) -> None:
    # one test per target: the model compiles once per target whatever the workers
    kernels = [f.attrs.get("kiln.conv_kernel") for f in native.ir.functions.values()
               if isinstance(f, PrimFunc)]
    assert kernels.count("conv2d_group_gemm") == len(CASES) + 2
    CHECK.assert_close(native(*CHECK.feeds.values()), reference)
    # two threads split the same tiles on every target: the host's llvm build suffices
    host = isa_for(Target.from_host())
    if native.target.kind.name == "llvm" and isa_for(native.target).vector_bits == \
            host.vector_bits:
        got = outputs_in_fresh_process(native, CHECK.feeds, tmp_path, threads=2)
        CHECK.assert_close(got, reference)


def test_the_tile_reads_the_input_in_place_where_whole_vectors_divide_the_positions() -> None:
    isa = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4"))
    # ShuffleNet's 28x28 layer: 784 positions are 49 vectors of 16, not whole 32s
    shape = ConvShape(1, 60, 28, 28, 240, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), 3)
    assert choose_tile(shape, isa)[1] == 16 and takes(shape, isa)
    # 7x7: 49 positions fill 77% of 64 lanes (left to the blocked kernel), but for the
    # bfloat16 nest's doubled multiply-add rate
    small = ConvShape(1, 240, 7, 7, 960, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), 3)
    assert not takes(small, isa)
    assert takes(small, isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 "
                                       "-precision=bf16")))


def test_a_partial_last_panel_keeps_two_vectors_where_they_waste_little() -> None:
    # ShuffleNet's 14x14 layers: no width of whole vectors divides 196 positions, so the
    # last panel overlaps the one before; AVX2 keeps the GEMM rule's 16 (208 computed,
    # 6%), AVX-512 narrows its 32 (224, 14%) to 16
    shape = ConvShape(1, 480, 14, 14, 120, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), 3)
    avx2 = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver3"))
    avx512 = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4"))
    assert choose_tile(shape, avx2) == (6, 16) and takes(shape, avx2)
    assert choose_tile(shape, avx512) == (8, 16)


def test_only_a_strided_layer_copies_its_input(native: kiln.driver.Executable) -> None:
    # the 1x1 stride-1 cases read the input in place, a partial last panel included (a
    # serial copy of ShuffleNet's 480-channel 14x14 input took a third of its layer)
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts

    copies = [name for name, f in native.ir.functions.items() if isinstance(f, PrimFunc)
              and f.attrs.get("kiln.conv_kernel") == "conv2d_group_gemm"
              for s in iter_stmts(f.body)
              if isinstance(s, t.Allocate) and s.buffer.name == "col"]
    assert len(copies) == 1


def test_a_symbolic_batch_runs_every_image() -> None:
    b = GraphBuilder(seed=3)
    x = b.input("x", ["N", 12, 4, 16])
    b.output(b.op("Relu", b.op("Conv", x, b.weight(24, 4, 1, 1), group=3)))
    model = b.model(opset=17, ir_version=8, name="batch", check=False)
    ex = kiln.compile(model, "llvm")
    assert "conv2d_group_gemm" in [f.attrs.get("kiln.conv_kernel")
                                   for f in ex.ir.prim_funcs().values()]
    for n in (1, 3):
        feeds = {"x": RNG.standard_normal((n, 12, 4, 16)).astype(np.float32)}
        want = onnxruntime_outputs(model, feeds)
        CHECK.assert_close([np.asarray(ex["main"](feeds["x"]))], want)
