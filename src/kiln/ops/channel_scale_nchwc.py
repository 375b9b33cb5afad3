"""`channel_scale_nchwc(x, s)`: `x * s` for an NCHW{b}c tensor `x` `[N][C/b][H][W][b]`
and one value per channel `s` `[N][C/b][1][1][b]` (the scale of a squeeze-and-excitation
block, kiln.transform.nchwc_layout): the broadcast multiply, built by hand so that
each position is one vector operation along the channel lanes (the generic lowering of
the 5-D broadcast ran it one element at a time). Elementwise ops after it fuse into
its store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, PrimFunc, Stmt, Store
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.registry import OPS, HandBuiltOp
from kiln.target.isa import ISA

CHANNEL_SCALE = "channel_scale_nchwc"
Attrs = Mapping[str, Any]


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, s = types
    if x.ndim != 5 or s.ndim != 5 or tuple(s.shape[2:4]) != (1, 1) or \
            s.shape[1] != x.shape[1] or s.shape[4] != x.shape[4] or x.dtype != s.dtype:
        raise IRError(f"{CHANNEL_SCALE}: x {x.shape} must be NCHW<b>c and s {s.shape} "
                      f"[N][C/b][1][1][b] of the same dtype")
    return x


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, s = inputs
    return te.compute(x.shape, lambda n, c, h, w, v: x[n, c, h, w, v] * s[n, c, 0, 0, v],
                      x.dtype, "channel_scale")


def _reference(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (x * s).astype(x.dtype)


@dataclass(frozen=True)
class ChannelScaleOp(HandBuiltOp):
    """The op of this module (float32, static channels and image sizes)."""

    supports_symbolic: ClassVar[bool] = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The vector kernel (see `HandBuiltOp.lower_fused`)."""
        from kiln.ops.epilogue import fused_store
        from kiln.ops.kernels.tiles import (
            const,
            lanes_loop,
            loop,
            parallel_tiles,
            parallel_when,
        )

        x, s = args
        if x.dtype != "float32" or not all(isinstance(d, int) for d in x.shape[1:]):
            return None
        n, cb, h, w, b = x.shape
        store = fused_store(params, anchor, result, tuple(x.shape))
        if store is None:
            return None
        xb, sb = store.buffers[x], store.buffers[s]

        def row(i: PrimExpr, c: PrimExpr, r: PrimExpr) -> Stmt:
            def lane(q: PrimExpr, v: PrimExpr) -> Stmt:
                idx = (i, c, r, q, v)
                scale = sb[i, c, const(0), const(0), v]
                return Store(store.out, store.epilogue(xb[idx] * scale, idx), idx)

            return loop("q", w, lambda q: lanes_loop("v", b, lambda v: lane(q, v)))

        stmt = parallel_when(lambda: parallel_tiles((n, cb, h), row), n * cb * h * w * b,
                             "element", isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), stmt, {})


OPS.register(CHANNEL_SCALE, ChannelScaleOp(CHANNEL_SCALE, "anchor", _infer, _compute,
                                           _reference))
