"""`channel_scale_nchwc(x, s)`: `x * s` for an NCHW{b}c tensor `x` `[N][C/b][H][W][b]`
and one value per channel `s` `[N][C/b][1][1][b]` (the scale of a squeeze-and-excitation
block, kiln.transform.nchwc_layout) or `[1][C/b][1][1][b]` (a constant shared by every
image: a pre-activation BatchNorm's scale on a `precision=bf16` target): the broadcast
multiply, built by hand so that
each position is one vector operation along the channel lanes (the generic lowering of
the 5-D broadcast ran it one element at a time; the kernel:
kiln.kernels.conv.channel_scale). Elementwise ops after it fuse into its store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import register_op

CHANNEL_SCALE = "channel_scale_nchwc"
Attrs = Mapping[str, Any]


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, s = types
    if x.ndim != 5 or s.ndim != 5 or tuple(s.shape[2:4]) != (1, 1) or \
            s.shape[1] != x.shape[1] or s.shape[4] != x.shape[4] or x.dtype != s.dtype:
        raise IRError(f"{CHANNEL_SCALE}: x {x.shape} must be NCHW<b>c and s {s.shape} "
                      f"[N or 1][C/b][1][1][b] of the same dtype")
    return x


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, s = inputs
    shared = s.shape[0] == 1 and x.shape[0] != 1  # one scale for every image
    return te.compute(x.shape, lambda n, c, h, w, v: x[n, c, h, w, v] * s[
        0 if shared else n, c, 0, 0, v], x.dtype, "channel_scale")


def _reference(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (x * s).astype(x.dtype)


register_op(CHANNEL_SCALE, pattern="anchor", infer=_infer, compute=_compute,
            reference=_reference)
