"""ONNX's padding attributes of a window (Conv, ConvTranspose, the pools and
QLinearConv): `auto_pad` resolved to the explicit `pads` kiln's operators take
(kiln.ops.spatial's layout: all begins, then all ends)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_text
from kiln.ops.spatial import pads


def onnx_pads(attrs: Mapping[str, Any], spatial: Sequence[Any], kernel: Sequence[int],
              strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    """ONNX `pads`/`auto_pad` resolved to explicit pads (begins..., ends...)."""
    auto = attrs.get("auto_pad", "NOTSET")
    n = len(spatial)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(not isinstance(d, int) for d in spatial):
            raise IRError(f"auto_pad {auto} over symbolic spatial dimensions is not supported "
                          "(the pads would depend on the size)")
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            lo, hi = (small, big) if auto == "SAME_UPPER" else (big, small)
            begins.append(lo)
            ends.append(hi)
        return (*begins, *ends)
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("NOTSET", ""):
        raise IRError(f"unknown auto_pad {auto!r}; known: NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    b, e = pads(attrs, n)
    return (*b, *e)


def nonempty_image(ctx: Any, out: g.Expr, op: str) -> g.Expr:
    """`out`, a convolution's result, after recording that a call fails when its image is
    empty along a symbolic axis (an input smaller than the kernel): onnxruntime refuses
    such a Conv ("Invalid input shape") where a pool gives an empty result. `ctx` is the
    converter's GraphContext."""
    for k, d in enumerate(ctx.tensor_type(out).shape[2:]):
        ctx.require_nonzero(d, f"{op}'s output image is {dim_text(d)} along spatial axis "
                               f"{k} (the input is smaller than the kernel)")
    return out
