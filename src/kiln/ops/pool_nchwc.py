"""`pool2d_nchwc`: a 2-D max / average pool applied to an NCHW{b}c tensor (kiln.ops.layout).

    y = pool2d_nchwc(x, pool="max_pool2d", kernel_shape=..., strides=..., pads=..., ...)

`pool` names the NCHW pooling op (`max_pool2d` or `avg_pool2d`, kiln.ops.pool) whose
attributes follow; the window moves over dims 2 and 3 and every channel lane of
every block is pooled independently (padding lanes too: their values carry no
meaning). The definition reuses the NCHW op's on a channel-merged view of the
blocked tensor, so both agree by construction. A float32 pool of static shape runs
the hand-built kernel of kiln.kernels.pool.nchwc (a vector of the block's lanes per
output position); the definition stays the fallback. The `nchwc-layout` pass
(kiln.transform.nchwc_layout) introduces it inside blocked regions.

With the attribute `words_input` (WORDS_INPUT, the input's `(h, w)`), `x` is instead the
int32 words `[N][C/2b][H * W][b]` its producer stored (`bf16_words` of an even count of
blocks, `flat`, kiln.ops.conv_bf16: lane `v` of blocks `2p`, low half, and `2p + 1`),
pooled as their bfloat16 values (kiln.transform.bf16_pool_words: ResNet's stem and
max pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, te
from kiln.ops.conv_bf16 import WORDS_INPUT, flat_words_shape, flat_words_values, word_half
from kiln.ops.registry import get_op, register_op

POOL_NCHWC = "pool2d_nchwc"
POOLS = ("max_pool2d", "avg_pool2d")
Attrs = Mapping[str, Any]


def merged_shape(shape: Sequence[Any]) -> tuple[Any, ...]:
    """The NCHW shape of the NCHW<b>c `shape` with its channel blocks merged."""
    if len(shape) != 5:
        raise IRError(f"{POOL_NCHWC}: input must be NCHW<b>c (5-D), got {tuple(shape)}")
    n, cb, h, w, b = shape
    return (n, cb * b, h, w)


def split_attrs(attrs: Attrs) -> tuple[str, dict[str, Any]]:
    """The NCHW pooling op that `attrs` names (`pool`) and its attributes (the rest but
    `words_input`)."""
    pool = str(attrs.get("pool", ""))
    if pool not in POOLS:
        raise IRError(f"{POOL_NCHWC}: `pool` must be one of {POOLS}, got {pool!r}")
    return pool, {k: v for k, v in attrs.items() if k not in ("pool", WORDS_INPUT)}


def input_shape(x: TensorType | te.Tensor, attrs: Attrs) -> tuple[Any, ...]:
    """The float32 NCHW{b}c shape of a call's input `x`: its own, or that of the values
    whose words it is (`WORDS_INPUT`, checked)."""
    return flat_words_shape(x, attrs, POOL_NCHWC) if attrs.get(WORDS_INPUT) else tuple(
        x.shape)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    pool, rest = split_attrs(attrs)
    (x,) = types
    shape = input_shape(x, attrs)
    out = get_op(pool).infer([TensorType(merged_shape(shape), "float32" if attrs.get(
        WORDS_INPUT) else x.dtype)], rest)
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, cast(int, shape[4])), out.dtype)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    pool, rest = split_attrs(attrs)
    (x,) = inputs
    shape = input_shape(x, attrs)
    b = shape[4]

    def value(n: PrimExpr, c: PrimExpr, h: PrimExpr, w: PrimExpr) -> PrimExpr:
        if attrs.get(WORDS_INPUT):
            word = x[n, c // (2 * b), h * shape[3] + w, c % b]
            return word_half(word, (c // b) % 2 >= 1)
        return x[n, c // b, h, w, c % b]

    dtype = "float32" if attrs.get(WORDS_INPUT) else x.dtype
    merged = te.compute(merged_shape(shape), value, dtype, "x_merged")
    out = get_op(pool).compute([merged], rest)
    assert isinstance(out, te.Tensor)

    def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, w: PrimExpr, v: PrimExpr) -> PrimExpr:
        return out[n, cb * b + v, h, w]

    return te.compute(layout.block_shape(out.shape, b), blocked, dtype, "pool_nchwc")


def _reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
    pool, rest = split_attrs(attrs)
    if attrs.get(WORDS_INPUT):  # [N][P][H * W][b] -> the blocks 2p (low) and 2p + 1 (high)
        x = flat_words_values(x, attrs)
    cb, b = x.shape[1], x.shape[4]
    plain = layout.from_blocked(x, cb * b)
    return layout.to_blocked(get_op(pool).reference(plain, **rest), b)


register_op(POOL_NCHWC, pattern="opaque", infer=_infer, compute=_compute, reference=_reference)
