"""The hand-scheduled convolution kernels (kiln.kernels.conv) against onnxruntime.

One ONNX model holds every edge case as an independent branch (so each backend
compiles once): remainders of the output-channel block and of the position tile,
row-tiled convolutions (1x1, and few input channels) with row and channel remainders,
1-wide and 1x1 images, odd channel counts, stride 2, dilation, grouped and
depthwise convolutions, asymmetric padding, a 7x7/2 stem, batch 2, and the
epilogues FuseOps attaches (bias, ReLU, Clip, Swish, residual Add). It runs on llvm and
c, in this process and in fresh processes with 1 and 2 threads.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRModule
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_ARG_DIMS
from kiln.ir.printer import print_func, print_module
from kiln.kernels.conv.blocked import Tiling, choose_tiling, pack_blocked_weight
from kiln.kernels.conv.ksegments import ConvKBlocking
from kiln.kernels.conv.rows import pack_rows_weight
from kiln.kernels.tiles import tile_lanes
from kiln.ops.conv_direct import unpack_blocked_weight, unpack_rows_weight
from kiln.ops.conv_geometry import ConvShape
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform import get_pass
from support.graphs import GraphBuilder
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)
TOL = 1e-5

# (input shape, out channels, kernel, strides, pads, dilations, group, tail ops)
CASES: list[dict[str, Any]] = [
    # two unpadded 1x1 layers at one image size over 24 and 40 channels: one blocked
    # kernel taking the channel count at run time (kiln.kernels.conv.run_time_width)
    dict(x=(1, 24, 5, 6), co=12, k=1, pads=(0, 0, 0, 0), tail=("Relu",)),
    dict(x=(1, 40, 5, 6), co=12, k=1, pads=(0, 0, 0, 0), tail=("Relu",)),
    # 63 positions: 9 tiles of 7 at 16 lanes (6 would leave 3 slots empty), 13 of 5 at
    # 8 lanes, the last with 3 positions; 5 channels < one block
    dict(x=(1, 3, 9, 7), co=5, k=3, pads=(1, 1, 1, 1), tail=("Relu",)),
    # 20 channels: a full and a partial block at 8 lanes; stride 2, asymmetric pads; the
    # epilogue (bias, Swish) computed in vectors along the channels, the partial block's
    # bias reads clamped into range
    dict(x=(1, 8, 9, 7), co=20, k=3, strides=(2, 2), pads=(0, 1, 2, 1), tail=("Swish",)),
    # grouped (2 groups of 3 channels), dilation 2, no bias
    dict(x=(2, 6, 8, 8), co=6, k=3, pads=(2, 2, 2, 2), dil=(2, 2), group=2, bias=False),
    # depthwise, stride 2, asymmetric pads; ReLU6 as Clip
    dict(x=(1, 8, 9, 7), co=8, k=3, strides=(2, 2), pads=(1, 0, 1, 1), group=8,
         tail=("Clip",)),
    # depthwise on a row wider than two tiles at 16 lanes (full tiles + remainder)
    dict(x=(1, 3, 4, 37), co=3, k=3, pads=(1, 1, 1, 1), group=3, tail=("Relu",)),
    # a 1-wide image, ReLU6 as Clip, a residual Add (read per channel along positions)
    dict(x=(1, 4, 5, 1), co=7, k=3, pads=(1, 1, 1, 1), tail=("Clip", "Add")),
    # a 1x1 image and a 1x1 kernel, residual add
    dict(x=(1, 3, 1, 1), co=4, k=1, pads=(0, 0, 0, 0), tail=("Add",)),
    # a residual Add read per channel along positions through flat views (63 positions:
    # the last tile partial), 20 channels (a partial block), then a ReLU
    dict(x=(1, 8, 9, 7), co=20, k=3, pads=(1, 1, 1, 1), tail=("Add", "Relu")),
    # the 7x7/2 stem, odd output width
    dict(x=(1, 3, 20, 17), co=16, k=7, strides=(2, 2), pads=(3, 3, 3, 3), tail=("Relu",)),
    # no padding (the kernel reads the input directly), 33 channels: 3 blocks at 16 lanes
    dict(x=(1, 5, 6, 6), co=33, k=3, pads=(0, 0, 0, 0)),
    # a strided 1x1 (a projection shortcut) on rows two vectors wide: blocked, not
    # row-tiled; 99 positions: 16 tiles of 6 and one of 3
    dict(x=(1, 6, 18, 22), co=10, k=1, strides=(2, 2), pads=(0, 0, 0, 0), tail=("Relu",)),
    # pads taller than the kernel's reach: the first and last output rows read only
    # border rows (their sums skip every tap: the bias alone), tiles spanning them and
    # image rows skip some (`image_rows`)
    dict(x=(1, 4, 3, 5), co=6, k=3, pads=(3, 1, 4, 0), tail=("Relu",)),
    # Row-tiled at any vector width up to 16 lanes (output rows >= 16 wide):
    # 1x1 with a full row tile and a remainder, 13 channels (two blocks of 6 and one),
    # residual add
    dict(x=(1, 5, 3, 37), co=13, k=1, pads=(0, 0, 0, 0), tail=("Add", "Relu")),
    # 1x1, batch 2, a row of exactly one tile at 8 lanes
    dict(x=(2, 4, 2, 16), co=7, k=1, pads=(0, 0, 0, 0), bias=False),
    # 3x3 over 3 channels (few taps), stride 2 (split by phase), asymmetric pads,
    # dilation 2 along the row
    dict(x=(1, 3, 8, 40), co=7, k=3, strides=(2, 2), pads=(1, 0, 2, 1), dil=(1, 2)),
    # 3x3 over 2 channels, stride 1, bias + ReLU
    dict(x=(1, 2, 5, 20), co=6, k=3, pads=(1, 1, 1, 1), tail=("Relu",)),
    # 11 output rows: 8 bands of 1 or 2 rows, each padding its own input rows
    dict(x=(1, 2, 11, 16), co=5, k=3, pads=(1, 1, 1, 1)),
    # a 1-row image, stride 1 with dilation 2 along the row and asymmetric pads: each
    # band's row copy a vector loop from padded column 2 on, the right border empty
    dict(x=(1, 3, 1, 24), co=5, k=3, pads=(1, 2, 1, 0), dil=(1, 2), tail=("Relu",)),
    # On the GEMM micro-kernel (64 positions fill its panels at 4-16 lanes):
    # 1x1 read in place (no copy), batch 2, 13 channels (a partial row tile), the
    # residual Add read through a flat view
    dict(x=(2, 5, 4, 16), co=13, k=1, pads=(0, 0, 0, 0), tail=("Add", "Relu")),
    # 1x1/2 (a projection shortcut) through the im2col workspace, ReLU6 as Clip
    dict(x=(1, 6, 16, 16), co=20, k=1, strides=(2, 2), pads=(0, 0, 0, 0), tail=("Clip",)),
    # 1x1 with padding (zero borders in the workspace), no bias; Swish in one pass
    dict(x=(1, 3, 6, 6), co=7, k=1, pads=(1, 1, 1, 1), bias=False, tail=("Swish",)),
]
ROWS = 4  # the four few-tap 3x3 cases before the GEMM ones
GEMM = 3  # the last cases
# the kernel each case gets at 8 lanes
AT_8_LANES = ["conv2d_gemm"] * 2 + ["conv2d_blocked"] * 3 + ["conv2d_depthwise"] * 2 \
    + ["conv2d_blocked"] * 3 + ["conv2d_rows"] + ["conv2d_blocked"] * 3 + ["conv2d_gemm"] * 2 \
    + ["conv2d_rows"] * ROWS + ["conv2d_gemm"] * GEMM


def _out_hw(case: dict[str, Any]) -> tuple[int, int]:
    _, _, h, w = case["x"]
    k, (pt, pl, pb, pr) = case["k"], case["pads"]
    sh, sw = case.get("strides", (1, 1))
    dh, dw = case.get("dil", (1, 1))
    return (h + pt + pb - dh * (k - 1) - 1) // sh + 1, (w + pl + pr - dw * (k - 1) - 1) // sw + 1


def build_model() -> onnx.ModelProto:
    nodes, inputs, outputs, inits = [], [], [], []
    for i, case in enumerate(CASES):
        n, c, _, _ = case["x"]
        group = case.get("group", 1)
        w = (RNG.standard_normal((case["co"], c // group, case["k"], case["k"])) * 0.3)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        args = [f"x{i}", f"w{i}"]
        if case.get("bias", True):
            inits.append(numpy_helper.from_array(
                RNG.standard_normal(case["co"]).astype(np.float32), f"b{i}"))
            args.append(f"b{i}")
        nodes.append(helper.make_node(
            "Conv", args, [f"c{i}"], strides=list(case.get("strides", (1, 1))),
            pads=list(case["pads"]), dilations=list(case.get("dil", (1, 1))), group=group))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(case["x"])))
        oshape = [n, case["co"], *_out_hw(case)]
        last = f"c{i}"
        for j, op in enumerate(case.get("tail", ())):
            out = f"t{i}_{j}"
            if op == "Relu":
                nodes.append(helper.make_node("Relu", [last], [out]))
            elif op == "Clip":
                inits += [numpy_helper.from_array(np.array(0.0, np.float32), f"lo{i}"),
                          numpy_helper.from_array(np.array(6.0, np.float32), f"hi{i}")]
                nodes.append(helper.make_node("Clip", [last, f"lo{i}", f"hi{i}"], [out]))
            elif op == "Swish":  # x * sigmoid(x), as EfficientNet exports write it
                nodes += [helper.make_node("Sigmoid", [last], [f"s{i}_{j}"]),
                          helper.make_node("Mul", [last, f"s{i}_{j}"], [out])]
            else:
                inputs.append(helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, oshape))
                nodes.append(helper.make_node("Add", [last, f"r{i}"], [out]))
            last = out
        outputs.append(helper.make_tensor_value_info(last, TensorProto.FLOAT, oshape))
    return kernel_checks.branches_model("convs", nodes, inputs, outputs, inits)


def model_of(cases: list[dict[str, Any]]) -> onnx.ModelProto:
    """`build_model` of `cases` instead of CASES."""
    saved = list(CASES)
    CASES[:] = cases
    try:
        return build_model()
    finally:
        CASES[:] = saved


CHECKS = kernel_checks.KernelCases(build_model(), CASES, TOL, RNG)
MODEL, FEEDS, assert_close = CHECKS.model, CHECKS.feeds, CHECKS.assert_close
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()


def test_every_convolution_uses_a_hand_written_kernel(native: kiln.driver.Executable) -> None:
    kinds = [f.attrs.get("kiln.conv_kernel") for f in native.ir.functions.values()
             if not f.attrs.get("kiln.graph")]
    used = [k for k in kinds if k is not None]
    # the first two share one where they take the blocked kernel (AVX-512)
    shared = any(f.attrs.get(ATTR_ARG_DIMS) and f.buffer_params[0].shape[2:] == (5, 6)
                 for f in native.ir.functions.values())
    assert len(used) == len(CASES) - shared
    assert used.count("conv2d_depthwise") == 2
    assert used.count("conv2d_rows") >= ROWS
    # narrower targets fill the GEMM panels of more 1x1 layers
    assert used.count("conv2d_gemm") >= GEMM


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    got = native(*FEEDS.values())
    assert_close(list(got), reference)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    threads: int, reference: list[np.ndarray]) -> None:
    assert_close(outputs_in_fresh_process(native, FEEDS, tmp_path, threads), reference)


def test_the_rewrite_is_visible_in_the_graph() -> None:
    mod = get_pass("block-convolutions", lanes=8)(from_onnx(MODEL))
    calls = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)
             and b.value.op.startswith("conv")]
    assert calls == AT_8_LANES
    text = print_module(mod)
    assert "conv2d_rows" in text and "conv2d(" not in text


def test_1x1_layers_of_every_width_share_one_kernel() -> None:
    # the first two cases, and the second's width again: one kernel, called with each
    # layer's input channel count, which its input and packed weight take from it
    from kiln.driver.compiler import lower_for_codegen
    from kiln.kernels.conv.run_time_width import WIDTH_NAME

    lowered = lower_for_codegen(from_onnx(model_of([*CASES[:2], CASES[1]])),
                                Target("llvm -mcpu=znver4"))
    kernels = [f for f in lowered.functions.values() if f.attrs.get("kiln.conv_kernel")]
    assert [f.attrs["kiln.conv_kernel"] for f in kernels] == ["conv2d_blocked"]
    assert kernels[0].attrs[ATTR_ARG_DIMS] == ((WIDTH_NAME, 0, 1),)
    x, w = kernels[0].buffer_params[:2]
    assert [x.shape[1].name, w.shape[2].name] == [WIDTH_NAME] * 2
    calls = print_func(lowered["main"])
    assert [calls.count(f"{c},") >= 1 for c in ("24", "40")] == [True, True]


def test_rows_weight_round_trip() -> None:
    w = RNG.standard_normal((13, 5, 3, 2)).astype(np.float32)
    packed = pack_rows_weight(w)
    assert packed.shape == (3, 5, 3, 2, 6)
    assert np.all(packed[2, ..., 1:] == 0)
    np.testing.assert_array_equal(packed[1, 4, 2, 1, 2], w[8, 4, 2, 1])
    np.testing.assert_array_equal(unpack_rows_weight(packed, 13), w)


def test_packed_weight_round_trip() -> None:
    w = RNG.standard_normal((20, 3, 3, 3)).astype(np.float32)
    packed = pack_blocked_weight(w, groups=2, cb=8)
    assert packed.shape == (2, 2, 3, 3, 3, 8)          # 10 channels per group: 2 blocks of 8
    assert np.all(packed[1, 1, :, :, :, 2:] == 0)      # zero padding past channel 10
    np.testing.assert_array_equal(packed[1, 0, 2, 1, 0, 3], w[10 + 3, 2, 1, 0])
    np.testing.assert_array_equal(unpack_blocked_weight(packed, 20), w)


@pytest.mark.parametrize(("hw", "lanes", "registers", "tile_w"), [
    (56, 16, 32, 6), (14, 16, 32, 6),   # 6 fills whole tiles (or wastes < 2%): kept
    (7, 16, 32, 7), (7, 8, 16, 5),      # 49 positions: 7 x 7; at 8 lanes 7 does not fit
    (7, 4, 32, 7), (3, 16, 32, 5), (2, 16, 32, 4),  # NEON; 9 positions: 2 x 5; 4: whole
])
def test_position_tile_leaves_few_slots_empty(hw: int, lanes: int, registers: int,
                                              tile_w: int) -> None:
    shape = ConvShape(1, 64, hw, hw, 64, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1))
    tiling = choose_tiling(shape, lanes, registers)
    assert (tiling.cb, tiling.tile_w) == (2 * lanes, tile_w)
    # the accumulators, the weight row and a broadcast fit the registers
    assert 2 * tile_w + 3 <= registers


@pytest.mark.parametrize(("spec", "k", "hw", "tile_w"), [
    ("llvm -mcpu=znver5", 1, 14, 7),  # 1x1 on 32 registers: 196 positions in 28 tiles of 7
    ("llvm -mcpu=znver5", 1, 17, 6),  # 289: only 5 fills (58 tiles): 6 kept, not narrowed
    ("llvm -mcpu=znver5", 3, 14, 6),  # a 3x3 layer keeps 6 (33 tiles, 2 slots of 198 empty)
    ("llvm -mcpu=znver3", 1, 14, 6),  # AVX2: 16 registers hold no 7-wide tile of 2 vectors
])
def test_pointwise_tiles_fill_every_slot_on_32_registers(spec: str, k: int, hw: int,
                                                         tile_w: int) -> None:
    from kiln.kernels.conv.direct import blocked_tiling

    shape = ConvShape(1, 960, hw, hw, 128, k, k, (1, 1), (1, 1), (k // 2,) * 4)
    isa = isa_for(Target(spec))
    tiling = blocked_tiling(shape, isa)
    assert (tiling.cb, tiling.tile_w) == (2 * tile_lanes(isa), tile_w)


@pytest.mark.parametrize(("spec", "lanes"), [
    ("llvm -mcpu=znver5", 16), ("llvm -mcpu=skylake-avx512", 16), ("llvm -mcpu=haswell", 8),
    ("llvm -mcpu=znver3", 8), ("llvm -mattr=+avx2,+fma", 8),
    ("llvm -mcpu=znver4 -mattr=-avx512f", 8), ("llvm", 4),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", 4), ("c", 4),
])
def test_vector_width_follows_the_target(spec: str, lanes: int) -> None:
    assert tile_lanes(isa_for(Target(spec))) == lanes


@pytest.mark.parametrize(("spec", "fma"), [
    ("llvm -mcpu=znver5", True), ("llvm -mcpu=haswell", True), ("llvm -mattr=+avx2,+fma", True),
    ("llvm -mcpu=haswell -mattr=-fma", False), ("llvm", False), ("c", False),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", True),
])
def test_fused_multiply_add_follows_the_target(spec: str, fma: bool) -> None:
    assert isa_for(Target(spec)).fma is fma


def test_kernels_fuse_multiply_adds_only_with_fma_hardware(
        native: kiln.driver.Executable) -> None:
    kernels = [f for f in native.ir.functions.values() if f.attrs.get("kiln.conv_kernel")]
    text = print_module(IRModule({f"k{i}": f for i, f in enumerate(kernels)}))
    assert ("T.fma(" in text) is isa_for(native.target).fma


def test_aarch64_compiles_with_neon_blocks() -> None:
    target = Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon")
    ex = kiln.compile(from_onnx(MODEL), target)
    consts = [b.data.shape for f in ex.ir.functions.values()
              for b in _alloc_consts(f) if b.data.ndim == 6]
    assert consts and all(shape[-1] in (4, 8) for shape in consts)
    assert any(str(a).endswith(".o") or ".o" in str(a) for a in ex.artifacts)


def _alloc_consts(func: Any) -> list[Any]:
    from kiln.ir.tensor import AllocConst
    from kiln.ir.visitor import iter_stmts

    return [s for s in iter_stmts(func.body) if isinstance(s, AllocConst)] \
        if hasattr(func, "body") else []


# A padded, dilated 3x3/2 layer and one with a single output row (as a 1-D layer): the
# registry leaves strided KxK layers to the blocked kernel, but `conv2d_gemm` computes
# any ungrouped convolution (through its im2col workspace), e.g. when a tuner picks it.
GEMM_KXK = [dict(x=(1, 5, 11, 10), co=9, k=3, strides=(2, 2), pads=(1, 2, 0, 1), dil=(1, 2),
                 tail=("Add", "Relu")),
            dict(x=(2, 6, 3, 23), co=17, k=3, strides=(1, 2), pads=(0, 1, 0, 1),
                 tail=("Relu",)),
            # stride 1, output rows as wide as the input's: the middle column's taps
            # copy whole planes (from rows 0, 2 and 4, the last two runs shortened by the
            # bottom padding), the others row by row
            dict(x=(1, 4, 6, 9), co=5, k=3, strides=(1, 1), pads=(0, 1, 2, 1), dil=(2, 1),
                 tail=("Relu",))]


def _check_gemm_kernel(cases: list[dict[str, Any]], target: str,
                       tile: Any = None) -> Any:
    """Compile `cases` with every convolution packed for the GEMM kernel (with `tile`,
    a function of the ISA, or the rule's), compare with onnxruntime and return the
    compiled module."""
    from kiln.kernels.conv.gemm import CONV_GEMM
    from kiln.transform.functor import rewrite_calls

    model = model_of(cases)
    checks = kernel_checks.KernelCases(model, cases, TOL, RNG)
    mod = from_onnx(model)
    tgt = native_target(target)
    isa = isa_for(tgt)
    main = mod["main"]
    assert isinstance(main, g.Function)

    def pack(c: g.Call) -> g.Call | None:
        if c.op != "conv2d":
            return None
        return CONV_GEMM.pack(c, isa) if tile is None else CONV_GEMM.pack_tile(c, isa, tile(isa))

    mod = mod.with_function("main", rewrite_calls(main, pack))
    ex = kiln.compile(mod, tgt)
    kinds = [f.attrs.get("kiln.conv_kernel") for f in ex.ir.functions.values()]
    assert kinds.count("conv2d_gemm") == len(cases)
    got = ex(*checks.feeds.values())
    checks.assert_close(list(got) if isinstance(got, (tuple, list)) else [got],
                        checks.reference())
    return ex


# A strided 1x1 layer of 300 input channels with a residual Add, 100 positions (7 panels
# at 16 lanes): on 256-bit vectors its im2col panels copied in groups of 3
# (conv_gemm.panel_group), the last group one panel (PARTIAL_PANEL below groups a
# shifted last panel read in place).
GROUPED = [dict(x=(1, 300, 20, 19), co=7, k=1, strides=(2, 2), pads=(0, 0, 0, 0),
                tail=("Add", "Relu"))]


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_gemm_kernel_computes_strided_kxk_layers(target: str) -> None:
    # GROUPED: on 256-bit vectors a 1x1 layer whose epilogue reads a residual copies
    # groups of consecutive panels and runs each row tile over the group
    # (conv_gemm.panel_group: each output and residual row in runs of several panels)
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts

    ex = _check_gemm_kernel(GEMM_KXK + GROUPED, target)
    panels = [s.buffer.shape for f in ex.ir.functions.values()
              if f.attrs.get("kiln.conv_kernel") == "conv2d_gemm"
              for s in iter_stmts(f.body) if isinstance(s, t.Allocate)
              and s.buffer.name == "panel" and s.buffer.shape[1] == 300]
    grouped = isa_for(native_target(target)).vector_bits == 256
    assert panels == ([(3, 300, 16)] if grouped else [])


# 63 positions per image: whole panels and a partial last one at 4, 8 and 16 lanes.
PARTIAL_PANEL = [dict(x=(2, 5, 7, 9), co=13, k=1, pads=(0, 0, 0, 0), tail=("Add", "Relu"))]


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_gemm_kernel_reads_a_partial_last_panel_in_place(target: str) -> None:
    # A 1x1 stride-1 layer whose positions fill no whole last panel reads its input in
    # place: the last panel computes the last `nr` positions and stores only those the
    # panel before left (gemm_body's `shifted_tail`), with no im2col workspace.
    _check_gemm_kernel(PARTIAL_PANEL, target)
    _assert_gemm_without_workspace(native_target(target))


# Two 1x1 layers over 24 and 40 channels into 13 (the residual read through flat views)
# and a third over 24 again: one GEMM kernel taking the depth of its products at run time.
GEMM_WIDTHS = [dict(x=(2, c, 4, 16), co=13, k=1, pads=(0, 0, 0, 0), tail=("Add", "Relu"))
               for c in (24, 40, 24)]


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_gemm_kernel_takes_the_input_width_at_run_time(target: str) -> None:
    from kiln.kernels.conv.gemm import choose_tile, copies_panels
    from kiln.kernels.conv.run_time_width import WIDTH_NAME
    from kiln.ops.conv_geometry import ConvShape

    checks = kernel_checks.KernelCases(model_of(GEMM_WIDTHS), GEMM_WIDTHS, TOL, RNG)
    tgt = native_target(target)
    ex = kiln.compile(from_onnx(checks.model), tgt)
    checks.assert_close(list(ex(*checks.feeds.values())), checks.reference())
    kernels = {name: f for name, f in ex.ir.functions.items()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_gemm"}
    # where the rule copies the panels (AVX2's profile), the copy is sized by the width:
    # a kernel per width
    isa = isa_for(tgt)
    shape = ConvShape(2, 24, 4, 16, 13, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0), 1)
    if copies_panels(shape, choose_tile(shape, isa), isa):
        assert len(kernels) == 2 and not any(ATTR_ARG_DIMS in f.attrs
                                             for f in kernels.values())
        return
    (name, f), = kernels.items()
    assert f.attrs[ATTR_ARG_DIMS] == ((WIDTH_NAME, 0, 1),)
    x, w = f.buffer_params[:2]
    assert [x.shape[1].name, w.shape[1].name] == [WIDTH_NAME] * 2
    assert print_func(ex.ir["main"]).count(f'"{name}"') == 3


def test_gemm_kernel_partial_last_panel_compiles_for_avx512() -> None:
    # compile only (LLVM verifies the module): 63 positions are one whole panel of 32
    # lanes and a shifted partial one
    _assert_gemm_without_workspace(Target("llvm -mcpu=znver4"))


def _assert_gemm_without_workspace(target: Any) -> None:
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts

    ex = kiln.compile(model_of(PARTIAL_PANEL), target)
    gemm = [f for f in ex.ir.functions.values()
            if f.attrs.get("kiln.conv_kernel") == "conv2d_gemm"]
    assert len(gemm) == 1
    allocated = [s.buffer.name for s in iter_stmts(gemm[0].body) if isinstance(s, t.Allocate)]
    assert "col" not in allocated


@pytest.mark.parametrize(("spec", "copies"), [
    ("llvm -mcpu=znver3", True), ("c -mcpu=znver3", True), ("llvm -mcpu=znver4", False)])
def test_gemm_kernel_copies_panels_on_avx2(spec: str, copies: bool) -> None:
    # On 256-bit vectors a 1x1 layer read in place copies each panel of positions to
    # the stack before its row tiles read it (conv_gemm.copies_panels); the AVX-512
    # tiles keep reading this layer's input in place (too few row tiles read a panel:
    # `test_gemm_conv_copies_panels_read_by_many_row_tiles`). The c code runs where the
    # host can (the llvm code runs in the partial-panel test above on any AVX2 path).
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts

    target, model = Target(spec), model_of(PARTIAL_PANEL)
    ex = kiln.compile(model, target)
    gemm = [f for f in ex.ir.functions.values()
            if f.attrs.get("kiln.conv_kernel") == "conv2d_gemm"]
    allocated = [s.buffer.name for s in iter_stmts(gemm[0].body) if isinstance(s, t.Allocate)]
    assert ("panel" in allocated) is copies
    host = {str(f) for f in Target.from_host().export().get("mattr", ())}
    if spec.startswith("c") and {"+avx2", "+fma"} <= host:  # runs on any AVX2+FMA host
        checks = kernel_checks.KernelCases(model, PARTIAL_PANEL, TOL, RNG)
        checks.assert_close([ex(*checks.feeds.values())], checks.reference())


# 512 outputs, 2 images of 64 positions (2 panels of 32 on AVX-512, 4 of 16 on AVX2) with the
# residual Add: 64 row tiles of 8 read each panel, which AVX2 and AVX-512 copy first.
MANY_ROW_TILES = [dict(x=(2, 24, 8, 8), co=512, k=1, pads=(0, 0, 0, 0), tail=("Add", "Relu"))]


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_gemm_kernel_copies_panels_read_by_many_row_tiles(target: str) -> None:
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts
    from kiln.kernels.conv.gemm import choose_tile, copies_panels

    ex = _check_gemm_kernel(MANY_ROW_TILES, target)
    isa = isa_for(native_target(target))
    shape = ConvShape(2, 24, 8, 8, 512, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
    gemm = [f for f in ex.ir.functions.values()
            if f.attrs.get("kiln.conv_kernel") == "conv2d_gemm"]
    allocated = [s.buffer.name for s in iter_stmts(gemm[0].body) if isinstance(s, t.Allocate)]
    assert ("panel" in allocated) is copies_panels(shape, choose_tile(shape, isa), isa)


def test_gemm_kernel_wide_tile() -> None:
    # The wide tile (6 rows x 4 vectors) the rule gives an output far larger than the
    # L2 on a 32-register target (so only on llvm): 128 positions (2 panels at 16
    # lanes, 4 at 8), 13 channels (a partial row tile), read in place, the residual Add
    # along the flat positions.
    from kiln.kernels.conv.gemm import WIDE_TILE

    rows, vectors = WIDE_TILE
    _check_gemm_kernel([dict(x=(1, 7, 8, 16), co=13, k=1, pads=(0, 0, 0, 0),
                             tail=("Add", "Relu"))], "llvm",
                       lambda isa: (rows, vectors * tile_lanes(isa)))


@pytest.mark.parametrize(("spec", "tile"), [
    ("llvm -mcpu=znver4", (6, 64)),    # 256 x 3136 outputs: 3.2 MB, past twice the L2
    ("llvm -mcpu=haswell", (6, 16)),   # 16 registers: the wide tile does not fit
])
def test_gemm_conv_widens_the_tile_of_a_large_output(spec: str, tile: tuple[int, int]
                                                     ) -> None:
    from kiln.kernels.conv.gemm import choose_tile

    isa = isa_for(Target(spec))
    big = ConvShape(1, 64, 56, 56, 256, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
    small = ConvShape(1, 256, 56, 56, 64, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
    assert choose_tile(big, isa) == tile
    assert choose_tile(small, isa) == ((8, 32) if isa.vector_registers == 32 else (6, 16))


@pytest.mark.parametrize(("spec", "gemm"), [
    # AVX2: a 14x14 image (196 of 208 lanes) on the GEMM kernel with its panels copied,
    # up to 1024 input channels (conv_gemm.COPIED_LANE_USE, PANEL_COPY_BYTES)
    ("llvm -mcpu=znver3", {(256, 14, 1): True, (1024, 14, 1): True, (2048, 14, 1): False,
                           (512, 28, 2): False, (512, 7, 1): False}),
    # AVX-512 (not measured there): read in place, 95% of the lanes
    ("llvm -mcpu=znver4", {(256, 14, 1): False, (1024, 14, 1): False, (2048, 14, 1): False,
                           (512, 28, 2): False, (512, 7, 1): False}),
])
def test_gemm_conv_takes_14x14_1x1_layers_whose_panels_are_copied(
        spec: str, gemm: dict[tuple[int, int, int], bool]) -> None:
    from kiln.kernels.conv.gemm import choose_tile, copies_panels, takes

    isa = isa_for(Target(spec))
    for (ci, h, stride), expected in gemm.items():
        shape = ConvShape(1, ci, h, h, 256, 1, 1, (stride, stride), (1, 1),
                          (0, 0, 0, 0))
        assert takes(shape, isa) is expected, (ci, h, stride)
        # 256 outputs: 32 row tiles of 8, too few on AVX-512
        assert copies_panels(shape, choose_tile(shape, isa), isa) is (
            isa.vector_bits == 256 and ci <= 1024), ci


@pytest.mark.parametrize(("spec", "copied"), [
    # AVX2: wherever more than one row tile reads the panel
    ("llvm -mcpu=znver3", {(64, 256): True, (128, 512): True, (256, 64): True,
                           (64, 64): True, (512, 256): True}),
    # AVX-512: only where at least 40 row tiles read it (ResNet-50's expanding layers)
    ("llvm -mcpu=znver4", {(64, 256): True, (128, 512): True, (256, 64): False,
                           (64, 64): False, (256, 128): False, (512, 256): False}),
])
def test_gemm_conv_copies_panels_read_by_many_row_tiles(
        spec: str, copied: dict[tuple[int, int], bool]) -> None:
    from kiln.kernels.conv.gemm import choose_tile, copies_panels

    isa = isa_for(Target(spec))
    for (ci, co), expected in copied.items():
        h = 56 if ci <= 256 else 28
        shape = ConvShape(1, ci, h, h, co, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
        tile = choose_tile(shape, isa)
        assert copies_panels(shape, tile, isa) is expected, (ci, co, tile)
        readers = isa.profile.panel_copy_readers
        assert readers is not None and expected is (-(-co // tile[0]) >= readers)


@pytest.mark.parametrize(("spec", "tiles"), [
    # AVX2: 6-row tiles leave 2 of 18 and 4 of 36 rows surplus for 16 and 32 channels
    ("llvm -mcpu=znver3", {16: (4, 16), 32: (4, 16), 48: (6, 16), 64: (6, 16), 20: (5, 16)}),
    # AVX-512 (not measured there): the GEMM rule's 8 rows throughout
    ("llvm -mcpu=znver4", {16: (8, 32), 32: (8, 32), 48: (8, 32), 64: (8, 32), 20: (8, 32)}),
])
def test_gemm_conv_narrow_outputs_take_rows_that_divide_them(
        spec: str, tiles: dict[int, tuple[int, int]]) -> None:
    from kiln.kernels.conv.gemm import choose_tile

    isa = isa_for(Target(spec))
    for co, tile in tiles.items():
        shape = ConvShape(1, 96, 54, 54, co, 1, 1, (1, 1), (1, 1), (0, 0, 0, 0))
        assert choose_tile(shape, isa) == tile, co


def _conv_calls(main: g.Function) -> list[g.Call]:
    from kiln.transform.functor import rewrite_calls

    convs: list[g.Call] = []
    rewrite_calls(main, lambda c: convs.append(c) if c.op == "conv2d" else None)
    return convs


@pytest.mark.parametrize(("spec", "rows"), [
    ("llvm -mcpu=znver3", {32: 4, 16: 4, 64: 6, 128: 6}),  # 6-row tiles: 36 rows for 32
    ("llvm -mcpu=znver4", {32: 4, 16: 4, 64: 6, 128: 6}),  # AVX-512 the same
])
def test_row_tiled_narrow_outputs_take_rows_that_divide_them(spec: str,
                                                              rows: dict[int, int]) -> None:
    from kiln.kernels.conv.rows import CONV_ROWS
    from kiln.ops.packed_attrs import TILE

    isa = isa_for(Target(spec))
    for co, want in rows.items():
        main = from_onnx(model_of([dict(x=(1, 32, 8, 32), co=co, k=3,
                                        pads=(1, 1, 1, 1))]))["main"]
        assert isinstance(main, g.Function)
        assert [CONV_ROWS.pack(c, isa).attrs[TILE][0] for c in _conv_calls(main)] == [want], co


def test_blocked_epilogue_math_runs_in_vectors(native: kiln.driver.Executable) -> None:
    # The NCHW blocked kernel's stores are a plane apart (scalar); its epilogue (here
    # Swish's sigmoid, dozens of operations) is computed first in vector loops along
    # the channels: every store of its `result` is inside a `vector` loop (an epilogue
    # reading a tensor shaped like the output, a residual, reads a plane apart: scalar).
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_stmts

    swish = [(name, f) for name, f in native.ir.functions.items()
             if f.attrs.get("kiln.conv_kernel") == "conv2d_blocked" and "sigmoid" in name
             and "add" not in name]
    if native.target.kind.name == "c" and not swish:
        pytest.skip("the c target's narrower tiles give the Swish case to the row kernel")
    assert swish
    for name, f in swish:
        stores = [s for s in iter_stmts(f.body)
                  if isinstance(s, t.Store) and s.buffer.name == "result"]
        in_vectors = {id(s) for loop in iter_stmts(f.body)
                      if isinstance(loop, t.For) and loop.kind == "vector"
                      for s in iter_stmts(loop.body)}
        assert stores and all(id(s) in in_vectors for s in stores), name


def test_blocked_residual_is_read_along_positions(native: kiln.driver.Executable) -> None:
    # NCHW, an epilogue reading a tensor shaped like the output (the residual Add) runs
    # per output channel in a loop kept scalar, reading the residual and storing the
    # output through flat views at the tile's consecutive positions: along the
    # channels both are a plane apart and LLVM made them gathers and scatters.
    from kiln.ir import tensor as t
    from kiln.ir.visitor import iter_nodes, iter_stmts

    added = [f for name, f in native.ir.functions.items()
             if f.attrs.get("kiln.conv_kernel") == "conv2d_blocked" and "add" in name]
    flat = 0
    for f in added:  # (a 1-wide image's residual is indexed without its column: left)
        loads = [e for e in iter_nodes(f.body) if isinstance(e, t.Load)
                 and e.buffer.name.endswith("_flat")]
        if not loads:
            continue
        flat += 1
        in_scalar = {id(e) for loop in iter_stmts(f.body)
                     if isinstance(loop, t.For) and loop.kind == "scalar"
                     for e in iter_nodes(loop.body)}
        assert all(len(e.indices) == 3 and id(e) in in_scalar for e in loads), f.attrs
        assert any(isinstance(s, t.Store) and s.buffer.name == "out_flat"
                   for s in iter_stmts(f.body))
    if native.target.kind.name == "c" and not flat:
        pytest.skip("the c target's narrower tiles give the residual case to the row kernel")
    assert flat >= 1, [f.attrs for f in added]


# K-blocked sums of the blocked kernel (`ConvKBlocking`), forced onto small layers with
# 8 channels per segment and 2 tiles per task, so that every layer has several segments
# and a partial last band: a padded 3x3 with a ReLU, a 7x7-image 1x1 with a residual Add,
# a grouped 3x3 (2 groups of 16 channels) with Swish and a partial channel block, a
# strided 3x3 on a batch of 2.
KBLOCK_CASES = [dict(x=(1, 48, 5, 7), co=20, k=3, pads=(1, 1, 1, 1), tail=("Relu",)),
                dict(x=(1, 32, 7, 7), co=24, k=1, pads=(0, 0, 0, 0), tail=("Add",)),
                dict(x=(1, 32, 6, 6), co=18, k=3, pads=(1, 1, 1, 1), group=2,
                     tail=("Swish",)),
                dict(x=(2, 16, 9, 9), co=16, k=3, strides=(2, 2), pads=(1, 1, 1, 1)),
                # a strided 1x1 (a projection shortcut: subsampled first on AVX2), batch 2,
                # with the residual Add
                dict(x=(2, 16, 10, 12), co=24, k=1, strides=(2, 2), pads=(0, 0, 0, 0),
                     tail=("Add", "Relu")),
                # unblocked (12 channels), run in bands of 2 tiles (`band_tiles`): 5 tiles
                # of a 5x5 output (a partial last band), 3 channel blocks (the last
                # partial), batch 2, asymmetric pads, the residual Add
                dict(x=(2, 12, 9, 9), co=40, k=3, strides=(2, 2), pads=(0, 1, 2, 1),
                     tail=("Add", "Relu"))]


def _kblocked_model(monkeypatch: pytest.MonkeyPatch, target: str, pipeline: str = "default"
                    ) -> tuple[kiln.driver.Executable, kernel_checks.KernelCases]:
    from kiln.kernels.conv import direct as conv_direct
    from kiln.transform import PassContext

    model = model_of(KBLOCK_CASES)
    checks = kernel_checks.KernelCases(model, KBLOCK_CASES, TOL, RNG)
    monkeypatch.setattr(conv_direct, "choose_k_blocking",
                        lambda shape, tiling, isa: ConvKBlocking(8, 2)
                        if shape.ci_group % 8 == 0 else None)
    monkeypatch.setattr(conv_direct, "band_tiles", lambda shape, tiling, isa: 2)
    with PassContext(config={"kiln.cache": False}):  # not the unblocked kernels' entry
        ex = kiln.compile(from_onnx(model), native_target(target), graph_pipeline=pipeline)
    return ex, checks


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_k_blocked_sums_match_onnxruntime(monkeypatch: pytest.MonkeyPatch, target: str,
                                          tmp_path: Path) -> None:
    ex, checks = _kblocked_model(monkeypatch, target)
    blocked = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_blocked"]
    # at 4 lanes (c) the 1x1 and the strided layers are the row kernel's
    assert len(blocked) >= (2 if target == "c" else 4)
    # all K-blocked but the 12-channel layer, which runs in bands
    assert sum("part" in print_module_text(f) for f in blocked) == len(blocked) - (
        target != "c")
    want = checks.reference()
    got = ex(*checks.feeds.values())
    checks.assert_close(list(got), want)
    checks.assert_close(outputs_in_fresh_process(ex, checks.feeds, tmp_path, 2), want)


def test_k_blocked_sums_in_nchwc(monkeypatch: pytest.MonkeyPatch) -> None:
    # the NCHW{b}c kernel (`conv2d_nchwc`) stores blocked vectors after the last
    # segment: a chain of 3x3 layers (24 -> 32 -> 20 -> 32 channels, a partial block)
    # with ReLUs, in the blocked layout from the first convolution to the last
    from kiln.kernels.conv import direct as conv_direct
    from kiln.transform import PassContext, nchwc_layout

    b = GraphBuilder()
    channels = [24, 32, 20, 32, 32, 32, 16]
    last = "x"
    for i, (ci, co) in enumerate(itertools.pairwise(channels)):
        w = (RNG.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32)
        b.consts([numpy_helper.from_array(w, f"w{i}")])
        b.add(helper.make_node("Conv", [last, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        last = f"r{i}"
    model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 6, 7])],
                    [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, 16, 6, 7])],
                    name="chain", check=False)
    x = RNG.standard_normal((1, 24, 6, 7)).astype(np.float32)
    monkeypatch.setattr(conv_direct, "choose_k_blocking",
                        lambda shape, tiling, isa: ConvKBlocking(8, 2)
                        if shape.ci_group % 8 == 0 else None)
    # on AVX2 the pass would leave such K-blocked small-image layers NCHW
    monkeypatch.setattr(nchwc_layout, "k_blocked_small_images", lambda func, isa: set())
    with PassContext(config={"kiln.cache": False}):
        ex = kiln.compile(from_onnx(model), native_target("llvm"), graph_pipeline="nchwc")
    kinds = [f.attrs.get("kiln.conv_kernel") for f in ex.ir.functions.values()]
    assert kinds.count("conv2d_nchwc") >= 5
    got = np.asarray(ex(x))
    want = onnxruntime_outputs(model, {"x": x})[0]
    assert np.linalg.norm(got - want) <= TOL * np.linalg.norm(want)


def print_module_text(func: Any) -> str:
    """The buffers `func` allocates, by name (a K-blocked kernel allocates `part`)."""
    from kiln.ir.tensor import Allocate
    from kiln.ir.visitor import iter_stmts

    return " ".join(s.buffer.name for s in iter_stmts(func.body) if isinstance(s, Allocate))


@pytest.mark.parametrize(("shape", "blocked"), [
    # 3x3 512 > 512 @28: 295 KB of weights per 16-channel block, past a quarter of the L2
    ((512, 28, 3, 1), (32, 341)),    # partial sums: 341 tiles of 6 x 16 in 128 KB
    ((256, 56, 3, 1), (32, 341)),
    ((512, 14, 3, 2), (32, 409)),   # 7x7 output: 5-position tiles
    ((2048, 7, 1, 1), (32, 409)),   # a 7x7 image
    ((512, 7, 1, 1), (32, 409)),
    ((128, 28, 3, 1), None),         # 74 KB of weights: unblocked
    ((64, 224, 3, 1), None),
    ((1024, 14, 1, 1), None),
    ((12, 7, 1, 1), None),           # no segment of 8 channels or more divides 12 in two
    ((256, 7, 1, 1), None),          # a 7x7 image, but 16 KB of weights: they stay in L1
])
def test_k_blocking_rule(shape: tuple[int, int, int, int],
                                 blocked: tuple[int, int] | None) -> None:
    from kiln.kernels.conv.direct import choose_k_blocking

    ci, hw, k, stride = shape
    conv = ConvShape(1, ci, hw, hw, 512, k, k, (stride, stride), (1, 1), (k // 2,) * 4)
    isa = isa_for(Target("llvm -mcpu=znver3"))
    tiling = choose_tiling(conv, tile_lanes(isa), isa.vector_registers)
    got = choose_k_blocking(conv, tiling, isa)
    assert (got.kc, got.band) == blocked if blocked else got is None
    # AVX-512 (a 1 MB L2 on Zen 4) blocks where the weights pass a quarter of the L2 and
    # the padded input half of it: 3x3 layers of 256 and 512 input channels (295 and 590
    # KB per 32-channel block) at 14x14 and up; not a 7x7 image's 1x1 layers (401 KB of
    # input at 2048 channels), nor by the small-image criterion
    avx512 = isa_for(Target("llvm -mcpu=znver4"))
    wide = choose_tiling(conv, 16, 32)
    got = choose_k_blocking(conv, wide, avx512)
    want = k == 3 and ci >= 256
    assert (got is not None and got.kc == 32) if want else got is None


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_weight_prefetches_keep_results_and_stay_in_bounds(
        monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    # every blocked layer of the K-blocked cases prefetched (the rule takes only large
    # weights on small images): K-blocked, banded, grouped, strided, partial blocks;
    # the values match onnxruntime and the reference interpreter, which reads each
    # prefetched element, so an address past a weight buffer fails there
    from kiln.ir import evaluate
    from kiln.kernels.conv import direct as conv_direct

    monkeypatch.setattr(conv_direct, "prefetches_weights", lambda shape, tiling, isa: True)
    ex, checks = _kblocked_model(monkeypatch, target)
    blocked = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_blocked"]
    assert blocked and all("T.prefetch(" in print_func(f) for f in blocked)
    want = checks.reference()
    checks.assert_close(list(ex(*checks.feeds.values())), want)
    feeds = list(checks.feeds.values())
    main = ex.ir.functions["main"]  # lowered: the outputs are parameters after the inputs
    outs = [np.zeros(tuple(p.shape), p.dtype) for p in main.params[len(feeds):]]
    evaluate(ex.ir, "main", *feeds, *outs)
    checks.assert_close(outs, want)


@pytest.mark.parametrize(("shape", "prefetched"), [
    ((512, 2048, 7, 1), True),    # ResNet-50's last stage: 4 MB of weights at 7x7
    ((256, 1024, 14, 1), True),   # 1 MB at 14x14
    ((256, 256, 14, 3), True),
    ((512, 512, 28, 3), False),   # 784 positions: a block's weights serve many tiles
    ((64, 64, 56, 3), False),
    ((32, 32, 7, 3), False),      # 36 KB of weights: they stay in cache
])
def test_weight_prefetch_rule(shape: tuple[int, int, int, int], prefetched: bool) -> None:
    from kiln.kernels.conv.direct import prefetches_weights

    ci, co, hw, k = shape
    conv = ConvShape(1, ci, hw, hw, co, k, k, (1, 1), (1, 1), (k // 2,) * 4)
    for spec in ("llvm -mcpu=znver4", "llvm -mcpu=znver3", "llvm -mtriple=aarch64-linux-gnu"):
        isa = isa_for(Target(spec))
        tiling = choose_tiling(conv, tile_lanes(isa), isa.vector_registers)
        assert prefetches_weights(conv, tiling, isa) == prefetched, spec
    # a microcontroller has no L2 (nor a cache to fill)
    m4 = isa_for(Target("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"))
    assert not prefetches_weights(conv, Tiling(cb=4, tile_w=6), m4)


@pytest.mark.parametrize(("shape", "band"), [
    ((128, 128, 56, 3, 2), 14),   # 1.7 MB padded input; 7 input rows (3 output rows)
    ((64, 128, 56, 3, 2), 37),    # ResNet-18's: 8 output rows of 28 in tiles of 6
    ((256, 256, 28, 3, 2), 7),
    ((128, 256, 28, 3, 2), 0),    # 460 KB: within the L2
    ((64, 64, 56, 3, 1), 0),      # stride 1
    ((512, 1024, 28, 1, 2), 0),   # a strided 1x1: subsampled, it runs at stride 1
    ((128, 16, 56, 3, 2), 0),     # one block of output channels
])
def test_band_rule_on_avx2(shape: tuple[int, int, int, int, int], band: int) -> None:
    from kiln.kernels.conv.direct import band_tiles

    ci, co, hw, k, stride = shape
    pads = (0,) * 4 if k == 1 else (k // 2,) * 4
    conv = ConvShape(1, ci, hw, hw, co, k, k, (stride, stride), (1, 1), pads)
    isa = isa_for(Target("llvm -mcpu=znver3"))
    assert band_tiles(conv, choose_tiling(conv, tile_lanes(isa), isa.vector_registers),
                      isa) == band
    # the AVX-512 kernel keeps its order (not measured there)
    avx512 = isa_for(Target("llvm -mcpu=znver4"))
    assert band_tiles(conv, choose_tiling(conv, 16, 32), avx512) == 0


@pytest.mark.parametrize(("spec", "subsampled"), [
    ("llvm -mcpu=znver3", True), ("llvm -mcpu=haswell", True),
    ("llvm -mcpu=znver4", False),  # AVX-512: read in place, as measured on Zen 5
])
def test_strided_pointwise_layers_are_subsampled_on_avx2(spec: str, subsampled: bool) -> None:
    # compiled only (the AVX-512 target need not run here); the values are checked on
    # the host by test_matches_onnxruntime (its strided 1x1 case) and the K-blocked cases
    case = dict(x=(1, 8, 14, 14), co=40, k=1, strides=(2, 2), pads=(0, 0, 0, 0),
                tail=("Relu",))
    model = model_of([case])
    ex = kiln.compile(from_onnx(model), Target(spec))
    (conv,) = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_blocked"]
    assert ("xsub" in print_module_text(conv)) == subsampled


@pytest.mark.parametrize(("shape", "spec", "subsampled"), [
    ((512, 28), "llvm -mcpu=znver4", True),    # 1.6 MB of input: past the 1 MiB L2
    ((1024, 14), "llvm -mcpu=znver4", False),  # 0.8 MB
    ((1024, 14), "llvm -mcpu=znver3", True),   # 256-bit vectors: always
    ((64, 14), "llvm -mcpu=znver3", True),
])
def test_subsampling_rule(shape: tuple[int, int], spec: str, subsampled: bool) -> None:
    from kiln.kernels.conv.direct import subsamples_input

    ci, hw = shape
    conv = ConvShape(1, ci, hw, hw, 2 * ci, 1, 1, (2, 2), (1, 1), (0,) * 4)
    assert subsamples_input(conv, isa_for(Target(spec))) == subsampled
