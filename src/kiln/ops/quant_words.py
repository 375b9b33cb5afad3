"""The word form of packed int8 operands (docs/quantization.md): how the packed ops'
weights are laid out, and how their type rules, tensor-expression definitions and numpy
references read them.

With a dot-product instruction (kiln.kernels.int8.dot) B is stored in *words*: k in
groups of 4, the 4 int8 weights of one column and group packed into one int32 (byte i =
k 4g + i; `words`, undone by `unwords`). Without VNNI the words hold *int16 pairs*
instead (`k_group` 2): two consecutive k of one column per word, each value in a signed
16-bit half. A matrix product's B is stored in panels `[ceil(N / nr)][K][nr]`
(`panelize`), a convolution's weight as words per output channel (`weight_words`) or in
panels of channels (`weight_panels`), k in the order (channel, tap) or (tap, channel)
(`k_order`).

The dot product multiplies *unsigned* bytes of A: an int8 A is shifted by +128
(`a_shift`, `a_byte`) and the shift is corrected like a zero point. With the target
attribute `int8-pairs=saturate` the packed op carries `pairs="saturate"` (`saturates`):
the products of k = 2p and 2p + 1 are added into an int16 clamped to [-32768, 32767]
first (`saturated_sum`, `saturated_matmul`), as onnxruntime's AVX2 kernels do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import Cast, PrimExpr, Select, as_expr, compare, max_, min_
from kiln.ops import te

#: k per packed word (bytes)
GROUP = 4
#: k per packed word of int16 pairs (the exact products without VNNI)
PAIR_GROUP = 2
#: The `pairs` attribute of a packed product whose pair sums saturate to int16
#: (the target attribute `int8-pairs=saturate`); absent: ONNX's exact sums.
SATURATE = "saturate"


def saturates(attrs: Mapping[str, Any]) -> bool:
    """Whether a packed product's attributes ask for saturating pair sums."""
    return attrs.get("pairs") == SATURATE


def word_group(attrs: Mapping[str, Any]) -> int:
    """k per packed word of a dot-form convolution with `attrs` (`k_group`, default 4)."""
    group = int(attrs.get("k_group", GROUP))
    if group not in (GROUP, PAIR_GROUP):
        raise IRError(f"k_group of a dot-form convolution must be {GROUP} or {PAIR_GROUP}, "
                      f"got {group}")
    return group


def clamp16(value: PrimExpr) -> PrimExpr:
    """An int32 pair sum clamped to int16's range (what `vpmaddubsw` stores)."""
    return min_(max_(value, as_expr(-32768, "int32")), as_expr(32767, "int32"))


def saturated_sum(product: Callable[[PrimExpr], PrimExpr], k_total: int) -> PrimExpr:
    """The te reduction of `int8-pairs=saturate`: the int32 `product(k)` of every
    k < `k_total` summed in pairs (k = 2p, 2p + 1), each pair clamped to int16 (an odd
    K's last pair one product)."""
    def at(k: PrimExpr) -> PrimExpr:
        value = product(min_(k, k_total - 1))
        return value if k_total % 2 == 0 else Select(compare("lt", k, k_total), value,
                                                     as_expr(0, "int32"))

    return te.reduce("sum", lambda p: clamp16(at(2 * p) + at(2 * p + 1)),
                     (-(-k_total // 2),), "int32")


def saturated_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a @ b` (int64 `[..., K]` x `[K][N]`) with the products of k = 2p and 2p + 1
    added first and clamped to int16 (`dot4_u8s8_sat16`'s pairs): the reference of the
    saturating products."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    k = a.shape[-1]
    if k % 2:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), np.int64)], axis=-1)
        b = np.concatenate([b, np.zeros((1, b.shape[1]), np.int64)], axis=0)
    total = np.zeros((*a.shape[:-1], b.shape[1]), np.int64)
    for p in range(0, a.shape[-1], 2):
        pair = a[..., p, None] * b[p] + a[..., p + 1, None] * b[p + 1]
        total += np.clip(pair, -32768, 32767)
    return total


def words(b: np.ndarray, group: int = GROUP) -> np.ndarray:
    """int8 `[K][N]` as int32 words `[ceil(K / 4)][N]`, byte i of word g = row 4g + i
    (by value: `sum(byte_i << 8i)`, the top byte signed), rows past K zero. With
    `group` PAIR_GROUP: int16 pairs `[ceil(K / 2)][N]`, half i of word g = row 2g + i
    sign-extended (`(row 2g & 0xFFFF) + (row 2g+1 << 16)`)."""
    k, n = b.shape
    groups = -(-k // group)
    # elements in place (two's complement, as `& 0xFF` would give), each column's rows
    # of a group made adjacent and read as one little-endian word: a copy and a
    # transpose, cheaper on large weights than int64 shifts and sums
    element = np.dtype(np.uint8) if group == GROUP else np.dtype("<i2")
    padded = np.zeros((groups * group, n), element)
    padded[:k] = np.asarray(b).astype(element, casting="unsafe")
    quads = np.ascontiguousarray(padded.reshape(groups, group, n).transpose(0, 2, 1))
    return quads.view(np.dtype("<i4")).reshape(groups, n).astype(np.int32)


def unwords(w: np.ndarray, k: int, group: int = GROUP) -> np.ndarray:
    """`words` undone along axis -2 (any leading axes): int8 rows `[..., K, N]`."""
    u = np.asarray(w).astype(np.uint32).astype(np.int64)
    bits = 32 // group
    parts = [((u >> (bits * i)) & ((1 << bits) - 1)) for i in range(group)]
    stacked = np.stack(parts, axis=-2)  # [..., groups, group, N]
    rows = stacked.reshape(*w.shape[:-2], w.shape[-2] * group, w.shape[-1])[..., :k, :]
    if group == GROUP:
        return rows.astype(np.uint8).view(np.int8)
    return rows.astype(np.uint16).view(np.int16).astype(np.int8)


def a_shift(dtype: str) -> int:
    """What the dot form adds to each byte of an A of `dtype` (unsigned bytes only)."""
    return 128 if dtype == "int8" else 0


def a_byte(value: PrimExpr) -> PrimExpr:
    """An element of A as the dot product's unsigned byte (int32 in [0, 255])."""
    return Cast("int32", value) + a_shift(value.dtype)


def b_byte(word: PrimExpr, k: PrimExpr, group: int = GROUP) -> PrimExpr:
    """Row `k` (of the whole K) of a B word (of `group` k), as a signed int32."""
    bits = 32 // group
    sign = 1 << (bits - 1)
    element = (word >> Cast("int32", (k % group) * bits)) & ((1 << bits) - 1)
    return (element ^ sign) - sign


def panelize(b: np.ndarray, cols: int) -> np.ndarray:
    """B `[K][N]` as panels `[ceil(N / nr)][K][nr]`, nr = min(cols, N), zero-padded: the
    kernel's column tile reads one contiguous panel row per k."""
    k, n = b.shape
    nr = min(cols, n)
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def unpanelize(bp: np.ndarray, n: int) -> np.ndarray:
    """`panelize` undone: B `[K][N]`."""
    panels, k, nr = bp.shape
    return bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]


def k_order(wp: np.ndarray, tap_major: bool) -> np.ndarray:
    """The weight `[OC][C][taps...]` as `[OC][K]`: k = (c, tap), or with `tap_major`
    k = (tap, c), the order of onnxruntime's NHWC im2col and of its symmetric
    convolution kernel (MLAS packs 4 channels of one tap to a word), whose pairs
    `int8-pairs=saturate` reproduces."""
    w = np.asarray(wp)
    if tap_major:
        w = np.moveaxis(w, 1, -1)
    return w.reshape(w.shape[0], -1)


def weight_words(wp: np.ndarray, tap_major: bool = False, group: int = GROUP) -> np.ndarray:
    """The shifted int8 weight `[OC][C][...]` as words `[OC][ceil(K / group)]` (k in the
    order of `k_order`; `words`)."""
    return np.ascontiguousarray(words(k_order(wp, tap_major).T, group).T)


def weight_panels(wp: np.ndarray, nr: int, tap_major: bool = False,
                  group: int = GROUP) -> np.ndarray:
    """The shifted int8 weight `[OC][C][...]` as the channels-as-lanes tile reads it:
    words in panels of `nr` channels, `[ceil(OC / nr)][ceil(K / group)][nr]`
    (zero-padded)."""
    return panelize(weight_words(wp, tap_major, group).T, nr)


def unpacked_weight(ww: np.ndarray, w_shape: Sequence[int], tap_major: bool = False,
                    group: int = GROUP) -> np.ndarray:
    """The int8 weight `[OC][C][...]` of `weight_words` or `weight_panels`."""
    oc, k = int(w_shape[0]), int(np.prod(w_shape[1:]))
    per_channel = np.asarray(ww) if np.ndim(ww) == 2 else unpanelize(np.asarray(ww), oc).T
    flat = unwords(per_channel.T, k, group).T
    if tap_major:
        shape = (oc, *w_shape[2:], int(w_shape[1]))
        return np.moveaxis(flat.reshape(shape), -1, 1)
    return flat.reshape(tuple(w_shape))
