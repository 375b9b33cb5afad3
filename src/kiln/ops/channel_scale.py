"""The squeeze-excite channel scale: `multiply` of a float32 NCHW activation by one value
per (batch, channel), shape `[N or 1, C, 1, 1]` or `[C, 1, 1]` (either operand order).

The tensor-expression loop nest of that broadcast is scalar code (a serial loop per
dimension). The hand-built kernel is the same nest with each row one vector loop
(`T.vectorized`, which the vectorize-loops pass makes vector code): the channel's
scale is loaded once per row and broadcast. An elementwise tail FuseOps groups after it
is applied as each value is stored. Other shapes and dtypes keep the
tensor-expression definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.analysis.vector_loops import MAX_LANES
from kiln.ir.tensor import PrimExpr, PrimFunc, Stmt, Store, seq
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index
from kiln.ops.epilogue import fused_store
from kiln.ops.kernels.tiles import const, lanes_loop, nest
from kiln.ops.registry import Attrs, HandBuiltOp
from kiln.target.isa import ISA


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in shape)


def scaled_operand(shapes: Sequence[Sequence[Any]], dtypes: Sequence[str]) -> int | None:
    """Which operand (0 or 1) of a two-operand multiply is the `[N or 1, C, 1, 1]` (or
    `[C, 1, 1]`) channel scale of the other, a float32 static NCHW tensor; None when
    the call is no channel scale."""
    if len(shapes) != 2 or any(d != "float32" for d in dtypes) or \
            not all(_static(s) for s in shapes):
        return None
    for k in (0, 1):
        x, s = tuple(shapes[1 - k]), tuple(shapes[k])
        if len(x) != 4 or 0 in x or x[2] * x[3] < 2:
            continue
        if s in ((x[0], x[1], 1, 1), (1, x[1], 1, 1), (x[1], 1, 1)):
            return k
    return None


@dataclass(frozen=True)
class ChannelScaleOp(HandBuiltOp):
    """`multiply` with the channel-scale kernel (see the module docstring)."""

    def builds(self, call: g.Call) -> bool:
        types = [a.type for a in call.args]
        return scaled_operand([getattr(t, "shape", ()) for t in types],
                              [getattr(t, "dtype", "") for t in types]) is not None

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        k = scaled_operand([a.shape for a in args], [a.dtype for a in args])
        final = result if result is not None else anchor
        if k is None or any(a not in params for a in args) or (
                final is not None and final.dtype != "float32"):
            return None
        return channel_scale_kernel(params, args[1 - k], args[k], anchor, result)


def channel_scale_kernel(params: Sequence[te.Tensor], x: te.Tensor, scale: te.Tensor,
                         anchor: te.Tensor | None, result: te.Tensor | None
                         ) -> PrimFunc | None:
    """`x * scale` (`scale` one value per channel) then the fused tail `result` over
    `anchor`, as a kernel over the parameters `params`; None when the tail cannot be
    applied as a store."""
    n, c, h, w = (int(d) for d in x.shape)
    store = fused_store(params, anchor, result, (n, c, h, w))
    if store is None:
        return None
    xb, sb = store.buffers[x], store.buffers[scale]

    def row(ni: PrimExpr, ci: PrimExpr, hi: PrimExpr) -> Stmt:
        value = sb[broadcast_index((ni, ci, const(0), const(0)), scale.shape)]
        parts = []
        for start in range(0, w, MAX_LANES):
            def lane(v: PrimExpr, start: int = start) -> Stmt:
                idx = (ni, ci, hi, v + start)
                return Store(store.out, store.epilogue(xb[idx] * value, idx), idx)

            parts.append(lanes_loop("v", min(MAX_LANES, w - start), lane))
        return seq(*parts)

    return PrimFunc((*(store.buffers[t] for t in params), store.out),
                    nest(("n", "c", "h"), (n, c, h), row), {"kiln.channel_scale": True})
