"""`pool2d_nchwc`: a 2-D max / average pool applied to an NCHW{b}c tensor (kiln.ops.layout).

    y = pool2d_nchwc(x, pool="max_pool2d", kernel_shape=..., strides=..., pads=..., ...)

`pool` names the NCHW pooling op (`max_pool2d` or `avg_pool2d`, kiln.ops.pool) whose
attributes follow; the window moves over dims 2 and 3 and every channel lane of
every block is pooled independently (padding lanes too: their values carry no
meaning). The definition reuses the NCHW op's on a channel-merged view of the
blocked tensor, so both agree by construction. A float32 pool of static shape runs
the hand-built kernel of kiln.ops.kernels.pool_nchwc (a vector of the block's lanes per
output position); the definition stays the fallback. The `nchwc-layout` pass
(kiln.transform.nchwc_layout) introduces it inside blocked regions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_PARALLEL_DECIDED, ATTR_POOL_KERNEL
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import PrimExpr, PrimFunc
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, te
from kiln.ops.registry import OPS, HandBuiltOp, get_op
from kiln.target.isa import ISA

POOL_NCHWC = "pool2d_nchwc"
POOLS = ("max_pool2d", "avg_pool2d")
Attrs = Mapping[str, Any]


def _split(attrs: Attrs) -> tuple[str, dict[str, Any]]:
    pool = str(attrs.get("pool", ""))
    if pool not in POOLS:
        raise IRError(f"{POOL_NCHWC}: `pool` must be one of {POOLS}, got {pool!r}")
    return pool, {k: v for k, v in attrs.items() if k != "pool"}


def _merged(shape: Sequence[Any]) -> tuple[Any, ...]:
    if len(shape) != 5:
        raise IRError(f"{POOL_NCHWC}: input must be NCHW<b>c (5-D), got {tuple(shape)}")
    n, cb, h, w, b = shape
    return (n, cb * b, h, w)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    pool, rest = _split(attrs)
    (x,) = types
    out = get_op(pool).infer([TensorType(_merged(x.shape), x.dtype)], rest)
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, cast(int, x.shape[4])), out.dtype)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    pool, rest = _split(attrs)
    (x,) = inputs
    b = x.shape[4]
    merged = te.compute(_merged(x.shape), lambda n, c, h, w: x[n, c // b, h, w, c % b],
                        x.dtype, "x_merged")
    out = get_op(pool).compute([merged], rest)
    assert isinstance(out, te.Tensor)

    def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, w: PrimExpr, v: PrimExpr) -> PrimExpr:
        return out[n, cb * b + v, h, w]

    return te.compute(layout.block_shape(out.shape, b), blocked, x.dtype, "pool_nchwc")


def _reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
    pool, rest = _split(attrs)
    cb, b = x.shape[1], x.shape[4]
    plain = layout.from_blocked(x, cb * b)
    return layout.to_blocked(get_op(pool).reference(plain, **rest), b)


@dataclass(frozen=True)
class PoolNchwcOp(HandBuiltOp):
    """The op of this module: float32 inputs of static shape take the hand-built kernel."""

    def builds(self, call: g.Call) -> bool:
        x = call.args[0].type if call.args else None
        return (isinstance(x, TensorType) and x.ndim == 5 and x.dtype == "float32"
                and is_static(tuple(x.shape)))

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The vector kernel (see `HandBuiltOp.lower_fused`)."""
        from kiln.ops.epilogue import fused_store
        from kiln.ops.kernels.pool_nchwc import pool_nchwc_body
        from kiln.ops.pool import scans_from_first, window_geometry

        x = args[0]
        if x not in params or x.dtype != "float32" or len(x.shape) != 5 \
                or (result is not None and result.dtype != x.dtype):
            return None
        pool, rest = _split(attrs)
        geometry = window_geometry(_merged(x.shape), rest)
        block = int(x.shape[4])
        store = fused_store(params, anchor, result,
                            layout.block_shape((*geometry.shape[:2], *geometry.out), block))
        if store is None:
            return None
        maximum = pool == "max_pool2d"
        body = pool_nchwc_body("max" if maximum else "avg", geometry,
                               bool(rest.get("count_include_pad", False)), store.buffers[x],
                               store.out, store.epilogue,
                               maximum and scans_from_first(rest, x.dtype), isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                        {ATTR_POOL_KERNEL: name, ATTR_PARALLEL_DECIDED: True})


OPS.register(POOL_NCHWC, PoolNchwcOp(POOL_NCHWC, "opaque", _infer, _compute, _reference))
