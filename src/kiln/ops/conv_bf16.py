"""`conv2d_nchwc_bf16`: a float32 NCHW{b}c convolution on bfloat16 weights (the target
attribute `precision=bf16`, kiln.target.precision).

The `nchwc-layout` pass rewrites an ungrouped `conv2d_nchwc` whose input is NCHW{b}c
into `conv2d_nchwc_bf16(x, wp[, bias])` where the target asks for bfloat16: the OIHW
weight rounded to bfloat16 (to nearest, ties to even) and packed at compile time into
int32 words of two bfloat16 values, the pairs `vdpbf16ps` multiplies
(`pack_conv_bf16`): `[ceil(co / cb)][P * b][kh][kw][cb]`, `cb` output channels side by
side, where word `p * b + j` pairs input channel `2 * p * b + j` (low half) with
`(2 * p + 1) * b + j` (high half): lane `j` of two consecutive channel blocks, so that
the kernel pairs the input's values from two contiguous runs of `b` (P =
ceil(ceil(ci / b) / 2), channels past the input's zero). `b` is the input's block, or half
of it where the input has an odd count of blocks (`word_block`: lane `j` of a block then
pairs with lane `j + b` of the same block, not with a block of zeros). Attributes: `channels` (the
output channels), `c_in` (the input channels), `tile` = (cb, positions per tile) and
`conv2d`'s. `x` and the result are NCHW{b}c (kiln.ops.layout), the result's padding
channels zero; or, for a region's first layer (fewer input channels than a block: an
RGB image), `x` is NCHW, read with `b` = 1 (word `p` pairs channels `2p` and `2p + 1`),
and the attribute `block` (kiln.ops.conv_direct.NCHW_INPUT_BLOCK) is the result's `b`.
Such a first layer may instead pair neighbouring taps of a kernel row (the attribute
`row_taps`, ROW_TAPS: the kernel's odd width `kw`, where `row_taps_pay`): the weight is
then `[ceil(co / cb)][ci][kh][ceil(kw / 2)][cb]`, word `m` of channel `c` and row `kh`
pairing columns `2m` and `2m + 1` (the last one with zero), which read input columns
`dw` apart: ResNet's 7x7 layer on 3 channels does 3 x 4 products of pairs per kernel
row, not the channel pairs' 2 x 7.

With the attribute `words_input` (WORDS_INPUT: the input image's `(h, w)`), `x` is
instead the input already in the kernel's words: the int32 `[n][P][rows][cols][b]` of
`bf16_words` (below), `rows` and `cols` the input's plus the layer's pads, or
`[n][P][h * w][b]` for an unpadded 1x1 layer (`flat_words`), which the
producing layer stored (kiln.transform.bf16_words): the kernel reads them as its own
converted workspace.

`bf16_words(x)` (attributes `pads`: top, left, bottom, right, and `flat`) turns a
float32 NCHW{b}c tensor of an even count of blocks into those words: word
`(n, p, i, j, v)` pairs lane `v` of blocks `2p` (low half) and `2p + 1` at position
`(i - top, j - left)` (words of two zeros in the border), each value rounded to nearest,
ties to even; `flat` (no pads) numbers the positions `i * w + j`. With `half` (HALF_WORDS)
it takes any count of whole blocks and pairs the halves of each block instead, the word
rows of `b / 2` lanes a reader of such channels converts into (`word_block`: 16, 48 or
144 channels): word `(n, p, i, j, v)` pairs lanes `v` and `v + b / 2` of block `p`. A
`words_input` call reading such words has the attribute `half_words` too: its input's
lanes are half its output block (`conv_blocks`).

The reference rounds the input to bfloat16 as the kernel does (kiln.kernels.conv.bf16)
and sums in float32; the te compute (the fallback where the kernel is not built) reads
the rounded weights and the float32 input. Half the bytes of the float32 weights.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import BF16_PAIR, Const, Intrin, PrimExpr, as_expr, min_, reinterpret, select
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, pack_memory, spatial, te
from kiln.ops.conv_direct import NCHW_INPUT_BLOCK
from kiln.ops.conv_geometry import ConvShape, conv_shape
from kiln.ops.gemm_bf16 import bf16_round
from kiln.ops.nn import conv_compute, conv_infer, conv_ref
from kiln.ops.packed_attrs import recorded_tile
from kiln.ops.registry import register_op

CONV_BF16 = "conv2d_nchwc_bf16"
#: The attribute of a call whose input is already its words (`bf16_words`).
WORDS_INPUT = "words_input"
BF16_WORDS = "bf16_words"
#: The attribute of `bf16_words` pairing the halves of each block (word rows of half a
#: block's lanes), and of a `words_input` call reading such words.
HALF_WORDS = "half_words"
#: The float32 tensor each `bf16_words` compute rounds and its pads, by its result
#: (`words_source`).
_WORD_SOURCES: weakref.WeakKeyDictionary[te.Tensor, WordsSource] = weakref.WeakKeyDictionary()
#: The attribute of an NCHW first layer whose words pair the taps of a kernel row: `kw`.
ROW_TAPS = "row_taps"
Attrs = Mapping[str, Any]


def row_taps_pay(c_in: int, kw: int) -> bool:
    """Whether an NCHW first layer of `c_in` channels and odd kernel width `kw` takes
    fewer words per kernel row with neighbouring taps paired (`ROW_TAPS`) than with its
    channels paired: an odd channel count (an RGB image) pairs its last channel with
    zero at every tap (7 columns: 12 words for 3 channels, not 14)."""
    return kw % 2 == 1 and kw > 1 and c_in * (kw + 1) // 2 < -(-c_in // 2) * kw


def stem_stays_float32(kernel: Sequence[int], attrs: Attrs) -> bool:
    """Whether an NCHW first layer stays on the float32 kernel on a `precision=bf16`
    target: a 3x3 stride-1 one (VGG's 3 > 64 at 224x224), whose channel pairs leave a
    quarter of the lanes on zeros and whose tiles ran at half the float32 kernel's speed
    (docs/performance.md, the bf16 section's VGG-19 round). Strided stems (MobileNetV2's
    3x3/2) and those of `row_taps_pay` stay bfloat16."""
    return tuple(kernel) == (3, 3) and tuple(spatial.ints(attrs, "strides", 2, 1)) == (1, 1)


def pack_row_taps(w: np.ndarray, cb: int) -> np.ndarray:
    """OIHW float32 weight -> int32 words `[ceil(co / cb)][ci][kh][ceil(kw / 2)][cb]`
    pairing kernel columns `2m` (low half) and `2m + 1` (high half; zero past `kw`)."""
    co, ci, kh, kw = w.shape
    blocks, half = -(-co // cb), -(-kw // 2)
    full = pack_memory.zeros((blocks * cb, ci, kh, 2 * half), np.float32)
    full[:co, :, :, :kw] = bf16_round(w)
    bits = full.view(np.uint32)
    words = (bits[..., 0::2] >> 16) | (bits[..., 1::2] & 0xFFFF0000)
    words = words.reshape(blocks, cb, ci, kh, half).transpose(0, 2, 3, 4, 1)
    return pack_memory.copy_of(words).view(np.int32)


def unpack_row_taps(wp: np.ndarray, c_out: int, kw: int) -> np.ndarray:
    """`pack_row_taps` undone: the bfloat16 OIHW weight as float32."""
    blocks, ci, kh, half, cb = wp.shape
    words = np.ascontiguousarray(wp.transpose(0, 4, 1, 2, 3)).view(np.uint32)
    full = np.stack([words << 16, words & 0xFFFF0000], axis=-1).reshape(
        blocks * cb, ci, kh, 2 * half)
    return full.view(np.float32)[:c_out, :, :, :kw].copy()


def word_block(c_in: int, block: int) -> int:
    """The lanes `b` of the word rows of an input of `c_in` channels in blocks of `block`:
    of `block`, a half and a quarter of it, the one of the fewest word rows (the most
    lanes on ties). Rows of `block` pair the last block of an odd count with a block of
    zeros and a partial block's padding lanes with real ones: MobileNetV2's 16 and 144
    channels pair the halves of each block instead (8 lanes), its 24 channels quarters
    (4 lanes: 12 rows, not 16); no product of padding."""
    parts = [block // d for d in (1, 2, 4) if block % d == 0]
    return min(parts, key=lambda b: (pair_blocks(c_in, b) * b, -b))


def pair_blocks(c_in: int, block: int) -> int:
    """P: the pairs of input channel blocks (the last one's upper block zero when the
    input has an odd count of blocks)."""
    blocks = -(-c_in // block)
    return (blocks + 1) // 2


def pack_conv_bf16(w: np.ndarray, cb: int, block: int) -> np.ndarray:
    """OIHW float32 weight -> int32 words `[ceil(co / cb)][P * block][kh][kw][cb]` of
    bfloat16 pairs (see the module docstring; padding channels zero), the input's
    channels paired in blocks of `word_block(ci, block)`."""
    co, ci, kh, kw = w.shape
    block = word_block(ci, block)
    blocks, pairs = -(-co // cb), pair_blocks(ci, block)
    full = pack_memory.zeros((blocks * cb, 2 * pairs * block, kh, kw), np.float32)
    full[:co, :ci] = bf16_round(w)
    bits = full.view(np.uint32).reshape(blocks, cb, pairs, 2, block, kh, kw)
    words = (bits[:, :, :, 0] >> 16) | (bits[:, :, :, 1] & 0xFFFF0000)
    # [blocks][cb][pairs][block][kh][kw] -> [blocks][pairs * block][kh][kw][cb]
    words = words.transpose(0, 2, 3, 4, 5, 1).reshape(blocks, pairs * block, kh, kw, cb)
    return pack_memory.copy_of(words).view(np.int32)


def unpack_conv_bf16(wp: np.ndarray, c_out: int, c_in: int, block: int) -> np.ndarray:
    """`pack_conv_bf16` undone: the bfloat16 OIHW weight as float32."""
    blocks, pb, kh, kw, cb = wp.shape
    block = word_block(c_in, block)
    pairs = pb // block
    words = np.ascontiguousarray(wp).view(np.uint32).reshape(blocks, pairs, block, kh, kw, cb)
    halves = np.stack([words << 16, words & 0xFFFF0000], axis=2)  # [B][P][2][b][kh][kw][cb]
    full = np.ascontiguousarray(halves.transpose(0, 6, 1, 2, 3, 4, 5)).reshape(
        blocks * cb, 2 * pairs * block, kh, kw)
    return full.view(np.float32)[:c_out, :c_in].copy()


def unpack_conv_weight(wp: np.ndarray, attrs: Attrs, block: int) -> np.ndarray:
    """The bfloat16 OIHW weight of a `conv2d_nchwc_bf16` call as float32 (either form)."""
    co, ci, taps = int(attrs["channels"]), int(attrs["c_in"]), int(attrs.get(ROW_TAPS, 0))
    return unpack_row_taps(wp, co, taps) if taps else unpack_conv_bf16(wp, co, ci, block)


def conv_blocks(x: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """`(input block, output block)` of a `conv2d_nchwc_bf16` call on an input of shape
    `x`: an NCHW{b}c input's `b` for both, or 1 and the `NCHW_INPUT_BLOCK` attribute for
    an NCHW input."""
    if len(x) == 4 and NCHW_INPUT_BLOCK in attrs:
        return 1, int(attrs[NCHW_INPUT_BLOCK])
    if attrs.get(HALF_WORDS):  # words of half blocks: their lanes are half the output's
        return int(x[-1]), 2 * int(x[-1])
    return int(x[-1]), int(x[-1])  # NCHW{b}c, or its words (`WORDS_INPUT`)


def flat_words(kernel: Sequence[int], pads: Sequence[int]) -> bool:
    """Whether a layer's words are one row of positions per pair of blocks: an unpadded
    1x1 layer (at stride 1 its tiles then read their positions at constant distances)."""
    return tuple(kernel) == (1, 1) and not any(pads)


def words_shape(x: Sequence[Any], pads: Sequence[int], flat: bool,
                half: bool = False) -> tuple[Any, ...]:
    """The shape of `bf16_words` of a float32 NCHW{b}c tensor of shape `x` under `pads`
    (top, left, bottom, right), `flat` or not, of pairs of blocks or (`half`) of the
    halves of each block."""
    rows, lanes = (x[1], x[4] // 2) if half else (x[1] // 2, x[4])
    if flat:
        return (x[0], rows, x[2] * x[3], lanes)
    top, left, bottom, right = pads
    return (x[0], rows, x[2] + top + bottom, x[3] + left + right, lanes)


def _words_source_shape(x: tuple[Any, ...], dtype: str, attrs: Attrs) -> tuple[Any, ...]:
    """The float32 NCHW{b}c shape of the tensor whose `bf16_words` (under the call's pads)
    a `WORDS_INPUT` call reads as its input `x` (checked)."""
    ci = int(attrs["c_in"])
    h, w = (int(d) for d in attrs[WORDS_INPUT])
    begins, ends = spatial.pads(attrs, 2)
    b = int(x[-1])
    source = (x[0], 2 * int(x[1]), h, w, b)
    if (dtype != "int32" or NCHW_INPUT_BLOCK in attrs or ROW_TAPS in attrs
            or word_block(ci, b) != b or x[1] != pair_blocks(ci, b)
            or (attrs.get(HALF_WORDS) and ci % (2 * b))
            or tuple(x) != words_shape(source, (*begins, *ends), len(x) == 4)):
        raise IRError(f"{CONV_BF16}: a {WORDS_INPUT} input must be int32 [n][P][rows][cols]"
                      f"[b] (or [n][P][rows * cols][b]) of whole pairs of blocks holding {ci} "
                      f"channels of {h}x{w} under the pads, got {dtype} {x}")
    return source


def bf16_conv_shape(types: Sequence[Any], attrs: Attrs) -> ConvShape:
    """The (NCHW) geometry of a `conv2d_nchwc_bf16` call on `types` (checked)."""
    x = tuple(types[0].shape)
    dtype = types[0].dtype
    if attrs.get(WORDS_INPUT):
        x, dtype = _words_source_shape(x, dtype, attrs), "float32"
    wp = tuple(int(d) for d in types[1].shape)
    co, ci = int(attrs["channels"]), int(attrs["c_in"])
    nchw = len(x) == 4 and NCHW_INPUT_BLOCK in attrs
    blocked = len(x) == 5 and NCHW_INPUT_BLOCK not in attrs
    a, b = conv_blocks(x, attrs) if nchw or blocked else (0, 0)
    taps = int(attrs.get(ROW_TAPS, 0))
    if taps and not nchw:
        raise IRError(f"{CONV_BF16}: attribute {ROW_TAPS} needs an NCHW input (attribute "
                      f"{NCHW_INPUT_BLOCK}), got {x}")
    if not a or int(x[1]) != -(-ci // a) or dtype != "float32":
        raise IRError(f"{CONV_BF16}: input must be float32 NCHW<b>c (or NCHW with attribute "
                      f"{NCHW_INPUT_BLOCK}=b) holding {ci} channels, "
                      f"got {dtype} {x}")
    words = pair_blocks(ci, word_block(ci, a)) * word_block(ci, a) if a else 0
    if taps:  # `pack_row_taps`: one word row per channel
        words = ci
    if (len(wp) != 5 or types[1].dtype != "int32" or wp[1] != words
            or (taps and wp[3] != (taps + 1) // 2)
            or not (wp[0] - 1) * wp[4] < co <= wp[0] * wp[4] or wp[4] % b
            or int(attrs.get("group", 1)) != 1):
        raise IRError(f"{CONV_BF16}: packed weight must be int32 [co/cb]"
                      f"[{words}][kh][{'(kw + 1) / 2' if taps else 'kw'}][cb] "
                      f"(cb a multiple of {b}) "
                      f"holding {co} output channels, ungrouped; got {types[1].dtype} {wp}")
    tile = recorded_tile(attrs, 2, CONV_BF16)
    if tile is not None and tile[0] != wp[4]:
        raise IRError(f"{CONV_BF16}: tile {tile} does not match the packed channel tile "
                      f"{wp[4]}")
    return conv_shape((x[0], ci, x[2], x[3]), co, (wp[2], taps) if taps else wp[2:4], attrs)


def _conv_attrs(attrs: Attrs) -> dict[str, Any]:
    return {k: v for k, v in attrs.items()
            if k not in ("channels", "c_in", "tile", NCHW_INPUT_BLOCK, ROW_TAPS, WORDS_INPUT,
                         HALF_WORDS)}


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    s = bf16_conv_shape(types, attrs)
    x = types[0]
    nchw = TensorType((x.shape[0], s.c_in, s.h, s.w), "float32")
    out = conv_infer([nchw, TensorType((s.c_out, s.c_in, s.kh, s.kw), "float32"),
                      *types[2:]], _conv_attrs(attrs))
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, conv_blocks(x.shape, attrs)[1]),
                      "float32")


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    s = bf16_conv_shape(inputs, attrs)
    x, wp = inputs[0], inputs[1]
    a, b = conv_blocks(x.shape, attrs)
    cb, a = int(wp.shape[4]), word_block(s.c_in, a)
    if attrs.get(WORDS_INPUT):
        top, left = s.pads[:2]
        lanes = int(x.shape[-1])  # the words' lanes: `b`, or half of it (HALF_WORDS)

        def at(n: PrimExpr, c: PrimExpr, h: PrimExpr, w: PrimExpr) -> PrimExpr:
            if len(x.shape) == 4:
                return x[n, c // (2 * lanes), h * s.w + w, c % lanes]
            return x[n, c // (2 * lanes), h + top, w + left, c % lanes]

        plain = te.compute((x.shape[0], s.c_in, s.h, s.w), lambda n, c, h, w: word_half(
            at(n, c, h, w), (c // lanes) % 2 >= 1), "float32", "x_nchw")
    else:
        plain = x if len(x.shape) == 4 else te.compute(
            (x.shape[0], s.c_in, x.shape[2], x.shape[3]),
            lambda n, c, h, w: x[n, c // b, h, w, c % b], "float32", "x_nchw")

    taps = int(attrs.get(ROW_TAPS, 0))

    def weight(o: PrimExpr, i: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> PrimExpr:
        if taps:  # columns 2m and 2m + 1 of channel `i`'s row `kh`
            word, high = wp[o // cb, i, kh, kw // 2, o % cb], kw % 2 >= 1
        else:
            word = wp[o // cb, (i // (2 * a)) * a + i % a, kh, kw, o % cb]
            high = i % (2 * a) >= a
        return word_half(word, high)

    w = te.compute((s.c_out, s.c_in, s.kh, s.kw), weight, "float32", "weight")
    out = conv_compute([plain, w, *inputs[2:]], _conv_attrs(attrs))
    co = s.c_out

    def blocked(n: PrimExpr, ob: PrimExpr, h: PrimExpr, w_: PrimExpr, v: PrimExpr
                ) -> PrimExpr:
        ch = ob * b + v
        return select(ch < co, out[n, min_(ch, co - 1), h, w_], as_expr(0.0, "float32"))

    return te.compute(layout.block_shape(out.shape, b), blocked, "float32", "conv_bf16")


def word_half(word: PrimExpr, high: PrimExpr) -> PrimExpr:
    """The bfloat16 value in the low (`high` false) or high half of the int32 `word`, as
    float32."""
    bits = select(high, word & Const(-0x10000, "int32"), word << Const(16, "int32"))
    return reinterpret(bits, "float32")


def _ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
         **attrs: Any) -> np.ndarray:
    ci = int(attrs["c_in"])
    if attrs.get(WORDS_INPUT):
        x = words_values(x, attrs)
    a, block = conv_blocks(x.shape, attrs)
    plain = bf16_round(x if x.ndim == 4 else layout.from_blocked(x, ci))
    w = unpack_conv_weight(wp, attrs, a)
    return layout.to_blocked(conv_ref(plain, w, b, **_conv_attrs(attrs)), block)


register_op(CONV_BF16, pattern="anchor", infer=_infer, compute=_compute, reference=_ref)


def words_values(words: np.ndarray, attrs: Attrs) -> np.ndarray:
    """The float32 NCHW{b}c values (bfloat16) a `WORDS_INPUT` call reads from `words`
    (the border cut off under the call's pads)."""
    begins, ends = spatial.pads(attrs, 2)
    if words.ndim == 4:
        words = words.reshape(*words.shape[:2], *attrs[WORDS_INPUT], words.shape[3])
    n, pairs, rows, cols = words.shape[:4]
    inner = words[:, :, begins[0]:rows - ends[0], begins[1]:cols - ends[1]]
    bits = np.ascontiguousarray(inner).view(np.uint32)
    halves = np.stack([bits << 16, bits & 0xFFFF0000], axis=2)  # [n][P][2][h][w][b]
    return halves.reshape(n, 2 * pairs, *halves.shape[3:]).view(np.float32)


def flat_words_shape(x: TensorType | te.Tensor, attrs: Attrs, op: str) -> tuple[Any, ...]:
    """The float32 NCHW{b}c shape of the values whose flat words (`bf16_words` `flat`) a
    call of `op` with `WORDS_INPUT` (`(h, w)`) reads as `x`: int32 `[N][C/2b][h * w][b]`,
    or, with `HALF_WORDS`, `[N][C/b][h * w][b/2]` (checked)."""
    shape = tuple(x.shape)
    h, w = (int(d) for d in attrs[WORDS_INPUT])
    if x.dtype != "int32" or len(shape) != 4 or shape[2] != h * w or not isinstance(
            shape[1], int):
        raise IRError(f"{op}: a {WORDS_INPUT} input must be int32 [N][C/2b][{h} * {w}][b] "
                      f"(or [N][C/b][{h} * {w}][b/2] with {HALF_WORDS}), got {x.dtype} "
                      f"{shape}")
    if attrs.get(HALF_WORDS):
        return (shape[0], shape[1], h, w, 2 * int(cast(int, shape[3])))
    return (shape[0], 2 * shape[1], h, w, shape[3])


def flat_words_values(words: np.ndarray, attrs: Attrs) -> np.ndarray:
    """The float32 NCHW{b}c values (bfloat16) of the flat words `flat_words_shape`
    describes: blocks `2p` (low halves) and `2p + 1`, or (`HALF_WORDS`) lanes `v` (low)
    and `v + b/2` of block `p`."""
    bits = np.ascontiguousarray(words).view(np.uint32).reshape(
        *words.shape[:2], *attrs[WORDS_INPUT], words.shape[3])
    if attrs.get(HALF_WORDS):
        return np.concatenate([bits << 16, bits & 0xFFFF0000], axis=-1).view(np.float32)
    halves = np.stack([bits << 16, bits & 0xFFFF0000], axis=2)
    return halves.reshape(words.shape[0], 2 * words.shape[1], *bits.shape[2:]).view(np.float32)


@dataclass(frozen=True)
class WordsSource:
    """What a `bf16_words` compute rounds: the float32 NCHW{b}c `tensor`, into a border of
    `pads` (top, left, bottom, right)."""

    tensor: te.Tensor
    pads: tuple[int, int, int, int]
    flat: bool
    #: The words pair the halves of each block (HALF_WORDS), not pairs of blocks.
    half: bool = False


def words_source(words: te.Tensor) -> WordsSource | None:
    """What the `bf16_words` compute `words` rounds, or None where `words` is no such
    compute (a kernel storing words takes the tensor as its epilogue's result)."""
    return _WORD_SOURCES.get(words)


def _words_pads(attrs: Attrs) -> tuple[int, int, int, int]:
    top, left, bottom, right = (int(p) for p in attrs["pads"])
    return top, left, bottom, right


def _words_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    half = bool(attrs.get(HALF_WORDS))
    if (x.ndim != 5 or x.dtype != "float32" or not isinstance(x.shape[1], int)
            or (x.shape[1] % 2 and not half) or (half and x.shape[4] % 2)):
        raise IRError(f"{BF16_WORDS}: input must be float32 NCHW<b>c of an even count of "
                      f"blocks (any count with {HALF_WORDS}), got {x.dtype} {x.shape}")
    return TensorType(words_shape(x.shape, _words_pads(attrs), bool(attrs.get("flat")),
                                  half), "int32")


def _words_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x = inputs[0]
    top, left = _words_pads(attrs)[:2]
    h, w = x.shape[2], x.shape[3]
    zero = as_expr(0.0, "float32")
    half = bool(attrs.get(HALF_WORDS))
    step = int(x.shape[4]) // 2

    def pair(n: PrimExpr, p: PrimExpr, r: PrimExpr, c: PrimExpr, v: PrimExpr
             ) -> tuple[PrimExpr, PrimExpr]:
        if half:  # lanes `v` and `v + b / 2` of block `p`
            return x[n, p, r, c, v], x[n, p, r, c, v + step]
        return x[n, 2 * p, r, c, v], x[n, 2 * p + 1, r, c, v]

    def word(n: PrimExpr, p: PrimExpr, i: PrimExpr, j: PrimExpr, v: PrimExpr) -> PrimExpr:
        r, c = i - top, j - left
        inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        lo, hi = pair(n, p, te.clamp_index(r, h), te.clamp_index(c, w), v)
        return Intrin(BF16_PAIR, (select(inside, lo, zero), select(inside, hi, zero)))

    def flat_word(n: PrimExpr, p: PrimExpr, k: PrimExpr, v: PrimExpr) -> PrimExpr:
        return Intrin(BF16_PAIR, pair(n, p, k // w, k % w, v))

    flat, pads = bool(attrs.get("flat")), _words_pads(attrs)
    out = te.compute(words_shape(x.shape, pads, flat, half), flat_word if flat else word,
                     "int32", BF16_WORDS)
    _WORD_SOURCES[out] = WordsSource(x, pads, flat, half)
    return out


def _words_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    top, left, bottom, right = _words_pads(attrs)
    half = bool(attrs.get(HALF_WORDS))
    n, blocks, h, w, b = x.shape
    bits = bf16_round(x).view(np.uint32)
    if half:  # [n][C/b][h][w][2][b/2]: the halves of each block
        lo, hi = (bits.reshape(n, blocks, h, w, 2, b // 2)[..., k, :] for k in (0, 1))
    else:
        lo, hi = (bits.reshape(n, blocks // 2, 2, h, w, b)[:, :, k] for k in (0, 1))
    words = (lo >> 16) | (hi & 0xFFFF0000)
    out = np.zeros(words_shape(x.shape, (top, left, bottom, right), False, half), np.uint32)
    out[:, :, top:top + h, left:left + w] = words
    flat = words_shape(x.shape, (0, 0, 0, 0), True, half)
    return out.view(np.int32).reshape(flat) if attrs.get("flat") else out.view(np.int32)


register_op(BF16_WORDS, pattern="injective", infer=_words_infer, compute=_words_compute,
            reference=_words_ref)
