"""`qlinear_conv_dot`: a 2-D int8 convolution on the dot-product form (quant_dot).

`quant_kernels.pack` gives a `qlinear_conv` with int8 weights and one group this form
on targets with a dot-product family. The weight `[OC][C][KH][KW]` (shifted by its zero
point) is flattened to `[OC][K]`, K = C KH KW, and packed in words of 4 k at compile
time: `w_words [OC][ceil(K / 4)]` int32, attribute `w_shape`. At run time the input is
packed into words of the same k for every output position (`[N][ceil(K / 4)][P]`, P the
output positions padded to whole column tiles): the input rows of an im2col, 4 k to a
word, read with the zero point where the convolution is padded (shifted to unsigned bytes
like A in quant_dot). The register tile is rows of output channels (a broadcast weight
word each) x `nr` output positions (vectors of input words), one `dot4_u8s8` per
accumulator and word; stores are contiguous along the output row, requantized in the
epilogue (bias with the zero-point correction, per-channel multiplier, range).

Where the output positions fill the vectors badly (7 x 7 = 49 positions in 64 lanes) the
tile is transposed (`choose_tile`): output channels are the lanes and output positions
the rows (a broadcast input word each), as in a matrix product whose B is the weight.
The weight is then packed in panels of the tile's channels, `w_words
[ceil(OC / nr)][ceil(K / 4)][nr]` (`weight_panels`), and the requantization takes its
per-channel multiplier along the lanes. That tile's input words are packed at each
output position's place in the padded input grid (`_tiles`), one contiguous loop per word
group; a strided convolution reads its input split into phase planes (`_PhasePlanes`),
where its taps read contiguously as a stride-1 convolution's do.

Without VNNI (AVX2, AVX-512BW: `quant_dot.PAIRS16`) the words hold 2 k as int16 halves
(attribute `k_group=2`: `[OC][ceil(K / 2)]`), the im2col writes its words the same way
and the tile step is `dot2_i16`.

With `int8-pairs=saturate` (k = (tap, c)) and C a multiple of 4, every im2col word is 4
channels of one tap: the input is copied once as such words (`_padded_words`) and the
im2col copies whole words; a stride-1 convolution on an image wide enough reads them in
place instead (`_in_place`: no im2col, grid positions as the tile's lanes).

Between such convolutions the activations may be kept as those words (WORDS_LAYOUT,
`NCHW4c`: attributes `in_layout` / `out_layout`, chosen by kiln.transform.quant_layout):
the input is then read as words where it needs no padding (1x1 layers: no im2col at all)
and copied word by word where it does; each 4 rows of a positions tile store one word
per position, and a channels tile's rows are words of 4 channels already.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    DOT4_U8S8,
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    IfThenElse,
    Intrin,
    PrimExpr,
    PrimFunc,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.ir.types import TensorType, Type
from kiln.kernels.int8 import dot as quant_dot
from kiln.ops import te
from kiln.ops.kernels.parallel_work import worth_parallel
from kiln.ops.kernels.tiles import lanes_loop, nest, parallel_tiles
from kiln.ops.kernels.tiles import loop as tile_loop
from kiln.ops.layout import block_shape, blocked_layout, from_blocked, reorder, to_blocked
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import (
    channel,
    check_requant,
    conv_int_shape,
    out_range,
    requantize_value,
)
from kiln.ops.registry import OPS, HandBuiltOp
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
CONV_DOT = "qlinear_conv_dot"
#: The activation layout of int8 convolution chains (kiln.transform.quant_layout): NCHW
#: with 4 channels to a word, `[N][C / 4][H][W][4]` bytes, the unit the dot form's input
#: word holds (k = (tap, c)): read in place, no byte gather from 4 channel planes.
WORDS_LAYOUT = blocked_layout(quant_dot.GROUP)
#: Column tiles that keep the threads busy; with fewer, row tiles (channels) run in parallel.
PARALLEL_TILES = 8


def k_order(wp: np.ndarray, tap_major: bool) -> np.ndarray:
    """The weight `[OC][C][taps...]` as `[OC][K]`: k = (c, tap), or with `tap_major`
    k = (tap, c), the order of onnxruntime's NHWC im2col and of its symmetric
    convolution kernel (MLAS packs 4 channels of one tap to a word), whose pairs
    `int8-pairs=saturate` reproduces."""
    w = np.asarray(wp)
    if tap_major:
        w = np.moveaxis(w, 1, -1)
    return w.reshape(w.shape[0], -1)


def weight_words(wp: np.ndarray, tap_major: bool = False,
                 group: int = quant_dot.GROUP) -> np.ndarray:
    """The shifted int8 weight `[OC][C][...]` as words `[OC][ceil(K / group)]` (k in the
    order of `k_order`; `quant_dot.words`)."""
    return np.ascontiguousarray(quant_dot.words(k_order(wp, tap_major).T, group).T)


def weight_panels(wp: np.ndarray, nr: int, tap_major: bool = False,
                  group: int = quant_dot.GROUP) -> np.ndarray:
    """The shifted int8 weight `[OC][C][...]` as the channels-as-lanes tile reads it:
    words in panels of `nr` channels, `[ceil(OC / nr)][ceil(K / group)][nr]`
    (zero-padded)."""
    from kiln.kernels.int8.packing import panelize

    return panelize(weight_words(wp, tap_major, group).T, nr)


def unpacked_weight(ww: np.ndarray, w_shape: Sequence[int], tap_major: bool = False,
                    group: int = quant_dot.GROUP) -> np.ndarray:
    """The int8 weight `[OC][C][...]` of `weight_words` or `weight_panels`."""
    from kiln.kernels.int8.packing import unpanelize

    oc, k = int(w_shape[0]), int(np.prod(w_shape[1:]))
    words = np.asarray(ww) if np.ndim(ww) == 2 else unpanelize(np.asarray(ww), oc).T
    flat = quant_dot.unwords(words.T, k, group).T
    if tap_major:
        shape = (oc, *w_shape[2:], int(w_shape[1]))
        return np.moveaxis(flat.reshape(shape), -1, 1)
    return flat.reshape(tuple(w_shape))


@dataclass(frozen=True)
class ConvTile:
    """A register tile of the dot-form convolution: `rows` x `cols` int32 accumulators,
    output positions as the lanes (`cols` positions, `rows` channels) or, with
    `channels_as_lanes`, output channels (`cols` channels, `rows` positions)."""

    channels_as_lanes: bool
    rows: int
    cols: int


#: The positions tile is kept unless the transposed one is estimated this much cheaper
#: (the estimate is within about 7% of per-layer timings of ResNet-50's layers on Zen 5).
TRANSPOSE_GAIN = 0.92
#: Weight of a load or broadcast against a dot product (they issue on ports of their own).
LOAD_WEIGHT = 0.125
#: The same for the `vpmaddubsw` tiles of `int8-pairs=saturate` (`_step_cost`).
MADDUBS_LOAD_WEIGHT = 1.0


#: The same for the int16-pair tiles (`quant_dot.PAIRS16`: a step is 2 k, so twice the
#: loads of a step of 4 k per product).
PAIRS16_LOAD_WEIGHT = 0.5


def _step_cost(isa: ISA, rows: int, vectors: int) -> float:
    """Vector instructions of one step (a word: 4 k, or 2 k of int16 pairs) of a tile,
    loads weighted by LOAD_WEIGHT: a dot product per accumulator, a broadcast per row and
    a load per vector."""
    if isa.int8_dot == quant_dot.PAIRS16:
        # vpmaddwd and an add per accumulator and 2 k
        return 2 * rows * vectors + (rows + vectors) * PAIRS16_LOAD_WEIGHT
    if isa.int8_dot == quant_dot.MADDUBS:
        # vpmaddubsw, vpmaddwd by ones and an add per accumulator (int8-pairs=saturate);
        # a load or broadcast weighs as one of those (on AMD EPYC Zen 3, 3x3 256>256 at
        # 14 x 14: the positions tile of one vector, 8 broadcasts a step, 2.0 ms; the
        # channels tile 1.5 ms, which the lighter weight did not pick)
        return 3 * rows * vectors + (rows + vectors) * MADDUBS_LOAD_WEIGHT
    return rows * vectors + (rows + vectors) * LOAD_WEIGHT


def _tile_cost(isa: ISA, tile: ConvTile, positions: int, channels: int, k: int) -> float:
    """The estimated instructions of all tiles of a convolution (K = `k`), the padded
    rows and lanes of partial tiles included: every step, and an epilogue of a vector
    per accumulator register (positions as lanes: contiguous stores) or of a scalar
    copy per output (channels as lanes: the output bytes move out a channel at a time;
    with `int8-pairs=saturate` a word of 4 positions at a time where the tile stores
    words, `word_stores`: counted there, where it was measured; with it VNNI would move
    1x1 256>1024 at 14 x 14 to the channels tile, 6% slower on AMD EPYC Zen 4)."""
    vectors = max(1, -(-tile.cols // isa.lanes("int32")))
    rows, cols = (positions, channels) if tile.channels_as_lanes else (channels, positions)
    tiles = -(-rows // tile.rows) * -(-cols // tile.cols)
    if not tile.channels_as_lanes:
        epilogue = tile.rows * vectors
    elif isa.int8_dot == quant_dot.MADDUBS and word_stores(tile.rows, positions):
        epilogue = tile.cols
    else:
        epilogue = tile.rows * tile.cols
    return tiles * (-(-k // quant_dot.k_group(isa)) * _step_cost(isa, tile.rows, vectors)
                    + epilogue)


def word_stores(rows: int, positions: int) -> bool:
    """Whether a channels tile of `rows` rows stores each channel's output bytes as one
    word (`_channel_tiles`): 4 rows, every tile's positions a whole word of the output."""
    return rows == quant_dot.GROUP and positions % quant_dot.GROUP == 0


#: Instructions of a channels tile beyond its steps and its per-output epilogue (the
#: `vpmaddubsw` tiles of `int8-pairs=saturate`): the requantization's setup, the loop
#: and the rows' word places. With it 14 x 14 = 196 positions take 49 tiles of 4 rows
#: (no padded row, each channel's bytes one word: `word_stores`) over 40 of 5: on AMD
#: EPYC Zen 4, AVX2, 3x3 256>256 2.5% faster, 1x1 256>1024 7%, 512>1024 4%; 7 x 7
#: keeps 10 tiles of 5.
MADDUBS_TILE_OVERHEAD = 200.0


def channel_rows(isa: ISA, positions: int, nr: int, k: int) -> int:
    """Rows (output positions) of a channels-as-lanes tile `nr` channels wide: of the
    row counts the registers hold, the one with the fewest estimated instructions for
    all positions (49 positions: 7 rows of 3 vectors, not 6 of 4 padded to 54); of
    counts within 2% of that, the most rows (the estimate undercounts the loads of few).
    The `vpmaddubsw` tiles, bound by their products, count a fixed cost per tile
    instead (MADDUBS_TILE_OVERHEAD) and take the least."""
    top = min(quant_dot.tile_rows(isa, nr), positions)
    costs = {mr: _tile_cost(isa, ConvTile(True, mr, nr), positions, nr, k)
             for mr in range(1, top + 1)}
    if isa.int8_dot == quant_dot.MADDUBS:
        costs = {mr: cost + MADDUBS_TILE_OVERHEAD * -(-positions // mr)
                 for mr, cost in costs.items()}
        return min(costs, key=lambda mr: (costs[mr], -mr))
    least = min(costs.values())
    return max(mr for mr, cost in costs.items() if cost <= 1.02 * least)


def position_rows(isa: ISA, nr: int, channels: int, words: bool = False) -> int:
    """Rows (output channels, a broadcast weight word each) of a positions tile `nr`
    positions wide: as many as the registers hold (`quant_dot.tile_rows`), one fewer for
    the `vpmaddubsw` pairs of `int8-pairs=saturate` on 16 registers (AVX2). There 5 rows
    of 2 vectors fill 15 registers in the steps (10 accumulators, the row of words, the
    broadcast, the product and the ones), the requantizing epilogue spills, and 5 rows
    never divide the 2^n channels of a network, so every tile clamps its weight rows
    and guards its stores; 4 rows do neither (AMD EPYC Zen 4, AVX2, one thread: the 1x1
    layers of ResNet-50 1.6-4.2% faster, the 3x3 ones read in place 0.5-1%; VNNI and the
    int16 pairs measured mixed, within the noise, and keep theirs). With `words` (an output
    in WORDS_LAYOUT: each 4 rows store a word per position) a multiple of 4."""
    rows = quant_dot.tile_rows(isa, nr)
    if isa.int8_dot == quant_dot.MADDUBS and isa.vector_registers <= 16 and rows > 1:
        rows -= 1
    if words:  # (channels are a multiple of 4 there)
        rows = max(quant_dot.GROUP, rows - rows % quant_dot.GROUP)
    return min(rows, channels)


def choose_tile(isa: ISA, positions: int, channels: int, k: int) -> ConvTile:
    """The tile of a convolution with `positions` output positions (per image),
    `channels` output channels and K = `k` (input channels x kernel taps). Output
    positions are the lanes (`quant_dot.tile_cols_for`) unless they fill the vectors
    badly (7 x 7 = 49 positions in 64 lanes): then output channels are
    (`channels_as_lanes`), when the estimated instructions of all its tiles
    (`_tile_cost`) are below TRANSPOSE_GAIN of the positions tile's."""
    nr = quant_dot.tile_cols_for(isa, positions)
    best = ConvTile(False, position_rows(isa, nr, channels), nr)
    lanes = isa.lanes("int32")
    if not isa.vector_bits or channels < lanes:
        return best
    cost = _tile_cost(isa, best, positions, channels, k) * TRANSPOSE_GAIN
    for width in range(min(quant_dot.tile_cols(isa), -(-channels // lanes) * lanes), 0,
                       -lanes):
        tile = ConvTile(True, channel_rows(isa, positions, width, k), width)
        candidate = _tile_cost(isa, tile, positions, channels, k)
        if candidate < cost:
            best, cost = tile, candidate
    return best


def tap_major_k(attrs: Attrs) -> bool:
    """Whether a dot-form convolution's k runs (tap, channel): with `int8-pairs=saturate`
    (onnxruntime's order, which its saturation depends on), or `tap_major` (exact
    products, where the order changes no result)."""
    return quant_dot.saturates(attrs) or bool(attrs.get("tap_major", False))


def _w_shape(attrs: Attrs) -> tuple[int, ...]:
    return tuple(int(d) for d in attrs["w_shape"])


def layouts(attrs: Attrs) -> tuple[bool, bool]:
    """Whether a dot-form convolution's input and output are in WORDS_LAYOUT (attributes
    `in_layout`, `out_layout`: "NCHW", the default, or WORDS_LAYOUT)."""
    flags = []
    for key in ("in_layout", "out_layout"):
        value = str(attrs.get(key, "NCHW"))
        if value not in ("NCHW", WORDS_LAYOUT):
            raise IRError(f"{CONV_DOT}: {key} must be 'NCHW' or {WORDS_LAYOUT!r}, got {value!r}")
        flags.append(value == WORDS_LAYOUT)
    return flags[0], flags[1]


def reads_words(attrs: Attrs, x: TensorType) -> bool:
    """Whether a dot-form convolution with `attrs` on NCHW input `x` (a 2-D one) can read
    its input as words of 4 channels: 4 k to a word (not the int16 pairs), every word
    4 channels of one tap (k = (tap, c), or a single tap), unsigned or signed bytes."""
    ws = _w_shape(attrs)
    return (len(ws) == 4 and ws[1] % quant_dot.GROUP == 0 and x.ndim == 4
            and quant_dot.word_group(attrs) == quant_dot.GROUP
            and (tap_major_k(attrs) or int(np.prod(ws[2:])) == 1)
            and x.dtype in ("uint8", "int8"))


def writes_words(attrs: Attrs, out: TensorType) -> bool:
    """Whether a dot-form convolution with `attrs` and NCHW output `out` can write it as
    words of 4 channels: a 2-D one, output channels a multiple of 4, bytes."""
    return out.ndim == 4 and int(_w_shape(attrs)[0]) % quant_dot.GROUP == 0 \
        and out.dtype in ("uint8", "int8")


def stores_words(call: Any, isa: ISA) -> bool:
    """Whether dot-form convolution `call` (a graph call with NCHW output) can write its
    output in WORDS_LAYOUT at no cost to its tile: a channels tile (its rows' channels
    are words already), or a positions tile whose rows, at each width it may take, are a
    multiple of 4 (`position_rows`: 4 on AVX2 with `int8-pairs=saturate`, where each 4
    rows store a word per position; 6 on AVX-512 at 64 positions would narrow to 4)."""
    out, ww = call.ret_type, call.args[1].type
    if not isinstance(out, TensorType) or not writes_words(call.attrs, out):
        return False
    dot = quant_dot.target_isa(isa, quant_dot.saturates(call.attrs))
    if dot is None or quant_dot.k_group(dot) != quant_dot.word_group(call.attrs):
        return False  # the te definition (words packed for another target)
    if ww.ndim == 3:
        return True
    dims = out.static_shape
    positions = int(np.prod(dims[2:]))
    widths = {quant_dot.tile_cols_for(dot, positions), quant_dot.tile_cols(dot)}
    return all(position_rows(dot, nr, dims[1]) % quant_dot.GROUP == 0 for nr in widths)


def _nchw_input(x: TensorType, in_words: bool) -> TensorType:
    """The NCHW type of input `x` (WORDS_LAYOUT with `in_words`; checked)."""
    if not in_words:
        return x
    if x.ndim != 5 or x.shape[4] != quant_dot.GROUP or not isinstance(x.shape[1], int):
        raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} input is 5-D [N][C / 4][H][W][4] with "
                      f"static channels, got {x.shape}")
    return TensorType((x.shape[0], x.shape[1] * quant_dot.GROUP, *x.shape[2:4]), x.dtype)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, ww, bias, x_zp, multiplier, y_zp = types
    ws = _w_shape(attrs)
    groups = -(-int(np.prod(ws[1:])) // quant_dot.word_group(attrs))
    # words [OC][groups], or panels [ceil(OC / nr)][groups][nr] of the channels tile
    shape = tuple(ww.shape)
    words = shape == (ws[0], groups) or (
        len(shape) == 3 and shape[1] == groups and isinstance(shape[2], int) and shape[2] > 0
        and shape[0] == -(-ws[0] // shape[2]))
    if ww.dtype != "int32" or not words or int(attrs.get("group", 1)) != 1:
        raise IRError(f"{CONV_DOT}: expects one group and int32 weight words "
                      f"({ws[0]}, {groups}) or panels (ceil({ws[0]} / nr), {groups}, nr) for "
                      f"w_shape {ws}, got {ww.dtype}{shape}")
    in_words, out_words = layouts(attrs)
    x = _nchw_input(x, in_words)
    if in_words and not reads_words(attrs, x):
        raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} input needs words of 4 channels of one "
                      f"tap (a 2-D convolution, k_group 4, tap_major or 1x1), got w_shape {ws}")
    shape = conv_int_shape(CONV_DOT, [x, TensorType(ws, "int8"), x_zp,
                                       TensorType((), "int8")], attrs)
    check_requant(CONV_DOT, ws[0], bias, multiplier, y_zp, attrs)
    out = TensorType(shape, y_zp.dtype)
    if out_words:
        if not writes_words(attrs, out):
            raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} output needs a 2-D convolution with "
                          f"a multiple of 4 output channels, got {shape}")
        return TensorType(block_shape(shape, quant_dot.GROUP), y_zp.dtype)
    return out


def _build(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression definition (used where the tiled kernel is not)."""
    x, ww, bias, x_zp, multiplier, y_zp = inputs
    in_words, out_words = layouts(attrs)
    if in_words:  # read through an NCHW view of the words
        x = reorder([x], {"src": WORDS_LAYOUT, "dst": "NCHW",
                          "channels": int(x.shape[1]) * quant_dot.GROUP})
    ws = _w_shape(attrs)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, ws, attrs, CONV_DOT)
    lo, hi = out_range(attrs, y_zp.dtype)
    taps = int(np.prod(ws[2:]))
    out_shape = conv_int_shape(CONV_DOT, [TensorType(x.shape, x.dtype), TensorType(ws, "int8"),
                                           TensorType((), x.dtype), TensorType((), "int8")],
                                attrs)

    saturate = quant_dot.saturates(attrs)
    by_tap = tap_major_k(attrs)
    k_total = int(np.prod(ws[1:]))
    group = quant_dot.word_group(attrs)

    def value(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] - begins[j] for j in range(rank))
            flat = (te.flat_index(k, ws[2:]) * ws[1] + c if by_tap
                    else c * taps + te.flat_index(k, ws[2:]))
            g = flat // group
            word = ww[oc, g] if ww.ndim == 2 else ww[oc // ww.shape[2], g, oc % ww.shape[2]]
            return quant_dot.a_byte(te.padded(x, (n, c, *pos), x_zp[()])) * quant_dot.b_byte(
                word, flat, group)

        if saturate:  # k = (tap, c); the products of k = 2p and 2p + 1 clamped to int16
            acc = quant_dot.saturated_sum(lambda k: term(
                k % ws[1], *te.unflatten_index(k // ws[1], ws[2:])), k_total) + bias[oc]
        else:
            acc = te.reduce("sum", term, tuple(ws[1:]), "int32") + bias[oc]
        return requantize_value(acc, channel(multiplier, oc), y_zp[()], lo, hi, y_zp.dtype)

    y = te.compute(out_shape, value, y_zp.dtype, CONV_DOT)
    return reorder([y], {"src": "NCHW", "dst": WORDS_LAYOUT}) if out_words else y


def _reference(x: np.ndarray, ww: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
               multiplier: np.ndarray, y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    from kiln.kernels.int8.packing import conv_packed_ref

    w = unpacked_weight(ww, _w_shape(attrs), tap_major_k(attrs), quant_dot.word_group(attrs))
    in_words, out_words = layouts(attrs)
    if in_words:
        x = from_blocked(x, x.shape[1] * quant_dot.GROUP)
    shift = quant_dot.a_shift(str(x.dtype))
    rest = {a: v for a, v in attrs.items()
            if a not in ("w_shape", "k_group", "in_layout", "out_layout")}
    y = conv_packed_ref(x.astype(np.int64) + shift, w, bias,
                        np.asarray(int(x_zp) + shift), multiplier, y_zp, **rest)
    return to_blocked(y, quant_dot.GROUP) if out_words else y


@dataclass(frozen=True)
class _TiledConv(HandBuiltOp):
    """The register-tiled kernel for static shapes on a target with a dot product."""

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        dot = quant_dot.target_isa(isa, quant_dot.saturates(attrs))
        if result is not None or len(args) != len(params) or dot is None \
                or quant_dot.k_group(dot) != quant_dot.word_group(attrs):
            return None  # (words packed for another target: the te definition reads them)
        x, ww, bias, x_zp, multiplier, y_zp = (Buffer(t.name, t.shape, t.dtype) for t in params)
        out_type = _infer([TensorType(t.shape, t.dtype) for t in params], attrs)
        assert isinstance(out_type, TensorType)
        out = Buffer("out", out_type.shape, y_zp.dtype)
        return PrimFunc((x, ww, bias, x_zp, multiplier, y_zp, out),
                        _tiles(x, ww, bias, x_zp, multiplier, y_zp, out, attrs, dot),
                        {ATTR_GEMM_KERNEL: CONV_DOT})


def _padded_input(x: Buffer, x_zp: Buffer, begins: Sequence[int], ends: Sequence[int]
                  ) -> tuple[Buffer, Stmt]:
    """`x` padded with its zero point (a scratch copy: the im2col reads need no bounds
    tests), or `x` itself when the convolution is not padded. The copy fills the whole
    scratch with `x_zp`, then copies the rows: both contiguous, so both vectorize."""
    if not any(begins) and not any(ends):
        return x, seq()
    shape = (*(int(d) for d in x.shape[:2]),
             *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
    xp = Buffer("x_padded", shape, x.dtype, "global")
    flat = Buffer("x_padded_flat", (int(np.prod(shape)),), x.dtype)
    fill = tile_loop("i", int(np.prod(shape)), lambda i: Store(flat, x_zp[()], (i,)))

    def copy(*i: PrimExpr) -> Stmt:
        n, c, rest = i[0], i[1], i[2:]
        return Store(xp, x[(n, c, *rest)], (n, c, *(r + b for r, b in zip(rest, begins))))

    rows = nest(("n", "c", *(f"i{j}" for j in range(len(shape) - 2))),
                [int(d) for d in x.shape], copy)
    return xp, seq(Allocate(xp), DeclBuffer(flat, xp, 0), fill, rows)


#: The top bit of each byte of a word (int32): flipping them adds 128 to each int8 byte
#: (`quant_dot.a_shift`).
_SIGN_BITS = -0x7F7F7F80


@dataclass(frozen=True)
class _Input:
    """A dot-form convolution's input: NCHW bytes, or (`words_of`: the bytes' dtype) the
    int32 view `[N][C / 4][H][W]` of a WORDS_LAYOUT input."""

    buffer: Buffer
    words_of: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The NCHW shape."""
        dims = [int(d) for d in self.buffer.shape]
        if self.words_of is None:
            return tuple(dims)
        return (dims[0], dims[1] * quant_dot.GROUP, *dims[2:])

    @staticmethod
    def of(x: Buffer, in_words: bool) -> tuple[_Input, tuple[Stmt, ...]]:
        """The input of buffer parameter `x` and the declarations it needs."""
        if not in_words:
            return _Input(x), ()
        view = Buffer("x_in_words", tuple(int(d) for d in x.shape[:4]), "int32")
        return _Input(view, str(x.dtype)), (DeclBuffer(view, x, 0),)


def _padded_words(src: _Input, x_zp: Buffer, begins: Sequence[int], ends: Sequence[int]
                  ) -> tuple[Buffer, Stmt]:
    """The input (C a multiple of 4) padded with its zero point as words of 4 channels,
    `[N][C / 4][*padded spatial]` int32: byte i of word (n, c4, ...) is channel 4 c4 + i
    at that place, an unsigned byte as the dot product reads it. With k = (tap, c)
    (`int8-pairs=saturate`), an im2col word is 4 channels of one tap: a word of this
    grid, so the im2col copies words instead of gathering bytes from 4 planes (and
    the gather runs once per input word here, not once per tap). An input already in
    words (WORDS_LAYOUT) copies whole words, and none when it needs no padding and no
    shift (unsigned bytes): it is then read in place."""
    x = src.buffer
    rank = len(x.shape) - 2
    if src.words_of == "uint8" and not any(begins) and not any(ends):
        return x, seq()
    shape = (int(x.shape[0]), src.shape[1] // quant_dot.GROUP,
             *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
    xw = Buffer("x_words4", shape, "int32", "global")
    statements: list[Stmt] = [Allocate(xw)]
    if any(begins) or any(ends):
        flat = Buffer("x_words4_flat", (int(np.prod(shape)),), "int32")
        zp_word = quant_dot.pack_word(lambda i: quant_dot.a_byte(x_zp[()]))
        statements += [DeclBuffer(flat, xw, 0), tile_loop(
            "i", int(np.prod(shape)), lambda i: Store(flat, zp_word, (i,)))]

    def copy(n: PrimExpr, c4: PrimExpr, *i: PrimExpr) -> Stmt:
        if src.words_of is None:
            word = quant_dot.pack_word(lambda b: quant_dot.a_byte(
                x[(n, c4 * quant_dot.GROUP + b, *i)]))
        else:  # int8 bytes shifted to unsigned ones: their top bits flipped
            word = x[(n, c4, *i)]
            if quant_dot.a_shift(src.words_of):
                word = word ^ as_expr(_SIGN_BITS, "int32")
        return Store(xw, word, (n, c4, *(i[j] + begins[j] for j in range(rank))))

    statements.append(nest(("n", "c4", *(f"i{j}" for j in range(rank))),
                           [shape[0], shape[1], *(int(d) for d in x.shape[2:])], copy))
    return xw, seq(*statements)


@dataclass(frozen=True)
class _PhasePlanes:
    """The padded input of a strided convolution split into phase planes: along a
    dimension of stride s, input index i = s * i' + phase, and a tap at offset
    t = k * dilation reads phase t % s at i' = o + t // s for output position o. The
    planes `[N][C * phases][*extents]` (phases of a dimension: s, or 1 when every tap
    reads phase 0, as a 1x1 convolution's) are copied once, each from whole rows of the
    input; then every tap's reads for an output row are contiguous (stride-2 reads of
    bytes otherwise, one at a time). With stride 1 the planes are the input itself.
    When the padded input holds every plane whole (`whole_ends`), one loop nest copies
    all phases (a row's phases read its bytes in pairs or groups of s)."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    phases: tuple[int, ...]
    extents: tuple[int, ...]

    @staticmethod
    def of(grid: Sequence[int], ws: Sequence[int], strides: Sequence[int],
           dilations: Sequence[int], spatial: Sequence[int]) -> _PhasePlanes:
        """The planes the convolution (weight shape `ws`, output `spatial`) reads from
        its padded input's spatial `grid`."""
        rank = len(spatial)
        taps = [[k * dilations[j] for k in range(ws[2 + j])] for j in range(rank)]
        phases = tuple(1 if all(t % s == 0 for t in ts) else s
                       for ts, s in zip(taps, strides))
        # a plane holds the rows its taps read: o + t // s for every output o and tap t
        extents = tuple(spatial[j] + max(taps[j]) // strides[j] if strides[j] > 1
                        else int(grid[j]) for j in range(rank))
        return _PhasePlanes(tuple(strides), tuple(dilations), phases, extents)

    def whole_ends(self, grid: Sequence[int], ends: Sequence[int]) -> list[int]:
        """`ends` (the padding past the input's end) grown so that the padded input holds
        every phase plane whole (s * extent along a dimension of s phases): its rows then
        copy in one loop nest. The rows added are the zero point's and never read."""
        need = [s * e if p > 1 else s * (e - 1) + 1
                for s, e, p in zip(self.strides, self.extents, self.phases)]
        return [end + max(0, n - g) for end, n, g in zip(ends, need, grid)]

    @property
    def strided(self) -> bool:
        return any(s > 1 for s in self.strides)

    def plane(self, c: PrimExpr, kk: Sequence[PrimExpr]) -> PrimExpr:
        """The plane tap `kk` of input channel `c` reads."""
        if not self.strided:
            return c
        phase = [(k * d) % s if p > 1 else as_expr(0)
                 for k, d, s, p in zip(kk, self.dilations, self.strides, self.phases)]
        return c * int(np.prod(self.phases)) + te.flat_index(phase, self.phases)

    def offsets(self, kk: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
        """Where tap `kk` reads its plane, relative to the output position."""
        return tuple(k * d if s == 1 else (k * d) // s
                     for k, d, s in zip(kk, self.dilations, self.strides))

    def split(self, xp: Buffer) -> tuple[Buffer, Stmt]:
        """The planes of the padded input `xp` and the copy that fills them (`xp` itself
        and nothing with stride 1). A phase's rows past the input's end are never read
        and not copied."""
        if not self.strided:
            return xp, seq()
        batch, chans = int(xp.shape[0]), int(xp.shape[1])
        count = int(np.prod(self.phases))
        planes = Buffer("x_phases", (batch, chans * count, *self.extents), xp.dtype, "global")
        grid = [int(d) for d in xp.shape[2:]]
        names = ("n", "c", *(f"i{j}" for j in range(len(grid))))
        all_phases = list(itertools.product(*(range(p) for p in self.phases)))

        def read(n: PrimExpr, c: PrimExpr, i: Sequence[PrimExpr], phase: Sequence[int]
                 ) -> PrimExpr:
            return xp[(n, c, *(i[j] * s + p for j, (s, p) in enumerate(
                zip(self.strides, phase))))]

        if self.whole_ends(grid, [0] * len(grid)) == [0] * len(grid):
            return planes, seq(Allocate(planes), nest(
                names, [batch, chans, *self.extents], lambda n, c, *i: seq(*(
                    Store(planes, read(n, c, i, phase), (n, c * count + index, *i))
                    for index, phase in enumerate(all_phases)))))
        copies = []
        for index, phase in enumerate(all_phases):
            rows = [min(e, -(-(g - p) // s)) for e, g, p, s in
                    zip(self.extents, grid, phase, self.strides)]

            def copy(n: PrimExpr, c: PrimExpr, *i: PrimExpr, index: int = index,
                     phase: tuple[int, ...] = phase) -> Stmt:
                return Store(planes, read(n, c, i, phase), (n, c * count + index, *i))

            copies.append(nest(names, [batch, chans, *rows], copy))
        return planes, seq(Allocate(planes), *copies)


#: Bytes of two cache lines: a pitch that is a multiple of it maps a column of words
#: (one per plane) onto every other cache set or fewer.
_LINE_PAIR = 128


def _spread(extents: Sequence[int], planes: int) -> tuple[int, ...]:
    """2-D `extents` of planes of int32 words grown (the added rows and columns are never
    read) so that `planes` of them, the step from one channel word to the next, are not
    a multiple of two cache lines: a column first when every row count would be (rows
    of 8 words in 4 phase planes), then rows. The channels-as-lanes tile broadcasts one
    word of each channel word's plane in turn: at a pitch of 16 x 16 words (1 KiB, a
    14 x 14 image padded by one) those words fall into 4 of the L1 cache's 64 sets and
    evict one another between the tile's steps (3x3 256>256 at 14 x 14 1% slower on
    AMD EPYC Zen 4, AVX2)."""
    rows, cols = int(extents[0]), int(extents[1])
    if planes * cols * 4 % _LINE_PAIR == 0:
        cols += 1
    while planes * rows * cols * 4 % _LINE_PAIR == 0:
        rows += 1
    return (rows, cols)


def _tiles(x: Buffer, ww: Buffer, bias: Buffer, x_zp: Buffer, multiplier: Buffer,
           y_zp: Buffer, out: Buffer, attrs: Attrs, isa: ISA) -> Stmt:
    ws = _w_shape(attrs)
    in_words, out_words = layouts(attrs)
    source, decls = _Input.of(x, in_words)
    x_shape = source.shape
    rank, strides, dilations, begins, _ = conv_geometry(x_shape, ws, attrs, CONV_DOT)
    batch, oc_n = int(out.shape[0]), ws[0]
    spatial = tuple(int(d) for d in out.shape[2:2 + len(ws) - 2])
    positions = int(np.prod(spatial))
    taps, k_total, groups = int(np.prod(ws[2:])), int(np.prod(ws[1:])), int(ww.shape[1])
    by_tap = tap_major_k(attrs)
    intrinsic = quant_dot.dot_intrinsic(attrs)
    group = quant_dot.word_group(attrs)
    if ww.ndim == 3:  # weight panels: channels as lanes, as wide as the panels
        nr = int(ww.shape[2])
        tile = ConvTile(True, channel_rows(isa, positions, nr, k_total), nr)
    else:
        nr = quant_dot.tile_cols_for(isa, positions)
        tile = ConvTile(False, position_rows(isa, nr, oc_n, out_words), nr)
    big = worth_parallel(batch * positions * oc_n * k_total, "madd", isa, "int8")
    # the padding past the input's end that the last output position reads
    ends = [max(0, (spatial[j] - 1) * strides[j] + (ws[2 + j] - 1) * dilations[j]
                - begins[j] + 1 - x_shape[2 + j]) for j in range(rank)]
    grid_in = [x_shape[2 + j] + begins[j] + ends[j] for j in range(rank)]
    # k = (tap, c) with whole words of channels: the input is copied once as words of
    # 4 channels (`_padded_words`), and the im2col copies whole words; an input in
    # words (WORDS_LAYOUT: `_infer` checked its k order) is read as such
    quads = in_words or (by_tap and group == quant_dot.GROUP and taps > 1
                         and ws[1] % group == 0)
    if quads and tile.channels_as_lanes and rank == 2 and max(strides) == 1:
        # (its words read in place, below; strided ones' phase planes spread so measured
        # 1% slower: 3x3/2 512>512 at 14 x 14, 4 planes of 8 x 8 words to 9 x 9)
        spread = _spread(grid_in, 1)
        ends = [e + s - g for e, s, g in zip(ends, spread, grid_in)]
        grid_in = list(spread)
    planes = _PhasePlanes.of(grid_in, ws, strides, dilations, spatial)
    lo, hi = out_range(attrs, y_zp.dtype)
    row_epilogue = _RowEpilogue(bias, multiplier, y_zp, lo, hi, narrows_by_packs(isa))
    # (strided ones on their phase planes measured slower in place: 3x3/2 128>128 at
    # 56 x 56, 94% of onnxruntime on the im2col of words, 85% in place)
    if quads and rank == 2 and ww.ndim == 2 and not planes.strided and _in_place_pays(
            isa, spatial, _in_place_width(x_shape, begins, ends)):
        return seq(*decls, _in_place(source, ww, x_zp, out, out_words, row_epilogue, ws,
                                     begins, ends, dilations, big, isa, intrinsic))
    if planes.strided and (quads or any(begins) or any(ends)):
        # already a padded copy: a little more of it lets one loop copy every phase
        ends = planes.whole_ends(grid_in, ends)
    xp, pad = (_padded_words(source, x_zp, begins, ends) if quads
               else _padded_input(x, x_zp, begins, ends))
    # A strided convolution reads its input through phase planes (`_PhasePlanes`): there
    # output position o reads plane (c, phase of the tap) at o + the tap's offset, as
    # a stride-1 convolution reads its input. With stride 1 the planes are the input.
    # Output position o's words are then packed at o's place in the plane grid,
    # q(o) = sum(o_j * row_j): one loop over q reads every plane contiguously and
    # vectorizes (the rows of a 7 x 7 or 14 x 14 image are too short to). The columns
    # past the output's width get words too, unread: the channels tile reads a row's
    # word at q(o); the positions tile only where q(o) = o (the grid is the output's,
    # as with a 1x1 convolution, unpadded or strided).
    src, split = planes.split(xp)
    grid = list(planes.extents)
    row = [int(np.prod(grid[j + 1:])) for j in range(rank)]
    in_grid = tile.channels_as_lanes or grid[1:] == list(spatial[1:])
    if in_grid:
        padded = sum((spatial[j] - 1) * row[j] for j in range(rank)) + 1
        if not tile.channels_as_lanes:
            padded = -(-positions // nr) * nr
    else:  # the output positions, padded to whole tiles (zero words past the last)
        padded = (-(-positions // tile.rows) * tile.rows if tile.channels_as_lanes
                  else -(-positions // nr) * nr)
    # a group's words start an odd number of cache lines after the previous group's: a
    # tile reads one vector per group, and a pitch of an even count of lines (3136
    # positions: 196) maps those vectors onto a few cache sets, which then evict one
    # another between the tile's row tiles
    lines = -(-padded // 16)
    words = Buffer("x_words", (batch, groups, 16 * (lines + 1 - lines % 2)), "int32", "global")
    grid_view = Buffer("x_grid", (batch, int(src.shape[1]), int(np.prod(grid))), src.dtype)

    def word_at(p: PrimExpr) -> PrimExpr:
        """Where the channels tile reads output position `p`'s words (p past the last
        position: the last's)."""
        if not in_grid:
            return p
        o = te.unflatten_index(min_(p, positions - 1), spatial)
        return sum((o[j] * row[j] for j in range(1, rank)), o[0] * row[0])

    def word(g: PrimExpr, load: Callable[[PrimExpr, Sequence[PrimExpr]], PrimExpr]
             ) -> PrimExpr:
        # the im2col word of group g: `group` k = (c, tap) read by
        # `load(plane, offsets)`, 0 past K
        if quads:  # k = (tap, c): the word of channels 4 c4 .. 4 c4 + 3 at tap g // (C / 4)
            quarter = ws[1] // group
            kk = te.unflatten_index(g // quarter, ws[2:])
            return load(planes.plane(g % quarter, kk), planes.offsets(kk))

        def value(i: int) -> PrimExpr:
            k = g * group + i
            if by_tap:  # k = (tap, c)
                c, kk = k % ws[1], te.unflatten_index(min_(k // ws[1], taps - 1), ws[2:])
            else:
                c, kk = k // taps, te.unflatten_index(k % taps, ws[2:])
            byte = quant_dot.a_byte(load(planes.plane(min_(c, ws[1] - 1), kk),
                                         planes.offsets(kk)))
            if k_total % group:
                byte = Select(compare("lt", k, k_total), byte, as_expr(0, "int32"))
            return byte

        return quant_dot.pack_word(value, group)

    names = tuple(f"o{j}" for j in range(rank))

    def pack_group(n: PrimExpr, g: PrimExpr) -> Stmt:
        if in_grid:
            extent = padded if tile.channels_as_lanes else positions
            rows = tile_loop("q", extent, lambda q: Store(words, word(g, lambda c, off: grid_view[
                n, c, q + sum(off[j] * row[j] for j in range(rank))]), (n, g, q)))
        else:  # per output row: contiguous loads along the plane's row
            rows = nest(names, spatial, lambda *o: Store(words, word(g, lambda c, off: src[(
                n, c, *(o[j] + off[j] for j in range(rank)))]),
                (n, g, te.flat_index(o, spatial))))
        if positions >= padded or (in_grid and tile.channels_as_lanes):
            return rows
        tail = tile_loop("p", padded - positions, lambda p: Store(
            words, as_expr(0, "int32"), (n, g, p)), start=positions)
        return seq(rows, tail)

    # int16 pairs (twice the words of bytes) on the positions tile: the im2col is packed
    # a block of whole output rows at a time, just before that block's column tiles
    # read it (in the same thread: in cache, not evicted by the whole image's words)
    block = _block_rows(spatial, nr, groups) if (
        group == quant_dot.PAIR_GROUP and not tile.channels_as_lanes and not in_grid) else 0

    def fill(n: PrimExpr, b: PrimExpr) -> Stmt:
        width = spatial[1]
        return tile_loop("g", groups, lambda g: nest(
            names, (block, width), lambda o0, o1: Store(words, word(g, lambda c, off: src[(
                n, c, b * block + o0 + off[0], o1 + off[1])]),
                (n, g, (b * block + o0) * width + o1))))

    pack = seq() if block else tile_loop("n", batch, lambda n: tile_loop(
        "g", groups, lambda g: pack_group(n, g),
        "parallel" if big and groups > 1 else "serial"))
    flat_out = _flat_output(out, out_words, positions)
    bytes_of = str(y_zp.dtype) if out_words else None

    def requantized(acc: PrimExpr, oc: PrimExpr) -> PrimExpr:
        # vector code along the channels (vectorize-loops): select clamp, magic rounding
        mult = multiplier[()] if multiplier.ndim == 0 else multiplier[oc]
        return requantize_value(acc + bias[oc], mult, y_zp[()], lo, hi, y_zp.dtype,
                                selects=True, magic_round=True)

    if tile.channels_as_lanes and quads:
        # the words of 4 channels read in place (at q(o) + the tap's offset): no im2col
        def read(n: PrimExpr, t: PrimExpr, c4: PrimExpr, q: PrimExpr) -> PrimExpr:
            kk = te.unflatten_index(t, ws[2:])
            off = planes.offsets(kk)
            return grid_view[n, planes.plane(c4, kk), q + sum(
                (off[j] * row[j] for j in range(1, rank)), off[0] * row[0])]

        nest_ = _channel_tiles(_InPlace(ws[1] // group, read), ww, flat_out, tile,
                               requantized, positions, oc_n, big, word_at, intrinsic,
                               y_zp.dtype, out_words)
        return seq(*decls, pad, split, DeclBuffer(grid_view, src, 0),
                   DeclBuffer(flat_out, out, 0), nest_)
    if tile.channels_as_lanes:
        nest_ = _channel_tiles(words, ww, flat_out, tile, requantized, positions, oc_n, big,
                               word_at, intrinsic, y_zp.dtype, out_words)
    else:
        nest_ = _position_tiles(words, ww, flat_out, tile, row_epilogue, positions, oc_n,
                                big, intrinsic,
                                (block * spatial[1] // nr, fill) if block else None, bytes_of)
    views = (DeclBuffer(grid_view, src, 0),) if in_grid else ()
    return seq(*decls, pad, split, *views, Allocate(words), pack,
               DeclBuffer(flat_out, out, 0), nest_)


def _flat_output(out: Buffer, out_words: bool, positions: int) -> Buffer:
    """The view the tiles store into: `[N][OC][positions]` bytes, or with `out_words`
    `[N][OC / 4][positions]` int32 words of 4 channels (WORDS_LAYOUT)."""
    if out_words:
        return Buffer("out_words4", (int(out.shape[0]), int(out.shape[1]), positions), "int32")
    return Buffer("out_flat", (int(out.shape[0]), int(out.shape[1]), positions), out.dtype)


#: The grid positions an in-place convolution computes (`_in_place`: the padding columns
#: too), at most this many times the output positions the im2col's tiles compute (the
#: im2col's copy of words costs 5-9% at 28 x 28; AMD EPYC Zen 3, `int8-pairs=saturate`,
#: one thread: 3x3 64>64 at 56 x 56, 3136 positions or 3248 in place, 88% -> 99% of
#: onnxruntime; 128>128 at 28 x 28, 784 or 848, 95% -> 93%; 64>256 at 12 x 12, 95% -> 84%).
IN_PLACE_WASTE = 1.05


def _in_place_width(x_shape: Sequence[int], begins: Sequence[int], ends: Sequence[int]
                    ) -> int:
    """The columns of a row of `_in_place`'s grid: the input's (NCHW `x_shape`) and the
    larger of its left and right padding, which the rows share (a row's right padding is
    the next row's left padding)."""
    return int(x_shape[3]) + max(begins[1], ends[1])


def _in_place_pays(isa: ISA, spatial: Sequence[int], width: int) -> bool:
    """Whether a stride-1 convolution with output `spatial` on a grid `width` columns wide
    runs in place (`_in_place`) rather than on an im2col of words."""
    nr = quant_dot.tile_cols(isa)
    grid = -(-spatial[0] * width // nr) * nr
    im2col = -(-int(np.prod(spatial)) // quant_dot.tile_cols_for(isa, int(np.prod(spatial)))
               ) * quant_dot.tile_cols_for(isa, int(np.prod(spatial)))
    return grid <= IN_PLACE_WASTE * im2col


def _in_place(source: _Input, ww: Buffer, x_zp: Buffer, out: Buffer, out_words: bool,
              epilogue: _RowEpilogue, ws: Sequence[int], begins: Sequence[int],
              ends: Sequence[int], dilations: Sequence[int], big: bool, isa: ISA,
              intrinsic: str) -> Stmt:
    """A stride-1 2-D convolution with k = (tap, c) and C a multiple of 4
    (`int8-pairs=saturate`) on the positions tile without an im2col: the input is copied
    once as words of 4 channels on a padded grid (`_padded_words`) of W' = W + P columns,
    P the larger of the left and right padding, all of it on the left: a row's taps past
    its right end read the next row's padding, and those before its left end its own.
    The tile's lanes are grid positions q = o0 W' + o1, whose word of tap (t0, t1) and
    channels 4 c4 .. 4 c4 + 3 is the grid's word c4 at q + t0 W' + t1 (dilated; shifted by
    P less the left padding): read in place, as onnxruntime's symmetric convolution
    kernel reads its NHWC input. The P columns past each output row are computed too and
    left out when the tiles' output grid is copied into the output (a contiguous copy
    per row). The grid has rows enough below the image (the zero point's) that the last
    tile reads inside it. Where the grid is the output's (an unpadded 1x1 convolution on
    whole tiles) the tiles store into the output itself; and an input in words
    (WORDS_LAYOUT) of unsigned bytes that needs no padding is read where it is."""
    x_shape = source.shape
    batch, oc_n = int(out.shape[0]), int(ws[0])
    rows_out, cols_out = int(out.shape[2]), int(out.shape[3])
    width = _in_place_width(x_shape, begins, ends)
    shift = width - x_shape[3] - begins[1]
    # the widest tile: one vector broadcasts a weight word per accumulator and step
    nr = min(quant_dot.tile_cols(isa), rows_out * width)
    tile = ConvTile(False, position_rows(isa, nr, oc_n, out_words), nr)
    cols = -(-rows_out * width // nr) * nr
    reach = cols - 1 + (ws[2] - 1) * dilations[0] * width + (ws[3] - 1) * dilations[1] + shift
    below = max(int(ends[0]), reach // width + 1 - x_shape[2] - begins[0])
    xw, pad = _padded_words(source, x_zp, (begins[0], width - x_shape[3]), (below, 0))
    grid = Buffer("x_grid", (batch, int(xw.shape[1]), int(xw.shape[2]) * width), "int32")
    quarter = int(ws[1]) // quant_dot.GROUP

    def read(n: PrimExpr, t: PrimExpr, c4: PrimExpr, q: PrimExpr) -> PrimExpr:
        kk = te.unflatten_index(t, ws[2:])
        return grid[n, c4, q + kk[0] * (dilations[0] * width) + kk[1] * dilations[1] + shift]

    bytes_of = str(epilogue.y_zp.dtype) if out_words else None
    if width == cols_out and cols == rows_out * cols_out:
        flat = _flat_output(out, out_words, cols)
        tiles = _position_tiles(_InPlace(quarter, read), ww, flat, tile, epilogue, cols,
                                oc_n, big, intrinsic, out_bytes=bytes_of)
        return seq(pad, DeclBuffer(grid, xw, 0), DeclBuffer(flat, out, 0), tiles)
    # the output grid, then its rows without the padding columns
    rows_of = oc_n // quant_dot.GROUP if out_words else oc_n
    dtype = "int32" if out_words else out.dtype
    out_grid = Buffer("out_grid", (batch, rows_of, cols), dtype, "global")
    tiles = _position_tiles(_InPlace(quarter, read), ww, out_grid, tile, epilogue, cols, oc_n,
                            big, intrinsic, out_bytes=bytes_of)
    target = Buffer("out_rows", (batch, rows_of, rows_out, cols_out), dtype)
    compact = nest(("n", "oc", "o0", "o1"), (batch, rows_of, rows_out, cols_out),
                   lambda n, oc, o0, o1: Store(target, out_grid[n, oc, o0 * width + o1],
                                               (n, oc, o0, o1)))
    return seq(pad, DeclBuffer(grid, xw, 0), Allocate(out_grid), tiles,
               DeclBuffer(target, out, 0), compact)


Epilogue = Callable[[PrimExpr, PrimExpr], PrimExpr]


def unsigned_byte(value: PrimExpr, dtype: str) -> PrimExpr:
    """An output byte of `dtype` (uint8 or int8) as int32 in [0, 255], as `pack_word`
    packs it."""
    q = Cast("int32", value)
    return q if dtype == "uint8" else Select(compare("lt", q, 0), q + 256, q)
#: Most bytes of im2col words a block of output rows packs at a time (`_block_rows`).
BLOCK_BYTES = 384 * 1024


def _block_rows(spatial: Sequence[int], nr: int, groups: int) -> int:
    """Output rows of a 2-D convolution's im2col block: whole column tiles (`nr`
    positions) that divide the image's rows evenly, as many as fit BLOCK_BYTES of
    words and leave at least 4 blocks; 0 when no such block exists."""
    if len(spatial) != 2:
        return 0
    rows, width = spatial
    fits = [r for r in range(1, rows + 1) if rows % r == 0 and r * width % nr == 0
            and rows // r >= 4 and r * width * groups * 4 <= BLOCK_BYTES]
    return max(fits, default=0)


def narrows_by_packs(isa: ISA) -> bool:
    """Whether the positions tile's requantized rows are clamped as integers too, so that
    LLVM narrows them with saturating packs (`requantize_value(packs=True)`): x86 up to
    AVX2, where that saves a mask per vector (the 1x1 layers of ResNet-50 1.5-3% faster
    on AMD EPYC Zen 4 with AVX2); AVX-512 narrows a vector with one `vpmovdb`, and
    there the clamps made the same layers 3-6% slower."""
    return isa.arch in ("x86_64", "x86", "i686") and isa.vector_bits <= 256


@dataclass(frozen=True)
class _RowEpilogue:
    """The requantization of one output channel's row of a positions tile. Its
    accumulators start from the channel's bias (`start`); the multiplier and the zero
    point are first copied into registers (`buffers` / `load`), so the store loop over
    the row reads only the tile's own buffers: the vectorize-loops pass can then prove
    its lanes independent and emit it as vector code
    (left to LLVM, it unrolls a one-vector row and vectorizes across the rows with
    gathers and byte scatters, or vectorizes it again after unrolling it: a third of
    ResNet-50's LLVM time on these tiles). The clamp is the select form
    (`requantize_value(..., selects=True)`: one `vmaxps` / `vminps` per bound), the
    rounding the magic number's (`magic_round`: int32 and float32 lanes only), the store
    a narrowing one (int32 lanes to bytes; with `packs`, clamped to the range as well:
    `narrows_by_packs`)."""

    bias: Buffer
    multiplier: Buffer
    y_zp: Buffer
    lo: int
    hi: int
    packs: bool = False

    def start(self, oc: PrimExpr) -> PrimExpr:
        """The value channel `oc`'s accumulators start from: its bias (the correction of
        the zero points included), so the epilogue adds nothing."""
        return self.bias[oc]

    def buffers(self, suffix: str = "") -> tuple[Buffer, Buffer]:
        """The per-tile register copies (multiplier, zero point)."""
        return (Buffer(f"row_multiplier{suffix}", (1,), "float32", "local"),
                Buffer(f"row_zp{suffix}", (1,), self.y_zp.dtype, "local"))

    def load(self, regs: Sequence[Buffer], oc: PrimExpr) -> Stmt:
        """Copy channel `oc`'s parameters into `regs`."""
        m = self.multiplier
        zero = (as_expr(0, "int64"),)
        return seq(Store(regs[0], m[()] if m.ndim == 0 else m[oc], zero),
                   Store(regs[1], self.y_zp[()], zero))

    def value(self, regs: Sequence[Buffer], acc: PrimExpr) -> PrimExpr:
        """The requantized output of accumulator `acc` (bias included) of the loaded
        channel."""
        return requantize_value(acc, regs[0][0], regs[1][0], self.lo, self.hi,
                                self.y_zp.dtype, selects=True, magic_round=True,
                                packs=self.packs)


@dataclass(frozen=True)
class _InPlace:
    """Where a positions tile reads its input words without an im2col: word group g =
    `outer` * `inner` group + inner group (taps x words of channels) at `read(n, outer,
    inner, p)`; the step loop is nested the same way, so the read's address steps by a
    constant in the inner loop (a flat loop over g divides per step)."""

    inner: int
    read: Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


def _steps(words: Buffer | _InPlace, groups: int, n: PrimExpr,
           products: Callable[[PrimExpr, Callable[[PrimExpr], PrimExpr]], Stmt]) -> Stmt:
    """A tile's loop over its word groups g: `products(g, word)`, `word(p)` the input word
    of group g at position p (`words[n, g, p]`, or read in place, `_InPlace`: nested
    loops over its outer and inner groups)."""
    if isinstance(words, _InPlace):
        inner, read = words.inner, words.read
        return tile_loop("t", groups // inner, lambda t: tile_loop(
            "c", inner, lambda c: products(t * inner + c, lambda p: read(n, t, c, p))))
    return tile_loop("g", groups, lambda g: products(g, lambda p: words[n, g, p]))


def _position_tiles(words: Buffer | _InPlace, ww: Buffer, flat_out: Buffer, tile: ConvTile,
                    epilogue: _RowEpilogue, positions: int, oc_n: int, big: bool,
                    intrinsic: str = DOT4_U8S8,
                    blocks: tuple[int, Callable[[PrimExpr, PrimExpr], Stmt]] | None = None,
                    out_bytes: str | None = None) -> Stmt:
    """Tiles of output channels (a broadcast weight word each) x output positions (the
    lanes: vectors of input words, `words[n, g, p]`, or read in place, `_InPlace`),
    stored along the output rows. With `blocks` (column tiles per block,
    `fill(n, block)`), the blocks run in parallel, each packing its words with `fill`
    before its column tiles. With `out_bytes` (the output's byte dtype) `flat_out` is
    int32 words of 4 channels `[N][OC / 4][positions]` (WORDS_LAYOUT): each 4 rows of
    the tile (rows a multiple of 4) store one word per position."""
    batch, groups = int(flat_out.shape[0]), int(ww.shape[1])
    mr, nr = tile.rows, tile.cols
    col_tiles, row_tiles = -(-positions // nr), -(-oc_n // mr)

    def one(n: PrimExpr, ct: PrimExpr, rt: PrimExpr) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        def row(r: PrimExpr) -> PrimExpr:
            return rt * mr + r if oc_n % mr == 0 else min_(rt * mr + r, oc_n - 1)

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, epilogue.start(row(r)), (r, v)), "vectorized"))

        def products(g: PrimExpr, word: Callable[[PrimExpr], PrimExpr]) -> Stmt:
            return tile_loop("r", mr, lambda r: tile_loop("v", nr, lambda v: Store(
                acc, Intrin(intrinsic, (acc[r, v], word(ct * nr + v), ww[row(r), g])),
                (r, v)), "vectorized"), "unrolled")

        step = _steps(words, groups, n, products)

        regs = epilogue.buffers()

        def store(r: PrimExpr, v: PrimExpr) -> Stmt:
            return Store(flat_out, epilogue.value(regs, acc[r, v]),
                         (n, rt * mr + r, ct * nr + v))

        def along_row(first: PrimExpr, loads: Stmt, store_at: Callable[[PrimExpr], Stmt]
                      ) -> Stmt:
            # whole column tiles store unguarded (vector code); the last, partial one
            # stores its positions only; rows past the last channel (whose first row is
            # `first`) store nothing
            rest = positions - (col_tiles - 1) * nr
            stores: Stmt = lanes_loop("v", nr, store_at)
            if rest != nr:
                stores = IfThenElse(compare("lt", ct, col_tiles - 1), stores,
                                    lanes_loop("v", rest, store_at))
            stores = seq(loads, stores)
            if oc_n % mr == 0:
                return stores
            return IfThenElse(compare("lt", rt * mr + first, oc_n), stores)

        def store_row(r: PrimExpr) -> Stmt:
            return along_row(r, epilogue.load(regs, row(r)), lambda v: store(r, v))

        if out_bytes is None:
            return seq(Allocate(acc), zero, step, *(Allocate(b) for b in regs),
                       tile_loop("r", mr, store_row, "unrolled"))
        # WORDS_LAYOUT: rows 4 q .. 4 q + 3 (4 channels) requantized and packed to a word
        # per position, along the lanes (vector code)
        quad = [epilogue.buffers(f"_{b}") for b in range(quant_dot.GROUP)]

        def store_words(q: PrimExpr) -> Stmt:
            first = q * quant_dot.GROUP

            def store(v: PrimExpr) -> Stmt:
                word = quant_dot.pack_word(lambda b: unsigned_byte(
                    epilogue.value(quad[b], acc[first + b, v]), out_bytes))
                return Store(flat_out, word, (n, rt * (mr // quant_dot.GROUP) + q, ct * nr + v))

            return along_row(first, seq(*(epilogue.load(quad[b], row(first + b))
                                          for b in range(quant_dot.GROUP))), store)

        return seq(Allocate(acc), zero, step, *(Allocate(b) for regs_ in quad for b in regs_),
                   tile_loop("q", mr // quant_dot.GROUP, store_words, "unrolled"))

    if blocks is not None:
        per, fill = blocks
        return tile_loop("n", batch, lambda n: tile_loop("b", col_tiles // per, lambda b: seq(
            fill(n, b), tile_loop("ct", per, lambda ct: tile_loop(
                "rt", row_tiles, lambda rt: one(n, b * per + ct, rt))))),
            "parallel" if big else "serial")
    if col_tiles >= PARALLEL_TILES or row_tiles < col_tiles:
        # column tiles outer: each thread reads the input words of its positions
        return _tiles_of(batch, (col_tiles, row_tiles), one, big)
    # few output positions (one column tile): output channels outer
    return _tiles_of(batch, (row_tiles, col_tiles), lambda n, rt, ct: one(n, ct, rt), big)


def _tiles_of(batch: int, extents: tuple[int, int], one: Callable[..., Stmt], big: bool
              ) -> Stmt:
    """`one(n, i, j)` for every image and tile (i, j) of `extents`: with `big`, one
    parallel loop over all of them, split in contiguous shares (a thread takes
    consecutive tiles of the outer dimension, and so reads the same inputs for all of
    its inner tiles); else serial. A parallel loop over the outer dimension alone left
    a thread idle where it has few tiles: MobileNetV2's 960>320 @7 (5 weight panels, 3
    and 2 on two threads) took 49 us on two threads against 76 on one."""
    if big:
        return parallel_tiles((batch, *extents), one)
    return tile_loop("n", batch, lambda n: nest(("i", "j"), extents, lambda i, j: one(n, i, j)))


def _channel_tiles(words: Buffer | _InPlace, ww: Buffer, flat_out: Buffer, tile: ConvTile,
                   requantized: Epilogue, positions: int, oc_n: int, big: bool,
                   word_at: Callable[[PrimExpr], PrimExpr], intrinsic: str = DOT4_U8S8,
                   out_dtype: str = "", words_out: bool = False) -> Stmt:
    """Tiles of output positions (a broadcast input word each, output position p's at
    `words[n, g, word_at(p)]`) x output channels (the lanes: a row of a weight panel),
    the per-channel requantization along the lanes into bytes of `out_dtype` (default:
    `flat_out`'s). With `words_out`, `flat_out` is int32 words of 4 channels `[N][OC /
    4][positions]` (WORDS_LAYOUT): each row's bytes are 4 channels to a word already.
    The tiles run in parallel panel by panel (`_tiles_of`): a thread keeps its weight
    panel in cache while the positions' words stream past it."""
    batch, groups = int(flat_out.shape[0]), int(ww.shape[1])
    mr, nr = tile.rows, tile.cols
    col_tiles, row_tiles = int(ww.shape[0]), -(-positions // mr)
    # where each row of the tiles reads its words, computed once per call: per tile it
    # was a clamp and a division per row (the grid's row width), which LLVM turned into
    # ~170 instructions of byte-vector arithmetic in every tile (AMD EPYC Zen 4, AVX2:
    # 1x1 512>2048 at 7 x 7 5% faster, 1024>256 at 14 x 14 2%)
    table = Buffer("row_words", (row_tiles * mr,), "int32", "global")
    fill = tile_loop("p", row_tiles * mr, lambda p: Store(
        table, Cast("int32", word_at(p)), (p,)))

    def row_word(p: PrimExpr) -> PrimExpr:
        return Cast(INDEX_DTYPE, table[p])

    # tiles of 4 rows over whole words of each channel's bytes store a channel's 4
    # output bytes as one int32 (a tile of 4 x 16 bytes: 16 stores instead of 64)
    byte_dtype = out_dtype or str(flat_out.dtype)
    out_words = (Buffer("out_words", (batch, oc_n, positions // quant_dot.GROUP), "int32")
                 if word_stores(mr, positions) and byte_dtype in ("uint8", "int8")
                 and not words_out else None)

    def one(n: Var, ct: Var, pt: Var) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, as_expr(0, "int32"), (r, v)), "vectorized"))

        def products(g: PrimExpr, word: Callable[[PrimExpr], PrimExpr]) -> Stmt:
            return tile_loop("r", mr, lambda r: tile_loop("v", nr, lambda v: Store(
                acc, Intrin(intrinsic, (acc[r, v], word(row_word(pt * mr + r)), ww[ct, g, v])),
                (r, v)), "vectorized"), "unrolled")

        step = _steps(words, groups, n, products)

        # requantized along the lanes into a tile of output bytes (contiguous: LLVM
        # vectorizes it), then copied out a channel at a time (its positions are
        # contiguous in the output; an element-wise requantizing scatter costs more than
        # the products of a short K)
        quant = Buffer("quant", (mr, nr), byte_dtype, "local")
        rest = oc_n - (col_tiles - 1) * nr  # channels of the last panel

        def by_panel(body: Callable[[int], Stmt]) -> Stmt:
            # whole panels unguarded (per-channel loads contiguous, not clamped into
            # gathers); the last, partial one its channels only
            return body(nr) if rest == nr else IfThenElse(
                compare("lt", ct, col_tiles - 1), body(nr), body(rest))

        requant = by_panel(lambda lanes: tile_loop("r", mr, lambda r: lanes_loop(
            "v", lanes, lambda v: Store(quant, requantized(acc[r, v], ct * nr + v), (r, v))),
            "unrolled"))

        def byte(r: PrimExpr | int, v: PrimExpr) -> PrimExpr:  # as int32 in [0, 255]
            return unsigned_byte(quant[r, v], byte_dtype)

        def channels(rows: int) -> Stmt:
            if words_out:
                # a row's 4 channels are one word of the output: packed along the row,
                # then stored one each
                group = quant_dot.GROUP
                packed = Buffer("packed", (mr, nr // group), "int32", "local")
                return seq(Allocate(packed), by_panel(lambda lanes: seq(
                    tile_loop("r", rows, lambda r: lanes_loop("j", lanes // group, lambda j: Store(
                        packed, quant_dot.pack_word(lambda b: byte(r, j * group + b)), (r, j))),
                        "unrolled"),
                    tile_loop("r", rows, lambda r: tile_loop("j", lanes // group, lambda j: Store(
                        flat_out, packed[r, j], (n, ct * (nr // group) + j, pt * mr + r))),
                        "unrolled"))))
            if rows == quant_dot.GROUP and out_words is not None:
                # a channel's 4 positions are one word of the output: the words packed
                # along the lanes (vector code), then one store each
                packed = Buffer("packed", (nr,), "int32", "local")
                return seq(Allocate(packed), by_panel(lambda lanes: seq(
                    lanes_loop("v", lanes, lambda v: Store(
                        packed, quant_dot.pack_word(lambda r: byte(r, v)), (v,))),
                    tile_loop("v", lanes, lambda v: Store(
                        out_words, packed[v], (n, ct * nr + v, pt))))))
            return by_panel(lambda lanes: tile_loop("v", lanes, lambda v: tile_loop(
                "r", rows, lambda r: Store(flat_out, quant[r, v], (n, ct * nr + v, pt * mr + r)))))

        last = positions - (row_tiles - 1) * mr
        out = channels(mr) if last == mr else IfThenElse(
            compare("lt", pt, row_tiles - 1), channels(mr), channels(last))
        return seq(Allocate(acc), zero, step, Allocate(quant), requant, out)

    tiles = _tiles_of(batch, (col_tiles, row_tiles), one, big)
    if out_words is not None:
        tiles = seq(DeclBuffer(out_words, flat_out, 0), tiles)
    return seq(Allocate(table), fill, tiles)


OPS.register(CONV_DOT, _TiledConv(CONV_DOT, "anchor", _infer, _build, _reference))
