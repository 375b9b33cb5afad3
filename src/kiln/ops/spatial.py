"""Window geometry shared by convolution and pooling over 1 to 3 spatial dims.

Attributes use ONNX's spelling and layout: `strides`, `dilations` and
`kernel_shape` have one entry per spatial dim; `pads` lists all begins, then all
ends (`(top, left, bottom, right)` in 2-D). Tensors are channel-first
(N, C, *spatial).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.errors import IRError

SPATIAL_RANKS = (1, 2, 3)
SUFFIX = {1: "1d", 2: "2d", 3: "3d"}


#: The largest kernel size, stride, dilation or pad a window takes. Kernels size their
#: buffers and loops by these (a row buffer spans a stride), so a model's 2**62 stride
#: must be an error, not a loop of 2**62 steps; real models stay far below.
MAX_WINDOW = 1 << 20


def _bounded(key: str, items: tuple[int, ...], least: int) -> tuple[int, ...]:
    bad = [x for x in items if not least <= x <= MAX_WINDOW]
    if bad:
        raise IRError(f"{key} {items}: every value must be in [{least}, {MAX_WINDOW}], "
                      f"got {bad[0]}")
    return items


def ints(attrs: Mapping[str, Any], key: str, count: int, default: int,
         least: int = 1) -> tuple[int, ...]:
    """`attrs[key]` as `count` ints (a scalar is repeated; absent means `default`), each
    in [least, MAX_WINDOW]."""
    v = attrs.get(key)
    if v is None:
        return (default,) * count
    items = tuple(v) if isinstance(v, (tuple, list)) else (v,) * count
    if len(items) != count:
        raise IRError(f"{key} must have {count} value(s) (one per spatial dim), got {items}")
    return _bounded(key, tuple(int(x) for x in items), least)


def pads(attrs: Mapping[str, Any], count: int, least: int = 0
         ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begins, ends) from `pads` = (begin_1..begin_n, end_1..end_n), each in [least,
    MAX_WINDOW]."""
    p = attrs.get("pads")
    if p is None:
        return (0,) * count, (0,) * count
    p = tuple(int(x) for x in p)
    if len(p) != 2 * count:
        raise IRError(f"pads must have {2 * count} values (all begins, then all ends), got {p}")
    _bounded("pads", p, least)
    return p[:count], p[count:]


def spatial_rank(shape: Sequence[Any], what: str) -> int:
    """The number of spatial dims of a channel-first tensor, checked."""
    rank = len(shape) - 2
    if rank not in SPATIAL_RANKS:
        raise IRError(f"{what} expects an (N, C, spatial...) tensor with 1-3 spatial dims, "
                      f"got shape {tuple(shape)}")
    return rank


def conv_out(size: Any, k: int, stride: int, dil: int, lo: int, hi: int) -> int:
    """Output length of a convolution window sweep (floor mode); `size` may be symbolic."""
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


def pool_out(size: Any, k: int, stride: int, dil: int, lo: int, hi: int, ceil: bool) -> int:
    """Output length of a pooling window sweep, ONNX/PyTorch rules for ceil_mode."""
    span = size + lo + hi - dil * (k - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    # In ceil mode the last window must start inside the input or the left padding.
    if ceil and (out - 1) * stride >= size + lo:
        out -= 1
    return out
