"""`layout_transform`: reorder an activation between NCHW and the blocked NCHW{b}c layout.

NCHW{b}c (e.g. `NCHW8c`) stores a 4-D NCHW tensor as 5-D
`[N][ceil(C/b)][H][W][b]`: `b` consecutive channels side by side, the unit a
convolution kernel's vector of output channels stores in one instruction. The
last channel block is padded with zeros up to `b`; the padded channels carry no
meaning (every blocked consumer ignores them, and the way back drops them).

    y = layout_transform(x, src="NCHW", dst="NCHW8c")              # [N, C, H, W] -> 5-D
    x = layout_transform(y, src="NCHW8c", dst="NCHW", channels=C)  # and back

`channels` (the real channel count) is required when leaving a blocked layout.
The `nchwc-layout` graph pass (kiln.transform.nchwc_layout) inserts these
reorders at the edges of the regions it converts to the blocked layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import register_op

LAYOUT_TRANSFORM = "layout_transform"
Attrs = Mapping[str, Any]

_BLOCKED = re.compile(r"NCHW([1-9][0-9]*)c")


def layout_block(layout: str) -> int:
    """The channel block of `layout`: 0 for "NCHW", `b` for "NCHW{b}c"; IRError otherwise."""
    if layout == "NCHW":
        return 0
    m = _BLOCKED.fullmatch(layout)
    if m is None:
        raise IRError(f"{LAYOUT_TRANSFORM}: unknown layout {layout!r} (NCHW or NCHW<b>c)")
    return int(m.group(1))


def blocked_layout(block: int) -> str:
    """The name of the NCHW layout with channels blocked by `block` ("NCHW8c")."""
    return f"NCHW{block}c"


def block_shape(shape: Sequence[Any], block: int) -> tuple[Any, ...]:
    """The NCHW{block}c shape of an NCHW `shape`."""
    n, c, h, w = shape
    return (n, -(-int(c) // block), h, w, block)


def _blocks(attrs: Attrs) -> tuple[int, int]:
    src, dst = layout_block(str(attrs["src"])), layout_block(str(attrs["dst"]))
    if (src == 0) == (dst == 0):
        raise IRError(f"{LAYOUT_TRANSFORM}: converts between NCHW and one blocked layout, "
                      f"got {attrs['src']!r} -> {attrs['dst']!r}")
    return src, dst


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    (x,) = types
    src, dst = _blocks(attrs)
    if dst:
        if x.ndim != 4 or not isinstance(x.shape[1], int):
            raise IRError(f"{LAYOUT_TRANSFORM}: NCHW input must be 4-D with static channels, "
                          f"got {x.shape}")
        return TensorType(block_shape(x.shape, dst), x.dtype)
    if x.ndim != 5 or x.shape[4] != src or not isinstance(x.shape[1], int) or \
            "channels" not in attrs:
        raise IRError(f"{LAYOUT_TRANSFORM}: {attrs['src']} input must be 5-D ending in {src} "
                      f"with a `channels` attribute, got {x.shape}")
    channels = int(attrs["channels"])
    if not (x.shape[1] - 1) * src < channels <= x.shape[1] * src:
        raise IRError(f"{LAYOUT_TRANSFORM}: {channels} channels do not fill {x.shape[1]} "
                      f"blocks of {src}")
    return TensorType((x.shape[0], channels, x.shape[2], x.shape[3]), x.dtype)


def reorder(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor expression of `layout_transform(x, **attrs)` (`inputs` = [x]): also the
    reorder an op on a blocked operand reads or writes through in its own definition."""
    (x,) = inputs
    src, dst = _blocks(attrs)
    if dst:
        c = int(x.shape[1])
        zero = as_expr(0, x.dtype) if "int" in x.dtype else as_expr(0.0, x.dtype)

        def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, w: PrimExpr,
                    v: PrimExpr) -> PrimExpr:
            ch = cb * dst + v
            if c % dst == 0:
                return x[n, ch, h, w]
            # the padded lanes read a valid channel and are replaced by zero
            return select(ch < c, x[n, min_(ch, c - 1), h, w], zero)

        return te.compute(block_shape(x.shape, dst), blocked, x.dtype, "to_blocked")
    channels = int(attrs["channels"])
    return te.compute((x.shape[0], channels, x.shape[2], x.shape[3]),
                      lambda n, c, h, w: x[n, c // src, h, w, c % src], x.dtype, "to_nchw")


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """numpy: NCHW -> NCHW{block}c, channels padded with zeros."""
    n, c, h, w = x.shape
    blocks = -(-c // block)
    padded = np.zeros((n, blocks * block, h, w), dtype=x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, blocks, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """numpy: NCHW{b}c -> NCHW with the first `channels` channels."""
    n, blocks, h, w, block = x.shape
    full = x.transpose(0, 1, 4, 2, 3).reshape(n, blocks * block, h, w)
    return np.ascontiguousarray(full[:, :channels])


def _reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
    _, dst = _blocks(attrs)
    return to_blocked(x, dst) if dst else from_blocked(x, int(attrs["channels"]))


register_op(LAYOUT_TRANSFORM, pattern="injective", infer=_infer, compute=reorder,
            reference=_reference)
