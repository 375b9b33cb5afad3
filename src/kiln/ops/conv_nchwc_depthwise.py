"""`conv2d_nchwc_depthwise(x, wp[, bias])`: a depthwise 2-D convolution on activations in
the blocked NCHW{b}c layout (kiln.ops.layout).

`x` is `[N][ceil(C/b)][H][W][b]`, `wp` the depthwise weight packed into
`[ceil(C/b)][kh][kw][b]` (`pack_weight`: the `b` channels of a block side by side,
zero-padded), `bias` (optional) `[ceil(C/b) * b]` zero-padded (`pack_bias`); attribute
`channels` is the real channel count C, `tile` the output positions per register tile
(kiln.kernels.conv.nchwc_depthwise), the others `conv2d`'s (strides, pads, dilations,
`group` = C). The result is `[N][ceil(C/b)][OH][OW][b]` with its padding channels zero.
The `nchwc-layout` pass (kiln.transform.nchwc_layout) introduces it in place of a
`conv2d_depthwise` whose input is in a blocked region: a vector is then `b` channels
of one position, so a stride-2 or 7-pixel-wide layer fills its vectors as a
stride-1 wide one does, and no padded copy of the input is made.

With the attribute `words_input` (WORDS_INPUT, the input's `(h, w)`), `x` is instead
the int32 words `[N][C/2b][H * W][b]` its producer stored (`bf16_words` of an even count
of blocks, `flat`, kiln.ops.conv_bf16): lane `v` of blocks `2p` (low half) and
`2p + 1` (high half) as bfloat16 (kiln.transform.bf16_depthwise_words). With
`half_words` (HALF_WORDS) too, `x` is the words of half blocks `[N][C/b][H * W][b/2]`
(lanes `v` and `v + b/2` of block `p` in word `v`: an odd count of blocks, MobileNetV2's
144 channels), and `wp` and `bias` hold each block's lanes in the words' memory order
(`halves_order`: channel `v` then `v + b/2`), the order a kernel reading the words as
`b` bfloat16 values of one position sums them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import weight_origin as wo
from kiln.ir.tensor import PrimExpr, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, te
from kiln.ops.conv_bf16 import (
    HALF_WORDS,
    WORDS_INPUT,
    flat_words_shape,
    flat_words_values,
    word_half,
)
from kiln.ops.nn import conv_compute, conv_infer, conv_ref
from kiln.ops.packed_attrs import recorded_tile
from kiln.ops.registry import register_op

NCHWC_DEPTHWISE = "conv2d_nchwc_depthwise"
Attrs = Mapping[str, Any]


def pack_weight(w: np.ndarray, block: int) -> np.ndarray:
    """OIHW depthwise weight `(C, 1, kh, kw)` -> `[ceil(C/block)][kh][kw][block]`,
    channels padded with zeros."""
    c, _, kh, kw = w.shape
    blocks = -(-c // block)
    padded = np.zeros((blocks * block, kh, kw), dtype=w.dtype)
    padded[:c] = w[:, 0]
    return np.ascontiguousarray(padded.reshape(blocks, block, kh, kw).transpose(0, 2, 3, 1))


def pack_weight_origin(source: wo.Origin | None, shape: Sequence[int], block: int
                       ) -> wo.Origin | None:
    """The replay of `pack_weight` on a weight of `shape`."""
    c, _, kh, kw = (int(d) for d in shape)
    blocks = -(-c // block)
    flat = wo.step("reshape", source, shape=(c, kh, kw))
    padded = wo.padded(flat, (c, kh, kw), 0, blocks * block)
    return wo.step("transpose", wo.step("reshape", padded, shape=(blocks, block, kh, kw)),
                   perm=(0, 2, 3, 1))


def pack_bias_origin(source: wo.Origin | None, size: int, block: int) -> wo.Origin | None:
    """The replay of `pack_bias` on a bias of `size` channels."""
    return wo.padded(source, (size,), 0, -(-size // block) * block)


def unpack_weight(wp: np.ndarray, channels: int) -> np.ndarray:
    """`pack_weight` undone: the OIHW weight `(channels, 1, kh, kw)`."""
    blocks, kh, kw, block = wp.shape
    w = wp.transpose(0, 3, 1, 2).reshape(blocks * block, 1, kh, kw)[:channels]
    return np.ascontiguousarray(w)


def pack_bias(bias: np.ndarray, block: int) -> np.ndarray:
    """A per-channel bias padded with zeros to whole blocks of `block`."""
    padded = np.zeros(-(-bias.shape[0] // block) * block, dtype=bias.dtype)
    padded[:bias.shape[0]] = bias
    return padded


def halves_order(block: int) -> np.ndarray:
    """The channel (within its block) of each lane of a `HALF_WORDS` call's packed weight
    and bias: the words' memory order, channel `v` (low half of word `v`) then `v + b/2`."""
    lanes = np.arange(block)
    return lanes // 2 + (lanes % 2) * (block // 2)


def halves_lane(channel: PrimExpr, block: int) -> PrimExpr:
    """The lane of `channel` (within its block) in `halves_order`."""
    return (channel % (block // 2)) * 2 + channel // (block // 2)


def input_shape(x: TensorType | te.Tensor, attrs: Attrs) -> tuple[Any, ...]:
    """The float32 NCHW{b}c shape of a call's input `x`: its own, or that of the values
    whose words it is (`WORDS_INPUT`, checked)."""
    return flat_words_shape(x, attrs, NCHWC_DEPTHWISE) if attrs.get(WORDS_INPUT) else tuple(
        x.shape)


def _channels(types: Sequence[Any], attrs: Attrs) -> tuple[int, int, int, int]:
    """(C, b, kh, kw) of a call, checked against its blocked input and packed weight."""
    x, wp = input_shape(types[0], attrs), tuple(types[1].shape)
    if "channels" not in attrs:
        raise IRError(f"{NCHWC_DEPTHWISE}: needs the `channels` attribute")
    c = int(attrs["channels"])
    if len(x) != 5 or len(wp) != 4 or not isinstance(x[1], int) or int(x[4]) != int(wp[3]) \
            or int(x[1]) != int(wp[0]) or not (int(x[1]) - 1) * int(x[4]) < c <= int(
                x[1]) * int(x[4]) or int(attrs.get("group", 1)) != c:
        raise IRError(f"{NCHWC_DEPTHWISE}: input {x} must be NCHW<b>c and the weight {wp} "
                      f"[C/b][kh][kw][b] of {c} channels (`group` = `channels`)")
    if len(types) > 2 and tuple(types[2].shape) != (int(x[1]) * int(x[4]),):
        raise IRError(f"{NCHWC_DEPTHWISE}: bias {tuple(types[2].shape)} must hold "
                      f"{int(x[1]) * int(x[4])} channels (padded to whole blocks)")
    recorded_tile(attrs, 1, NCHWC_DEPTHWISE)
    return c, int(x[4]), int(wp[1]), int(wp[2])


def _plain_types(types: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    c, _, kh, kw = _channels(types, attrs)
    x = input_shape(types[0], attrs)
    return [TensorType((x[0], c, x[2], x[3]), types[1].dtype),
            TensorType((c, 1, kh, kw), types[1].dtype),
            *(TensorType((c,), t.dtype) for t in types[2:])]


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    out = conv_infer(_plain_types(types, attrs), attrs)
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, cast(int, types[0].shape[-1])), "float32")


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    c, b, kh, kw = _channels(inputs, attrs)
    x, wp = inputs[0], inputs[1]
    shape = input_shape(x, attrs)

    halves = bool(attrs.get(HALF_WORDS))

    def value(n: PrimExpr, ch: PrimExpr, h: PrimExpr, w: PrimExpr) -> PrimExpr:
        if halves:  # lanes `v` (low) and `v + b/2` (high) of block `p` in word `v`
            word = x[n, ch // b, h * shape[3] + w, ch % (b // 2)]
            return word_half(word, ch % b >= b // 2)
        if attrs.get(WORDS_INPUT):
            word = x[n, ch // (2 * b), h * shape[3] + w, ch % b]
            return word_half(word, (ch // b) % 2 >= 1)
        return x[n, ch // b, h, w, ch % b]

    def lane(o: PrimExpr) -> PrimExpr:
        return halves_lane(o % b, b) if halves else o % b

    plain = te.compute((x.shape[0], c, shape[2], shape[3]), value, wp.dtype, "x_nchw")
    w = te.compute((c, 1, kh, kw), lambda o, i, p, q: wp[o // b, p, q, lane(o)], wp.dtype,
                   "weight")
    rest = [te.compute((c,), lambda o, t=t: t[o // b * b + lane(o)], t.dtype, "bias")
            for t in inputs[2:]]
    out = conv_compute([plain, w, *rest], attrs)

    def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, ow: PrimExpr, v: PrimExpr) -> PrimExpr:
        ch = cb * b + v
        if c % b == 0:
            return out[n, ch, h, ow]
        return select(ch < c, out[n, min_(ch, c - 1), h, ow], as_expr(0.0, out.dtype))

    return te.compute(layout.block_shape(out.shape, b), blocked, out.dtype, "dw_nchwc")


def _reference(x: np.ndarray, wp: np.ndarray, bias: np.ndarray | None = None,
               **attrs: Any) -> np.ndarray:
    c = int(attrs["channels"])
    if attrs.get(WORDS_INPUT):  # the words' float32 blocks
        x = flat_words_values(x, attrs)
        if attrs.get(HALF_WORDS):  # the weight and bias back in the channels' order
            inverse = np.argsort(halves_order(int(x.shape[4])))  # lane of each channel
            wp = wp[..., inverse]
            if bias is not None:
                bias = bias.reshape(-1, x.shape[4])[:, inverse].reshape(-1)
        attrs = {k: v for k, v in attrs.items() if k not in (WORDS_INPUT, HALF_WORDS)}
    out = conv_ref(layout.from_blocked(x, c), unpack_weight(wp, c),
                   None if bias is None else bias[:c], **attrs)
    return layout.to_blocked(out, int(x.shape[4]))


register_op(NCHWC_DEPTHWISE, pattern="anchor", infer=_infer, compute=_compute,
            reference=_reference)
