"""The dot-form convolution's two register tiles (kiln/kernels/int8/conv_dot.py): output
positions as the vector lanes, or, where the positions fill the vectors badly (7 x 7,
14 x 14 images), output channels. The channels-as-lanes tile is chosen by rule from the
shapes and packs the weight in panels; its outputs equal onnxruntime's for QDQ
convolutions with per-channel and per-tensor weights, u8 and s8 activations and a fused
ReLU, on the host's VNNI, on the `vpmaddwd` path (VNNI hidden by mattr) and on the c
backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from quantized_models import qlinear_conv_model
from test_dot_gemm import host_runs

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.tensor import For, PrimFunc
from kiln.ir.visitor import iter_stmts
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_input import spread
from kiln.kernels.int8.conv_tile import choose_tile, narrows_by_packs, position_rows
from kiln.ops.quant_conv_words import CONV_DOT
from kiln.ops.quant_words import unpacked_weight, weight_panels
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import ort_session

# VNNI (zmm), `vpmaddwd` on AVX-512BW (VNNI hidden) and on AVX2 (16 ymm registers: other
# tile shapes), the c backend
TARGETS = ["llvm -mcpu=znver4", "llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni",
           "llvm -mcpu=haswell", "c -mcpu=znver4"]


# (name, input shape [C, H, W], output channels, kernel, stride, per-channel weights,
# s8 activations, ReLU): 7 x 7 and 14 x 14 outputs; 120 channels leave the last panel
# of 64 partial, 7 x 7 = 49 positions a partial row tile of most row counts. Per-channel layers
# are QDQ convolutions; the per-tensor one a QLinearConv (onnxruntime's QDQ run of
# per-tensor weights rounds a few outputs one quantum apart from its QLinearConv, with
# either of kiln's tiles)
LAYERS = [("a", (64, 7, 7), 120, 3, 1, True, False, True),
          ("b", (256, 28, 28), 128, 3, 2, True, True, True),
          ("c", (512, 7, 7), 64, 1, 1, False, True, False)]
# and on the positions tile on every target (18 x 18 = 324 positions: a partial last
# column tile of 48 lanes; 40 channels a partial row tile of 7 rows): its requantizing
# store rows (select clamp, row parameters in registers); strided, the phase planes
# packed per output row (3x3/2, odd input) and in the output's grid (1x1/2). With VNNI,
# layers whose channels fill words take k = (tap, channel) (`tap_major`): "g" (62 x 62,
# rows of 64 grid columns) reads its input words in place, "h" (6 channels) keeps k =
# (channel, tap)
POSITION_LAYERS = [("d", (16, 18, 18), 40, 3, 1, True, False, True),
                   ("e", (8, 35, 35), 40, 3, 2, True, True, False),
                   ("f", (16, 36, 36), 24, 1, 2, True, False, True),
                   ("g", (16, 62, 62), 32, 3, 1, True, False, True),
                   ("h", (6, 20, 20), 24, 3, 1, True, True, False)]


def qdq_convs(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One graph of the LAYERS (each x -> Q -> DQ -> Conv(DQ(w), DQ(b)) [-> Relu] -> Q ->
    DQ, the QDQ form onnxruntime's quantizer writes, or x -> Q -> QLinearConv), returning
    the (de)quantized outputs; and float inputs for it."""
    b = GraphBuilder()
    feeds = {}
    for name, (c, h, w), oc, k, stride, per_channel, signed, relu in LAYERS + POSITION_LAYERS:
        q = np.int8 if signed else np.uint8
        scales = (rng.uniform(0.004, 0.012, oc) if per_channel else
                  np.full(oc, 0.008)).astype(np.float32)
        ws = scales if per_channel else scales[:1].reshape(())
        b.consts({f"xs{name}": np.float32(0.02), f"xz{name}": q(-3 if signed else 120),
                  f"w{name}": rng.integers(-128, 128, (oc, c, k, k)).astype(np.int8),
                  f"ws{name}": ws, f"wz{name}": np.zeros(ws.shape, np.int8),
                  f"b{name}": rng.integers(-4000, 4000, oc).astype(np.int32),
                  f"bs{name}": (np.float32(0.02) * ws).astype(np.float32),
                  f"bz{name}": np.zeros(ws.shape, np.int32),
                  f"ys{name}": np.float32(0.02 * 0.008 * np.sqrt(c * k * k) * 20),
                  f"yz{name}": q(5 if signed else 100)})
        conv = {"pads": [k // 2] * 4, "strides": [stride] * 2}
        b.node("QuantizeLinear", [f"x{name}", f"xs{name}", f"xz{name}"], [f"xq{name}"])
        if not per_channel:
            b.node("QLinearConv", [f"xq{name}", *(f"{v}{name}" for v in (
                "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"))], [f"y{name}"], **conv)
        else:
            b.node("DequantizeLinear", [f"xq{name}", f"xs{name}", f"xz{name}"],
                   [f"xf{name}"])
            for v in ("w", "b"):
                b.node("DequantizeLinear", [f"{v}{name}", f"{v}s{name}", f"{v}z{name}"],
                       [f"{v}f{name}"], axis=0)
            b.node("Conv", [f"xf{name}", f"wf{name}", f"bf{name}"], [f"c{name}"], **conv)
            if relu:
                b.node("Relu", [f"c{name}"], [f"r{name}"])
            b.node("QuantizeLinear", [f"r{name}" if relu else f"c{name}", f"ys{name}",
                                      f"yz{name}"], [f"q{name}"])
            # dequantized, as a model goes on: onnxruntime runs an int8 pair read by one
            # DequantizeLinear as uint8 and fuses the group (kiln.ops.quant_ort)
            b.node("DequantizeLinear", [f"q{name}", f"ys{name}", f"yz{name}"], [f"y{name}"])
        b.input(f"x{name}", [1, c, h, w])
        out = (h + 2 * (k // 2) - k) // stride + 1
        b.output(f"y{name}", [1, oc, out, out], TensorProto.FLOAT if per_channel
                 else TensorProto.INT8 if signed else TensorProto.UINT8)
        feeds[f"x{name}"] = rng.uniform(-2.5, 2.5, (1, c, h, w)).astype(np.float32)
    return b.model(opset=13), feeds


@pytest.fixture(scope="module")
def model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    onnx_model, feeds = qdq_convs(np.random.default_rng(24))
    return onnx_model, feeds, ort_session(onnx_model).run(None, feeds)


def _packed_convs(onnx_model: onnx.ModelProto, target: str) -> list[g.Call]:
    """The dot-form convolutions `target` packs, in the graph's order."""
    with Target(target):
        mod = QuantizeOps()(from_onnx(onnx_model))
    return [b.value for b in mod["main"].bindings
            if isinstance(b.value, g.Call) and b.value.op == "qlinear_conv_dot"]


def _packed_weights(onnx_model: onnx.ModelProto, target: str) -> list[np.ndarray]:
    """The weight constants of the dot-form convolutions `target` packs."""
    weights = [c.args[1] for c in _packed_convs(onnx_model, target)]
    assert all(isinstance(w, g.Constant) for w in weights)
    return [np.asarray(w.data) for w in weights]  # type: ignore[union-attr]


@pytest.mark.parametrize("target", TARGETS)
def test_channel_tiles_equal_onnxruntime(
        target: str, model: tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]
) -> None:
    onnx_model, feeds, want = model
    with Target(target):  # the tile planning ISA (int16 pairs without VNNI)
        isa = dot.target_isa(isa_for(None))
    assert isa is not None and isa.vector_bits >= 256
    # the layers the rule puts on the channels-as-lanes tile for this target (all of
    # them with zmm registers; AVX2's 16 ymm keep 14 x 14 on the positions tile) have
    # their weights packed in panels ([panels][K / 4][nr] words, K / 2 without VNNI),
    # the others in words
    chosen = [choose_tile(isa, ((h + 2 * (k // 2) - k) // stride + 1) ** 2, oc,
                          c * k * k).channels_as_lanes
              for _, (c, h, _), oc, k, stride, *_ in LAYERS + POSITION_LAYERS]
    assert sum(chosen[:len(LAYERS)]) >= (len(LAYERS) if isa.vector_bits == 512 else 1)
    assert not any(chosen[len(LAYERS):])
    weights = _packed_weights(onnx_model, target)
    assert [w.ndim == 3 for w in weights] == chosen
    if not host_runs(target):
        pytest.skip(f"this host lacks {target}'s features")
    ex = kiln.compile(from_onnx(onnx_model), target)
    got = ex["main"](*feeds.values())
    for (name, *_), y, y_want in zip(LAYERS + POSITION_LAYERS, got, want, strict=True):
        np.testing.assert_array_equal(y, y_want, err_msg=f"layer {name} on {target}")


@pytest.mark.parametrize("target", [*TARGETS, "llvm -mcpu=znver3 -int8-pairs=saturate"])
def test_exact_products_take_k_by_tap_where_channels_fill_words(
        target: str, model: tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]
) -> None:
    """With VNNI, a layer of more than one tap whose input channels are a multiple of 4
    packs k = (tap, channel) (`tap_major`): each im2col word is then 4 channels of one
    tap, a word of the input copied once as words (or read in place). 1x1 layers, 6
    input channels and the int16-pair targets keep k = (channel, tap); saturating pairs
    take (tap, channel) as onnxruntime's order (`pairs`), not as this choice. The
    outputs of all of them: test_channel_tiles_equal_onnxruntime."""
    with Target(target):
        isa = dot.target_isa(isa_for(None), dot.target_saturates(isa_for(None)))
    assert isa is not None
    exact = isa.int8_dot in dot.EXACT_FAMILIES and "saturate" not in target
    convs = _packed_convs(model[0], target)
    layers = LAYERS + POSITION_LAYERS
    assert len(convs) == len(layers)
    for call, (name, (c, *_), _, k, *_) in zip(convs, layers, strict=True):
        want = exact and k > 1 and c % 4 == 0
        assert call.attrs.get("tap_major", False) is want, (name, target)


def test_rule_keeps_position_tiles_where_positions_fill_the_lanes() -> None:
    isa = isa_for(Target("llvm -mcpu=znver4"))
    # 56 x 56 = 3136 positions: 98 whole tiles of 32 lanes
    assert not choose_tile(isa, 56 * 56, 256, 64).channels_as_lanes
    # 7 x 7 = 49 positions padded to 64 lanes: a quarter of the work wasted otherwise
    tile = choose_tile(isa, 7 * 7, 512, 512 * 9)
    assert tile.channels_as_lanes and tile.cols % isa.lanes("int32") == 0
    # fewer channels than one vector: positions stay the lanes
    assert not choose_tile(isa, 7 * 7, 8, 512).channels_as_lanes


def test_saturating_pairs_on_16_registers_leave_the_epilogue_a_row() -> None:
    """The positions tile of `int8-pairs=saturate` on AVX2 takes a row fewer than the
    registers hold (4 of 2 vectors: whole tiles of 2^n channels, and room for the
    requantizing epilogue); VNNI, AVX-512 and the int16 pairs keep every row."""
    for target, saturate, fewer in (("llvm -mcpu=znver3", True, True),
                                    ("llvm -mcpu=znver3", False, False),
                                    ("llvm -mcpu=znver4", False, False),
                                    ("llvm -mcpu=skylake-avx512", True, False)):
        with Target(target):
            isa = dot.target_isa(isa_for(None), saturate)
        assert isa is not None
        nr = dot.tile_cols_for(isa, 56 * 56)
        top = dot.tile_rows(isa, nr)
        assert position_rows(isa, nr, 256) == top - fewer, target
        assert position_rows(isa, nr, 2) == 2
        assert not choose_tile(isa, 56 * 56, 256, 64).channels_as_lanes
        assert choose_tile(isa, 56 * 56, 256, 64).rows == top - fewer, target


def test_planes_read_in_place_do_not_start_two_cache_lines_apart() -> None:
    """The channels tile broadcasts one word of each channel word's plane in turn: a
    plane pitch that is a multiple of 128 bytes (16 x 16 words: a 14 x 14 image padded by
    one) grows by a row, 4 phase planes of 8-word rows by a column and a row; pitches
    off that grid stay."""
    assert spread((16, 16), 1) == (17, 16)
    assert spread((8, 8), 4) == (9, 9)
    assert spread((9, 9), 1) == (9, 9)
    assert spread((15, 15), 4) == (15, 15)
    for extents, planes in (((16, 16), 1), ((8, 8), 4), ((7, 32), 1), ((4, 4), 8)):
        rows, cols = spread(extents, planes)
        assert rows >= extents[0] and cols >= extents[1]
        assert planes * rows * cols * 4 % 128


def test_positions_tiles_narrow_by_packs_on_x86_up_to_avx2() -> None:
    """The integer clamp that lets LLVM narrow with saturating packs pays on AVX2 and not
    with AVX-512's `vpmovdb` (kiln.kernels.int8.conv_tile.narrows_by_packs); the saturating
    AVX2 build's positions tile then packs without masking its lanes."""
    assert narrows_by_packs(isa_for(Target("llvm -mcpu=haswell")))
    assert narrows_by_packs(isa_for(Target("llvm -mcpu=znver3")))
    assert not narrows_by_packs(isa_for(Target("llvm -mcpu=znver4")))
    assert not narrows_by_packs(isa_for(Target("llvm -mtriple=aarch64-linux-gnu")))


def test_weight_panels_round_trip() -> None:
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (40, 3, 3, 3)).astype(np.int8)  # K = 27: a partial word
    panels = weight_panels(w, 32)
    assert panels.shape == (2, 7, 32) and panels.dtype == np.int32
    np.testing.assert_array_equal(unpacked_weight(panels, w.shape), w)


def test_channel_tiles_of_a_dilated_unevenly_padded_convolution() -> None:
    # 7 x 7 outputs read at dilation 2 through pads (top 2, left 0, bottom 1, right 3):
    # the words packed in the padded input grid, read at each position's place in it
    target = "llvm -mcpu=znver4"
    if not host_runs(target):
        pytest.skip(f"this host lacks {target}'s features")
    assert choose_tile(isa_for(Target(target)), 49, 120, 64 * 9).channels_as_lanes
    rng = np.random.default_rng(7)
    model = qlinear_conv_model((1, 64, 8, 8), 120, 3, 1, (2, 0, 1, 3), False, rng, dilation=2)
    x = rng.integers(0, 256, (1, 64, 8, 8)).astype(np.uint8)
    got = kiln.compile(from_onnx(model), target)["main"](x)
    np.testing.assert_array_equal(got, ort_session(model).run(None, {"x": x})[0])


@pytest.mark.parametrize(("shape", "oc"), [((1, 960, 7, 7), 320), ((1, 64, 14, 14), 384)])
def test_tiles_run_in_one_parallel_loop_over_both_tile_dimensions(
        shape: tuple[int, int, int, int], oc: int) -> None:
    """A layer with few tiles in one dimension (960>320 @7: 5 weight panels of 64
    channels; 64>384 @14: 5 column tiles of 48 positions, the last narrowed to the one
    vector its 4 positions fill) runs all its tiles in one parallel loop (panels or
    columns x the other dimension), not a loop over the few alone (3 and 2 panels on two
    threads); two threads give onnxruntime's output."""
    target = "llvm -mcpu=znver4"
    isa = isa_for(Target(target))
    positions = shape[2] * shape[3]
    tile = choose_tile(isa, positions, oc, shape[1])
    if tile.channels_as_lanes:
        outer, inner = -(-oc // tile.cols), -(-positions // tile.rows)
    else:
        outer, inner = -(-positions // tile.cols), -(-oc // tile.rows)
    assert outer < 16 < outer * inner
    rng = np.random.default_rng(3)
    model = qlinear_conv_model(shape, oc, 1, 1, 0, False, rng)
    ex = kiln.compile(from_onnx(model), target)
    (fn,) = [f for name, f in ex.ir.functions.items()
             if isinstance(f, PrimFunc) and name.startswith(CONV_DOT)]
    extents = [s.extent.value for s in iter_stmts(fn.body)  # type: ignore[attr-defined]
               if isinstance(s, For) and s.kind == "parallel"]
    assert outer * inner in extents and outer not in extents
    if not host_runs(target):
        pytest.skip(f"this host lacks {target}'s features")
    x = rng.integers(0, 256, shape).astype(np.uint8)
    lib = ex.jit()
    lib.set_num_threads(2)
    np.testing.assert_array_equal(lib["main"](x), ort_session(model).run(None, {"x": x})[0])
