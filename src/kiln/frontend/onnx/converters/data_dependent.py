"""ONNX converters onto kiln.ops.data_dependent's operators (NonZero, Compress, Unique,
NonMaxSuppression, and TopK's run-time k): each names the run-time dimension of its
result after the node's output (`fresh_dim_name`), or folds to a constant when every
input is one."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.ir import graph as g
from kiln.ops.data_dependent import compress_ref, nms_ref, nonzero_ref, unique_ref
from kiln.ops.reduce import norm_axes


def fresh_dim_name(op: str, output: str) -> str:
    """A dimension name for the run-time size of `op`'s output called `output` (an ONNX
    name): `<op>_<output as an identifier>`, shortened with a hash when long."""
    hint = re.sub(r"[^A-Za-z0-9_]", "_", output.encode("ascii", "replace").decode()) or "out"
    if len(hint) > 40:
        hint = f"{hint[:24]}_{zlib.crc32(output.encode('utf-8')):08x}"
    return f"{op}_{hint}"


def _all_constant(ctx: GraphContext, inputs: Sequence[g.Expr | None]) -> list[np.ndarray] | None:
    values = [ctx.value(x) for x in inputs if x is not None]
    if any(v is None for v in values):
        return None
    return [v for v in values if v is not None]


def _dim_name(ctx: GraphContext, op: str) -> str:
    return fresh_dim_name(op, next((o for o in ctx.node_outputs if o), op))


@onnx_op("NonZero")
def _nonzero_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    consts = _all_constant(ctx, inputs)
    if consts is not None:
        return [ctx.const(nonzero_ref(consts[0]))]
    return [ctx.call("nonzero", x, dim=_dim_name(ctx, "nonzero"))]


@onnx_op("Compress")
def _compress_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    x, cond = inputs[0], inputs[1]
    assert x is not None and cond is not None
    axis = attrs.get("axis")
    if axis is not None:
        axis = norm_axes(int(axis), ctx.tensor_type(x).ndim)[0]
    consts = _all_constant(ctx, inputs)
    if consts is not None:
        return [ctx.const(compress_ref(consts[0], consts[1].astype(bool), axis=axis))]
    return [ctx.call("compress", x, cond, axis=axis, dim=_dim_name(ctx, "compress"))]


def topk_runtime_k(ctx: GraphContext, x: g.Expr, k: g.Expr, axis: int,
                   largest: bool) -> list[g.Expr]:
    """TopK whose k is a run-time tensor: `topk_k` binds k (checked within [0, n]), and
    `topk_dynamic` sorts with it (the converter of TopK calls this when k is no constant)."""
    ks = ctx.call("topk_k", k, x, axis=axis, dim=_dim_name(ctx, "topk_k"))
    out = ctx.call("topk_dynamic", x, ks, axis=axis, largest=largest)
    return [ctx.item(out, 0), ctx.item(out, 1)]


@onnx_op("Unique")
def _unique_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    axis = attrs.get("axis")
    if axis is not None:
        axis = norm_axes(int(axis), ctx.tensor_type(x).ndim)[0]
    sorted_ = bool(attrs.get("sorted", 1))
    consts = _all_constant(ctx, inputs)
    if consts is not None:
        return [ctx.const(v) for v in unique_ref(consts[0], axis=axis, sorted=sorted_)]
    out = ctx.call("unique", x, axis=axis, sorted=sorted_, dim=_dim_name(ctx, "unique"))
    return [ctx.item(out, k) for k in range(4)]


@onnx_op("NonMaxSuppression")
def _nms_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    boxes, scores = inputs[0], inputs[1]
    assert boxes is not None and scores is not None
    given = [inputs[k] if len(inputs) > k else None for k in (2, 3, 4)]
    f32 = ctx.tensor_type(boxes).dtype
    defaults = [ctx.const(np.zeros(1, np.int64)), ctx.const(np.zeros(1, np.float32)),
                ctx.const(np.zeros(1, np.float32))]
    if f32 != "float32":
        raise IRError(f"NonMaxSuppression takes float32 boxes, got {f32}")
    args = [v if v is not None else d for v, d in zip(given, defaults)]
    center = int(attrs.get("center_point_box", 0))
    call_attrs = dict(center_point_box=center, has_score_threshold=given[2] is not None,
                      dim=_dim_name(ctx, "nms"))
    consts = _all_constant(ctx, [boxes, scores, *args])
    if consts is not None:
        return [ctx.const(nms_ref(*consts, center_point_box=center,
                                   has_score_threshold=given[2] is not None))]
    return [ctx.call("non_max_suppression", boxes, scores, *args, **call_attrs)]
