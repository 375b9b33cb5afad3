"""The depthwise kernel's multi-row tiles and the squeeze-excite shapes around it,
against onnxruntime on llvm, llvm with AVX-512 off (16 registers: shorter tiles) and c.

Each case is one depthwise convolution (EfficientNet's 5x5 and stride-2 SAME_UPPER
layers, MobileNet's 3x3 with ReLU6, dilation, batch 2, a padded input larger than the
L2, padded per channel on the stack) chosen so that the output
height is not a multiple of the tile's rows (a full block and a partial one) and the
row splits into column tiles with a remainder; the SiLU (x * sigmoid(x)) is fused
into the kernel's epilogue. Then a squeeze-excite block: global average pooling
(read through a merged-dims view), two 1x1 convolutions and the broadcast channel
multiply (kiln.kernels.conv.channel_scale), and a [C, 1, 1] scale with a fused ReLU. Last,
2-D max and average pooling on the same window kernel: stride 2 with a fused ReLU,
dilation, ceil_mode with asymmetric pads (window counts that vary at the borders),
and counting the pads.
"""

from __future__ import annotations

from typing import Any

import kernel_checks
import numpy as np
import onnx
import pytest

import kiln
from kiln.ir.tensor import Allocate, DeclBuffer
from kiln.ir.visitor import iter_stmts
from kiln.kernels.conv.window import (
    DEPTHWISE_MAX_ROWS,
    WINDOW_PLANE_BYTES,
    depthwise_tile_rows,
    depthwise_tile_width,
)
from kiln.kernels.tiles import tile_lanes, tile_registers
from kiln.ops.conv_geometry import ConvShape
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(25)
TOL = 1e-5

# (input shape, kernel, stride, explicit pads or SAME_UPPER, dilation, tail)
CASES: list[dict[str, Any]] = [
    # 5x5 stride 2, SAME_UPPER (asymmetric pads), SiLU: 9 output rows, 37 columns
    dict(x=(1, 3, 17, 73), k=5, s=2, pads="SAME_UPPER", tail="silu"),
    # 3x3 stride 1 with ReLU6, batch 2: 19 output rows (blocks of 7 and a partial 5) of
    # 16 columns (one vector on 16 lanes: the 4 channels' padded planes on the stack
    # together, before their tiles)
    dict(x=(2, 4, 19, 16), k=3, s=1, pads=(1, 1, 1, 1), tail="relu6"),
    # 5x5, dilation 2, a 7 x 6 output (one tile of every row on 8 lanes; on 16, the
    # flattened plane of kiln.kernels.conv.flat_plane: 5 vectors of rows 11 apart, the
    # left pad wider than the right)
    dict(x=(1, 5, 7, 7), k=5, s=1, pads=(4, 4, 4, 3), dil=2, tail=None),
    # ShuffleNet's 14 x 14 -> 7 x 7 layer, 8 channels: its rows computed at stride 1 (one
    # vector on 16 lanes: the 8 channels' padded planes on the stack together, before
    # their tiles; two on 8 lanes: one plane per channel; on 4, split by column phase)
    dict(x=(1, 8, 14, 14), k=3, s=2, pads=(1, 1, 1, 1), tail=None),
    # padded, 17 channels of 128x128 padded: more than an L2 of 1 MB, so each channel is
    # padded on the stack next to its tiles (WINDOW_PLANE_BYTES, one plane exactly)
    dict(x=(1, 17, 126, 126), k=3, s=1, pads=(1, 1, 1, 1), tail="relu6"),
]
PLANE_CASES = 1  # the last cases
NARROW = 3  # the narrow strided case, padded on the stack too
ONE_VECTOR = 1  # rows of one vector on 16 lanes, padded on the stack too
SE = dict(x=(1, 24, 9, 9), squeezed=6)
# 2-D pooling on the same window kernel: (op, input, kernel, stride, pads, extra attrs)
POOLS: list[dict[str, Any]] = [
    # the stem's 3x3/2 max pool, a fused ReLU after it
    dict(op="MaxPool", x=(1, 3, 23, 40), k=3, s=2, pads=(1, 1, 1, 1), tail="relu"),
    # dilation 2, 2 stride 1
    dict(op="MaxPool", x=(2, 2, 12, 11), k=2, s=1, pads=(0, 0, 0, 0), dil=2),
    # ceil_mode with asymmetric pads, the count excluding them (it varies at the borders)
    dict(op="AveragePool", x=(1, 4, 17, 19), k=3, s=2, pads=(1, 0, 1, 1),
         attrs=dict(ceil_mode=1, count_include_pad=0)),
    # counting the pads
    dict(op="AveragePool", x=(1, 3, 9, 9), k=3, s=1, pads=(1, 1, 1, 1),
         attrs=dict(count_include_pad=1)),
]


def build_model() -> onnx.ModelProto:
    b = GraphBuilder(seed=25)
    for i, case in enumerate(CASES):
        c = case["x"][1]
        x = b.input(f"x{i}", list(case["x"]))
        attrs: dict[str, Any] = dict(kernel_shape=[case["k"]] * 2, strides=[case["s"]] * 2,
                                     dilations=[case.get("dil", 1)] * 2, group=c)
        if case["pads"] == "SAME_UPPER":
            attrs["auto_pad"] = "SAME_UPPER"
        else:
            attrs["pads"] = list(case["pads"])
        y = b.op("Conv", x, b.weight(c, 1, case["k"], case["k"]),
                 b.const(RNG.normal(0, 0.1, c).astype(np.float32), "b"), **attrs)
        if case["tail"] == "silu":
            y = b.op("Mul", y, b.op("Sigmoid", y))
        elif case["tail"] == "relu6":
            y = b.relu6(y)
        b.output(y)
    c = SE["x"][1]
    x = b.input("se", list(SE["x"]))
    s = b.op("Relu", b.conv(b.op("GlobalAveragePool", x), c, SE["squeezed"], 1))
    s = b.op("Sigmoid", b.conv(s, SE["squeezed"], c, 1))
    b.output(b.op("Mul", x, s))
    # a [C, 1, 1] scale as the first operand, with a fused ReLU after it
    scale = b.const(RNG.normal(0, 1, (c, 1, 1)).astype(np.float32), "scale")
    b.output(b.op("Relu", b.op("Mul", scale, b.input("se2", list(SE["x"])))))
    for i, case in enumerate(POOLS):
        y = b.op(case["op"], b.input(f"p{i}", list(case["x"])), kernel_shape=[case["k"]] * 2,
                 strides=[case["s"]] * 2, pads=list(case["pads"]), **case.get("attrs", {}),
                 **({"dilations": [case["dil"]] * 2} if "dil" in case else {}))
        b.output(b.op("Relu", y) if case.get("tail") == "relu" else y)
    return b.model(name="depthwise", check=False)  # outputs of unknown rank


CHECKS = kernel_checks.KernelCases(build_model(), [*CASES, SE, SE, *POOLS], TOL, RNG)
MODEL, FEEDS = CHECKS.model, CHECKS.feeds
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    kernels = [f.attrs.get("kiln.conv_kernel") for f in native.ir.functions.values()]
    assert kernels.count("conv2d_depthwise") == len(CASES)
    pools = [f.attrs.get("kiln.pool_kernel") for f in native.ir.functions.values()]
    assert len([p for p in pools if p]) == len(POOLS)
    assert sum(bool(f.attrs.get("kiln.channel_scale")) for f in native.ir.functions.values()) == 2
    CHECKS.assert_close(list(native(*FEEDS.values())), reference)


def test_large_padded_inputs_are_padded_per_channel(native: kiln.driver.Executable) -> None:
    """Past the L2 a stride-1 layer pads each channel into a stack plane, not the whole
    input into a workspace, as do the narrow strided layer and the layers whose rows are
    one vector (16 columns on 16 lanes, the dilated 6 on 8), those in blocks of
    channels; the other small layers (and the wide strided one) keep the workspace."""
    lanes = tile_lanes(isa_for(native.target))
    planes = {}
    for f in native.ir.functions.values():
        if f.attrs.get("kiln.conv_kernel") == "conv2d_depthwise":
            allocs = {s.buffer.name: s.buffer for s in iter_stmts(f.body)
                      if isinstance(s, Allocate)}
            planes[f.params[0].shape[1:]] = len(allocs["xplane"].shape) if (
                "xplane" in allocs) else 0
            if "xplane" in allocs:
                assert allocs["xplane"].scope == "local" and "xpad" not in allocs
    assert isa_for(native.target).l2_bytes < 17 * WINDOW_PLANE_BYTES
    # dims of the stack planes: (phases, rows, cols), with a block of channels first
    blocked = 4 if lanes >= 16 else 0
    assert planes == {CASES[0]["x"][1:]: 0, CASES[ONE_VECTOR]["x"][1:]: blocked,
                      CASES[2]["x"][1:]: 4 * (lanes == 8),  # 16 lanes: the flattened plane
                      CASES[NARROW]["x"][1:]: blocked or 3 * (lanes >= 8),
                      CASES[-1]["x"][1:]: 3}


def test_narrow_strided_rows_are_computed_at_stride_1(native: kiln.driver.Executable
                                                      ) -> None:
    """A stride-2 window kernel whose rows at stride 1 fit two vectors reads its input
    padded in one column phase and stores every other column (the 14-column layer, the
    19-column average pool on 16 lanes); wider rows (the 73-column layer, that pool on 8
    lanes) keep the split by column phase."""
    lanes = tile_lanes(isa_for(native.target))
    phases = {}
    for f in native.ir.functions.values():
        name = f.attrs.get("kiln.conv_kernel") or f.attrs.get("kiln.pool_kernel")
        allocs = {s.buffer.name: s.buffer for s in iter_stmts(f.body)
                  if isinstance(s, Allocate)}
        padded = allocs.get("xpad") or allocs.get("xplane")
        if name and padded:
            phases[f.params[0].shape[1:]] = (padded.shape[-3], "packed" in allocs)
    narrow = {CASES[0]["x"][1:]: False, CASES[NARROW]["x"][1:]: lanes >= 8,
              POOLS[2]["x"][1:]: lanes >= 16}
    for image, computed_at_stride_1 in narrow.items():
        assert phases[image] == ((1, True) if computed_at_stride_1 else (2, False))


def test_narrow_planes_are_flattened(native: kiln.driver.Executable) -> None:
    """A stride-1 layer whose output rows fill under three quarters of their vectors
    runs on the flattened plane (the dilated 7 x 6 output: 5 vectors of 16 lanes, not 7
    rows); on 8 lanes (rows of more than half a vector) and the other layers, the row
    tiles."""
    flat = {f.params[0].shape[1:]: any(s.buffer.name == "xflat" for s in iter_stmts(f.body)
                                       if isinstance(s, Allocate))
            for f in native.ir.functions.values()
            if f.attrs.get("kiln.conv_kernel") == "conv2d_depthwise"}
    wide = tile_lanes(isa_for(native.target)) >= 16
    assert flat == {case["x"][1:]: wide and case["x"] == (1, 5, 7, 7) for case in CASES}


def test_global_pool_reads_a_merged_view(native: kiln.driver.Executable) -> None:
    """The pool's row is one contiguous run of H * W values (vector loads, no gather)."""
    (pool,) = [f for f in native.ir.functions.values()
               if f.attrs.get("kiln.row_kernel") == "global_avg_pool"]
    views = [s.buffer.shape for s in iter_stmts(pool.body) if isinstance(s, DeclBuffer)]
    n, c, h, w = SE["x"]
    assert views == [(n, c, h * w)]


@pytest.mark.parametrize("target", [
    "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4",
    "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 -mattr=-avx512f",
    "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1",
])
@pytest.mark.parametrize("out_h,out_w", [(7, 7), (14, 14), (28, 28), (56, 56), (9, 37)])
def test_tile_rows_fit_the_registers(target: str, out_h: int, out_w: int) -> None:
    """A tile's accumulators, an input vector and a weight fit the ISA's registers; its
    rows split the image into blocks that differ by at most one row."""
    isa = isa_for(Target(target))
    lanes, registers = tile_lanes(isa), tile_registers(isa)
    shape = ConvShape(1, 8, out_h, out_w, 8, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), 8)
    tile_w = depthwise_tile_width(shape, lanes)
    rows = depthwise_tile_rows(shape, tile_w, lanes, registers)
    assert 1 <= rows <= min(out_h, DEPTHWISE_MAX_ROWS)
    assert rows * -(-tile_w // lanes) + 2 <= registers
    blocks = -(-out_h // rows)
    assert blocks * rows - out_h < blocks  # the partial block is at most one row short
    # no taller tile fits: fewer blocks would need more rows than the registers allow
    if blocks > 1:
        taller = -(-out_h // (blocks - 1))
        assert (taller > DEPTHWISE_MAX_ROWS
                or taller * -(-tile_w // lanes) + 2 > registers)
