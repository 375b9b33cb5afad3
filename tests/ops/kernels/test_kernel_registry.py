"""The kernel registry (kiln.kernels): every family selected through it, built on
llvm and c and compared with numpy; the tile chosen once at the pass, recorded in
the call, round-tripped through the DSL, checked by verification and read (not
chosen again) by lowering."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import IRError, KilnError
from kiln.frontend import from_onnx
from kiln.ir import IRModule, assert_structural_equal
from kiln.ir import graph as g
from kiln.ir.tensor import Allocate, PrimFunc
from kiln.ir.types import TensorType
from kiln.ir.visitor import iter_stmts
from kiln.kernels.registry import KERNELS, families, family_of, select
from kiln.ops.registry import call
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform import get_pass
from support.graphs import GraphBuilder

RNG = np.random.default_rng(25)
F = TensorProto.FLOAT
W = {
    "gemv": RNG.standard_normal((16, 8)).astype(np.float32),      # Gemm(transB) at batch 1
    "gemm": RNG.standard_normal((12, 20)).astype(np.float32),     # MatMul by a constant
    "dw": RNG.standard_normal((4, 1, 3, 3)).astype(np.float32),   # depthwise 3x3
    "rows": RNG.standard_normal((5, 3, 1, 1)).astype(np.float32),  # 1x1 over a row of 17
    "pw": RNG.standard_normal((5, 6, 1, 1)).astype(np.float32),   # 1x1 on 64 positions
    "grp": RNG.standard_normal((6, 2, 1, 1)).astype(np.float32),  # 1x1 in 3 groups
    "direct": RNG.standard_normal((7, 4, 1, 1)).astype(np.float32),  # 1x1/2, alone
    # three chained 1x1/2 convs: an NCHWc region (more convolutions than reorders)
    "nc1": RNG.standard_normal((16, 8, 1, 1)).astype(np.float32),
    "nc2": RNG.standard_normal((16, 16, 1, 1)).astype(np.float32),
    "nc3": RNG.standard_normal((16, 16, 1, 1)).astype(np.float32),
    # Winograd: a 3x3 layer of 64 channels alone (NCHW), and two in an NCHWc region
    # around a 5x5 layer (three convolutions, two reorders)
    "wino": RNG.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1,
    "wn1": RNG.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1,
    "wn2": RNG.standard_normal((64, 64, 5, 5)).astype(np.float32) * 0.05,
    "wn3": RNG.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1,
}
INPUTS = {"x_gemv": (1, 8), "x_gemm": (5, 12), "x_ta": (2, 6, 7), "x_tb": (2, 7, 9),
          "x_dw": (1, 4, 10, 10), "x_rows": (1, 3, 1, 17), "x_pw": (1, 6, 4, 16),
          "x_grp": (1, 6, 4, 16), "x_direct": (1, 4, 6, 6), "x_nc": (1, 8, 22, 22),
          "x_wino": (1, 64, 8, 9), "x_wn": (1, 64, 9, 8)}


def _model() -> onnx.ModelProto:
    pad, s2 = {"pads": [1, 1, 1, 1]}, {"strides": [2, 2]}
    b = GraphBuilder()
    b.node("Gemm", ["x_gemv", "gemv"], ["y_gemv"], transB=1)
    b.node("MatMul", ["x_gemm", "gemm"], ["y_gemm"])
    b.node("MatMul", ["x_ta", "x_tb"], ["y_tiled"])
    b.node("Conv", ["x_dw", "dw"], ["y_dw"], group=4, **pad)
    b.node("Conv", ["x_rows", "rows"], ["y_rows"])
    b.node("Conv", ["x_pw", "pw"], ["y_pw"])
    b.node("Conv", ["x_grp", "grp"], ["y_grp"], group=3)
    b.node("Conv", ["x_direct", "direct"], ["y_direct"], **s2)
    b.node("Conv", ["x_nc", "nc1"], ["h_nc"], **s2)
    b.node("Relu", ["h_nc"], ["r_nc"])
    b.node("Conv", ["r_nc", "nc2"], ["h2_nc"], **s2)
    b.node("Conv", ["h2_nc", "nc3"], ["y_nc"], **s2)
    b.node("Conv", ["x_wino", "wino"], ["y_wino"], **pad)
    b.node("Conv", ["x_wn", "wn1"], ["h_wn"], **pad)
    b.node("Conv", ["h_wn", "wn2"], ["h2_wn"], pads=[2, 2, 2, 2])
    b.node("Conv", ["h2_wn", "wn3"], ["y_wn"], **pad)
    for n in b.nodes:
        if n.output[0].startswith("y_"):
            b.output(n.output[0])
    for k, v in INPUTS.items():
        b.input(k, list(v))
    b.consts(W)
    return b.model(name="families", check=False)


def _conv(x: np.ndarray, w: np.ndarray, group: int = 1, pad: int = 0,
          stride: int = 1) -> np.ndarray:
    """NCHW x OIHW, symmetric `pad` (numpy, float64)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    co, cig, kh, kw = w.shape
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    out = np.zeros((x.shape[0], co, oh, ow))
    cog = co // group
    for o in range(co):
        xs = x[:, o // cog * cig:(o // cog + 1) * cig]
        for i in range(kh):
            for j in range(kw):
                out[:, o] += np.einsum("nchw,c->nhw", xs[:, :, i:i + oh, j:j + ow],
                                       w[o, :, i, j])
    return out[:, :, ::stride, ::stride]


def _reference(f: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [f["x_gemv"] @ W["gemv"].T.astype(np.float64), f["x_gemm"] @ W["gemm"],
            f["x_ta"] @ f["x_tb"], _conv(f["x_dw"], W["dw"], group=4, pad=1),
            _conv(f["x_rows"], W["rows"]), _conv(f["x_pw"], W["pw"]),
            _conv(f["x_grp"], W["grp"], group=3),
            _conv(f["x_direct"], W["direct"], stride=2),
            _conv(_conv(np.maximum(_conv(f["x_nc"], W["nc1"], stride=2), 0), W["nc2"],
                        stride=2), W["nc3"], stride=2),
            _conv(f["x_wino"], W["wino"], pad=1),
            _conv(_conv(_conv(f["x_wn"], W["wn1"], pad=1), W["wn2"], pad=2), W["wn3"], pad=1)]


MODEL = _model()
FEEDS = {k: RNG.standard_normal(v).astype(np.float32) for k, v in INPUTS.items()}


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_every_family_through_the_registry_matches_numpy(target: str) -> None:
    ex = kiln.compile(from_onnx(MODEL), target, graph_pipeline="nchwc")
    built = {f.attrs.get("kiln.gemm_kernel") or f.attrs.get("kiln.conv_kernel")
             for f in ex.ir.functions.values() if isinstance(f, PrimFunc)}
    # every float family the rule picks (the int8 ones: tests/quantization; the bf16
    # GEMMs of `precision=bf16` targets: tests/ops/kernels/test_gemm_bf16.py; the f16 one
    # of `precision=f16`: test_gemm_f16.py)
    assert {f.op for f in families() if set(f.sources) & {"matmul", "conv2d"}
            and f.name not in ("gemm_bf16", "gemm_tiled_bf16", "gemm_f16")} <= built
    got = ex(*FEEDS.values())
    for k, (a, b) in enumerate(zip(got, _reference(FEEDS))):
        # Winograd's sums round differently: within 1e-5 of the output's magnitude
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(b).max()),
                                   err_msg=str(k))


def _blocked(spec: str) -> Any:
    with Target(spec):
        mod = from_onnx(MODEL)
        for p in ("block-convolutions", "block-matmuls", "nchwc-layout"):
            mod = get_pass(p)(mod)
    return mod


def _tiles(mod: Any) -> dict[str, set[tuple[int, ...]]]:
    tiles: dict[str, set[tuple[int, ...]]] = {}
    for b in mod["main"].bindings:
        if isinstance(b.value, g.Call) and "tile" in b.value.attrs:
            tiles.setdefault(b.value.op, set()).add(b.value.attrs["tile"])
    return tiles


@pytest.mark.parametrize(("spec", "tiles"), [
    # AVX2: 8 float32 lanes, 16 registers
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell",
     {"matmul_gemv": {(4, 16)}, "matmul_packed": {(5, 16)}, "matmul_tiled": {(6, 16)},
      "conv2d_depthwise": {(8, 8)}, "conv2d_rows": {(6, 16, 8)}, "conv2d_blocked": {(8, 5)},
      "conv2d_nchwc": {(16, 5), (16, 6)}, "conv2d_gemm": {(5, 16)},
      "conv2d_group_gemm": {(2, 32)}, "conv2d_winograd": {(4, 6, 8)},
      "conv2d_winograd_nchwc": {(4, 6, 16)}}),
    # AVX-512: 16 lanes, 32 registers (taller GEMM tiles, whole 10-wide depthwise rows)
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4",
     {"matmul_gemv": {(4, 32)}, "matmul_packed": {(5, 32)}, "matmul_tiled": {(6, 16)},
      "conv2d_depthwise": {(10, 16)}, "conv2d_rows": {(6, 16, 16)},
      # one-vector 1x1 tiles below 112x112 take up to 12 positions (`position_cap`)
      "conv2d_blocked": {(16, 5)}, "conv2d_nchwc": {(32, 6), (16, 9), (16, 11), (16, 12)},
      "conv2d_gemm": {(5, 32)}, "conv2d_group_gemm": {(2, 64)},
      "conv2d_winograd": {(2, 8, 32)}, "conv2d_winograd_nchwc": {(2, 8, 32)}}),
    # NEON: 4 lanes, 32 registers
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1",
     {"matmul_gemv": {(4, 8)}, "matmul_packed": {(5, 8)}, "matmul_tiled": {(6, 8)},
      "conv2d_depthwise": {(8, 4)}, "conv2d_rows": {(6, 8, 4)}, "conv2d_blocked": {(8, 5)},
      "conv2d_nchwc": {(8, 5), (8, 6)}, "conv2d_gemm": {(5, 8)},
      "conv2d_group_gemm": {(2, 16)}, "conv2d_winograd": {(4, 8, 8)},
      "conv2d_winograd_nchwc": {(4, 6, 8)}}),
])
def test_the_tile_is_recorded_and_round_trips(spec: str, tiles: dict[str, Any]) -> None:
    mod = _blocked(spec)
    assert _tiles(mod) == tiles
    assert_structural_equal(from_source(print_module(mod)), mod)


def test_lowering_reads_the_recorded_tile() -> None:
    a = g.Var("a", TensorType((2, 6, 7), "float32"))
    b = g.Var("b", TensorType((2, 7, 9), "float32"))
    for tile in ((3, 8), (2, 16)):
        c = call("matmul_tiled", a, b, tile=tile)
        y = g.Var("y", c.ret_type)
        mod = get_pass("legalize-ops")(IRModule({"main": g.Function((a, b), (g.Binding(y, c),),
                                                                    y)}))
        accs = {s.buffer.shape for f in mod.functions.values() if isinstance(f, PrimFunc)
                for s in iter_stmts(f.body) if isinstance(s, Allocate) and s.buffer.name == "acc"}
        assert accs == {tile}


def test_verification_refuses_a_tile_the_packing_does_not_hold() -> None:
    a = g.Var("a", TensorType((5, 12), "float32"))
    bp = g.Constant(np.zeros((3, 12, 8), np.float32), "bp")
    call("matmul_packed", a, bp, n=20, tile=(5, 8))
    with pytest.raises(IRError, match="tile"):
        call("matmul_packed", a, bp, n=20, tile=(5, 16))
    with pytest.raises(IRError, match="tile"):
        call("matmul_packed", a, bp, n=20, tile=(5, 0))
    with pytest.raises(IRError, match="tile"):
        call("matmul_tiled", a, g.Var("b", TensorType((12, 3), "float32")), tile=(4,))


def test_registry_names_every_family_once() -> None:
    assert KERNELS.names() == sorted(f.name for f in families())
    assert len({f.op for f in families()}) == len(KERNELS)
    with pytest.raises(KilnError, match="conv3d"):
        family_of("conv3d")


@pytest.mark.parametrize("ci, width, family", [
    (64, 14, "conv_direct"),  # 14 columns fill 2 vectors of 8 to 88%: blocked
    (16, 14, "conv_rows"),    # a short sum keeps the row tiles
    (64, 16, "conv_rows"),    # rows of whole vectors
])
def test_pointwise_rows_that_leave_lanes_empty_go_to_the_blocked_kernel(
        ci: int, width: int, family: str) -> None:
    isa = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"))
    x = g.Var("x", TensorType((1, ci, 1, width), "float32"))
    w = g.Constant(RNG.standard_normal((8, ci, 1, 1)).astype(np.float32), "w")
    picked = select(call("conv2d", x, w), isa)
    assert picked is not None and picked.name == family


@pytest.mark.parametrize("cpu, ci, co, width, family", [
    # AVX-512: rows of 54 fill 4 vectors of 16 to 84%; 288 taps pay the blocked stores
    ("znver4", 32, 128, 54, "conv_direct"),
    ("znver4", 32, 128, 26, "conv_direct"),
    ("znver4", 16, 64, 54, "conv_rows"),     # 144 taps: the blocked stores cost more
    ("znver4", 32, 32, 32, "conv_rows"),     # rows of whole vectors
    ("znver4", 24, 48, 28, "conv_rows"),     # the blocked tiles of 32 compute 64 channels
    # AVX2: rows of 54 fill 7 vectors of 8 to 96%
    ("znver3", 16, 64, 54, "conv_rows"),
    ("znver3", 32, 128, 54, "conv_direct"),
    ("znver3", 24, 48, 28, "conv_direct"),   # 16-channel blocks: no surplus
    ("znver3", 32, 32, 32, "conv_rows"),
    ("znver3", 8, 32, 26, "conv_rows"),      # too few input channels to be measured
])
def test_short_3x3_sums_whose_rows_leave_lanes_empty_go_to_the_blocked_kernel(
        cpu: str, ci: int, co: int, width: int, family: str) -> None:
    # Winograd off: the choice between the direct families (Winograd takes these layers
    # where the target allows it, tests/ops/test_conv_winograd.py)
    isa = isa_for(Target(f"llvm -mtriple=x86_64-linux-gnu -mcpu={cpu}").with_attrs(
        winograd=False))
    x = g.Var("x", TensorType((1, ci, width, width), "float32"))
    w = g.Constant(RNG.standard_normal((co, ci, 3, 3)).astype(np.float32), "w")
    picked = select(call("conv2d", x, w, pads=(1, 1, 1, 1)), isa)
    assert picked is not None and picked.name == family
