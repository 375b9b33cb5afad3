"""ONNX converters onto kiln.ops.indexing's operators: Gather, GatherElements,
GatherND, ScatterElements (and the deprecated Scatter), ScatterND, and OneHot (an
`equal` against an iota, then `where`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, first_input, need_constant, onnx_op
from kiln.ir import graph as g
from kiln.ops.reduce import norm_axes


@onnx_op("Gather")
def _gather_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx = first_input(inputs), inputs[1]
    assert idx is not None
    return [ctx.call("gather", x, idx, axis=norm_axes(attrs.get("axis", 0),
                                                       ctx.tensor_type(x).ndim)[0])]


@onnx_op("GatherElements")
def _gather_elements_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx = first_input(inputs), inputs[1]
    assert idx is not None
    axis = norm_axes(attrs.get("axis", 0), ctx.tensor_type(x).ndim)[0]
    return [ctx.call("gather_elements", x, idx, axis=axis)]


@onnx_op("GatherND")
def _gather_nd_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    idx = inputs[1]
    assert idx is not None
    return [ctx.call("gather_nd", first_input(inputs), idx,
                     batch_dims=int(attrs.get("batch_dims", 0)))]


@onnx_op("ScatterElements", "Scatter")
def _scatter_elements_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx, upd = first_input(inputs), inputs[1], inputs[2]
    assert idx is not None and upd is not None
    axis = norm_axes(attrs.get("axis", 0), ctx.tensor_type(x).ndim)[0]
    return [ctx.call("scatter_elements", x, idx, upd, axis=axis,
                     reduction=str(attrs.get("reduction", "none")))]


@onnx_op("ScatterND")
def _scatter_nd_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx, upd = first_input(inputs), inputs[1], inputs[2]
    assert idx is not None and upd is not None
    return [ctx.call("scatter_nd", x, idx, upd, reduction=str(attrs.get("reduction", "none")))]


@onnx_op("OneHot")
def _one_hot_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    indices, values = first_input(inputs), inputs[2]
    assert values is not None
    depth = int(need_constant(ctx, inputs[1], "OneHot depth").reshape(-1)[0])
    if depth < 1:
        raise IRError(f"OneHot depth must be positive, got {depth}")
    ctx.check_materialize(depth * 8, f"OneHot depth {depth}")
    it = ctx.tensor_type(indices)
    axis = norm_axes(int(attrs.get("axis", -1)), it.ndim + 1)[0]
    idx = indices if it.dtype == "int64" else ctx.call("cast", indices, dtype="int64")
    # negative indices count from the end
    idx = ctx.call("where", ctx.call("less", idx, ctx.const(0, "int64")),
                   ctx.call("add", idx, ctx.const(depth, "int64")), idx)
    shape = list(it.static_shape)
    shape.insert(axis, 1)
    idx = ctx.call("reshape", idx, shape=tuple(shape))
    iota_shape = [1] * len(shape)
    iota_shape[axis] = depth
    iota = ctx.const(np.arange(depth, dtype=np.int64).reshape(iota_shape))
    hot = ctx.call("equal", idx, iota)
    vt = ctx.tensor_type(values)
    off = ctx.call("reshape", ctx.call("strided_slice", values, starts=(0,), ends=(1,),
                                       axes=(0,), steps=(1,)), shape=())
    on = ctx.call("reshape", ctx.call("strided_slice", values, starts=(1,), ends=(2,),
                                      axes=(0,), steps=(1,)), shape=())
    if vt.static_shape != (2,):
        raise IRError(f"OneHot values must have shape (2,), got {vt.static_shape}")
    return [ctx.call("where", hot, on, off)]
