"""ONNX converters onto kiln.ops.reduce's operators: the Reduce* ops (axes as an
attribute or, from their opset on, an input), ArgMax/ArgMin, CumSum/CumProd, TopK,
Softmax/LogSoftmax, Hardmax, and the normalisations ONNX defines as compositions
(LayerNormalization, InstanceNormalization, GroupNormalization,
MeanVarianceNormalization, RMSNormalization, LpNormalization)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.data_dependent import topk_runtime_k
from kiln.frontend.onnx.converters.registry import (
    Converter,
    GraphContext,
    check_per_channel,
    onnx_op,
)
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_product
from kiln.ops.reduce import MLAS_LAYER_NORM_MIN, norm_axes, reduced_shape
from kiln.ops.reshape_dims import reshape_attr

# ONNX op -> (kiln op, first opset taking axes as an input instead of an attribute)
ONNX_REDUCE = {
    "ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18),
    "ReduceMax": ("reduce_max", 18), "ReduceMin": ("reduce_min", 18),
    "ReduceProd": ("reduce_prod", 18), "ReduceL1": ("reduce_l1", 18),
    "ReduceL2": ("reduce_l2", 18), "ReduceSumSquare": ("reduce_sum_square", 18),
    "ReduceLogSum": ("reduce_log_sum", 18), "ReduceLogSumExp": ("log_sum_exp", 18),
}


def _reduce_axes(ctx: GraphContext, inputs: Sequence[g.Expr | None], attrs: dict[str, Any],
                 axes_input_since: int) -> Any:
    """The reduction axes: None for all, () for none (noop_with_empty_axes)."""
    axes: Any = attrs.get("axes")
    if ctx.opset >= axes_input_since and len(inputs) > 1 and inputs[1] is not None:
        known = ctx.value(inputs[1])
        if known is None:
            raise IRError("the axes input must be a compile-time constant")
        axes = tuple(int(a) for a in known.reshape(-1))
    if axes is not None and len(axes) == 0:
        axes = None
    if axes is None and attrs.get("noop_with_empty_axes", 0):
        return ()
    return axes


def _reduce_converter(op: str, axes_input_since: int) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        xt = ctx.tensor_type(x)
        axes = _reduce_axes(ctx, inputs, attrs, axes_input_since)
        keep = bool(attrs.get("keepdims", 1))
        if axes == ():
            return [ctx.call("copy", x)]
        axes = norm_axes(axes, xt.ndim)
        if xt.dtype == "bool" and op in ("reduce_max", "reduce_min"):
            # max/min of bools are or/and: compute them on uint8
            y = ctx.call(op, ctx.call("cast", x, dtype="uint8"), axes=axes, keepdims=keep)
            return [ctx.call("cast", y, dtype="bool")]
        if op == "log_sum_exp":
            return [_log_sum_exp(ctx, x, axes, keep)]
        return [ctx.call(op, x, axes=axes, keepdims=keep)]
    return convert


def _log_sum_exp(ctx: GraphContext, x: g.Expr, axes: tuple[int, ...], keep: bool) -> g.Expr:
    # log(sum(exp(x - m))) + m with m the max: no overflow
    m = ctx.call("reduce_max", x, axes=axes, keepdims=True)
    dtype = ctx.tensor_type(x).dtype
    if dt.is_float(dtype):
        # an infinite max shifts by 0 instead (onnxruntime's rule): inf - inf is NaN, and
        # a row of -inf sums exp(-inf) = 0 into log(0) = -inf
        m = ctx.call("where", ctx.call("isinf", m), ctx.const(0.0, dtype), m)
    total = ctx.call("reduce_sum", ctx.call("exp", ctx.call("subtract", x, m)), axes=axes,
                     keepdims=True)
    y = ctx.call("add", ctx.call("log", total), m)
    if not keep:
        src = ctx.tensor_type(y).shape
        y = ctx.call("reshape", y, shape=reshape_attr(src, reduced_shape(src, axes, False)))
    return y


for _onnx, (_kiln, _since) in ONNX_REDUCE.items():
    onnx_op(_onnx)(_reduce_converter(_kiln, _since))


def _arg_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        axis = norm_axes(attrs.get("axis", 0), ctx.tensor_type(x).ndim)[0]
        return [ctx.call(op, x, axis=axis, keepdims=bool(attrs.get("keepdims", 1)),
                         select_last_index=bool(attrs.get("select_last_index", 0)))]
    return convert


onnx_op("ArgMax")(_arg_converter("argmax"))


onnx_op("ArgMin")(_arg_converter("argmin"))


def _cumulative_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        axis_v = ctx.value(inputs[1]) if len(inputs) > 1 else None
        if axis_v is None:
            raise IRError("the axis input must be a compile-time constant")
        axis = norm_axes(int(axis_v.reshape(-1)[0]), ctx.tensor_type(x).ndim)[0]
        return [ctx.call(op, x, axis=axis, exclusive=bool(attrs.get("exclusive", 0)),
                         reverse=bool(attrs.get("reverse", 0)))]
    return convert


onnx_op("CumSum")(_cumulative_converter("cumsum"))


onnx_op("CumProd")(_cumulative_converter("cumprod"))


@onnx_op("TopK")
def _topk_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    if ctx.opset >= 10:
        k_v = ctx.value(inputs[1]) if len(inputs) > 1 else None
        if k_v is None and len(inputs) > 1 and inputs[1] is not None:  # known at run time
            axis = norm_axes(int(attrs.get("axis", -1)), ctx.tensor_type(x).ndim)[0]
            return topk_runtime_k(ctx, x, inputs[1], axis, bool(attrs.get("largest", 1)))
        if k_v is None:
            raise IRError("the k input must be given")
        k = int(k_v.reshape(-1)[0])
    else:
        k = int(attrs["k"])
    axis = norm_axes(int(attrs.get("axis", -1)), ctx.tensor_type(x).ndim)[0]
    # `sorted=0` allows any order: the sorted order is one of them
    out = ctx.call("topk", x, k=k, axis=axis, largest=bool(attrs.get("largest", 1)))
    return [ctx.item(out, 0), ctx.item(out, 1)]


def _softmax_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        t = ctx.tensor_type(x)
        if ctx.opset >= 13:
            return [ctx.call(op, x, axis=norm_axes(attrs.get("axis", -1), t.ndim)[0])]
        # Before opset 13 the input is coerced to 2-D at `axis` (default 1).
        (axis,) = norm_axes(attrs.get("axis", 1), t.ndim)
        if axis == t.ndim - 1:  # the coerced 2-D rows are the last axis already
            return [ctx.call(op, x, axis=axis)]
        shape = t.shape
        flat_shape = (dim_product(shape[:axis]), dim_product(shape[axis:]))
        flat = ctx.call("reshape", x, shape=reshape_attr(shape, flat_shape))
        y = ctx.call(op, flat, axis=1)
        return [ctx.call("reshape", y, shape=reshape_attr(flat_shape, shape))]
    return convert


onnx_op("Softmax")(_softmax_converter("softmax"))


onnx_op("LogSoftmax")(_softmax_converter("log_softmax"))


@onnx_op("Hardmax")
def _hardmax_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    t = ctx.tensor_type(x)
    shape = t.static_shape
    if ctx.opset >= 13:
        (axis,) = norm_axes(attrs.get("axis", -1), t.ndim)
        flat = x
    else:   # coerced to 2-D at `axis`, like Softmax
        (axis0,) = norm_axes(attrs.get("axis", 1), t.ndim)
        flat = ctx.call("reshape", x, shape=(int(np.prod(shape[:axis0])),
                                             int(np.prod(shape[axis0:]))))
        axis = 1
    ft = ctx.tensor_type(flat)
    idx = ctx.call("argmax", flat, axis=axis, keepdims=True)
    iota_shape = [1] * ft.ndim
    iota_shape[axis] = ft.static_shape[axis]
    ctx.check_materialize(8 * ft.static_shape[axis], f"Hardmax over an axis of "
                          f"{ft.static_shape[axis]}")
    iota = ctx.const(np.arange(ft.static_shape[axis], dtype=np.int64).reshape(iota_shape))
    hot = ctx.call("equal", iota, idx)
    if dt.is_float(t.dtype):
        # onnxruntime compares with the row max: a NaN max (a leading NaN) marks nothing
        hot = ctx.call("logical_and", hot, ctx.call("equal", flat, flat))
    y = ctx.call("cast", hot, dtype=t.dtype)
    if ctx.tensor_type(y).static_shape != ft.static_shape:
        y = ctx.call("broadcast_to", y, shape=ft.static_shape)
    return [y if flat is x else ctx.call("reshape", y, shape=shape)]


def _normalized(ctx: GraphContext, x: g.Expr, axes: tuple[int, ...], eps: float
                ) -> tuple[g.Expr, g.Expr, g.Expr]:
    """(normalised x, mean, 1/sqrt(var + eps)) over `axes`, statistics kept as dims."""
    dtype = ctx.tensor_type(x).dtype
    mean = ctx.call("reduce_mean", x, axes=axes, keepdims=True)
    centered = ctx.call("subtract", x, mean)
    var = ctx.call("reduce_mean", ctx.call("multiply", centered, centered), axes=axes,
                   keepdims=True)
    inv = ctx.call("reciprocal", ctx.call("sqrt", ctx.call("add", var, ctx.const(eps, dtype))))
    return ctx.call("multiply", centered, inv), mean, inv


def _channel(ctx: GraphContext, v: g.Expr, ndim: int) -> g.Expr:
    """A per-channel (C,) vector shaped to broadcast against an (N, C, ...) tensor."""
    c = ctx.tensor_type(v).static_shape[0]
    return ctx.call("reshape", v, shape=(c,) + (1,) * (ndim - 2))


@onnx_op("LayerNormalization")
def _layer_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and scale is not None
    t = ctx.tensor_type(x)
    axis = norm_axes(int(attrs.get("axis", -1)), t.ndim)[0]
    eps = float(attrs.get("epsilon", 1e-5))
    args = [x, scale] if bias is None else [x, scale, bias]
    outs = [ctx.call("layer_norm", *args, axis=axis, epsilon=eps)]
    if len(ctx.node_outputs) > 1:
        # the optional Mean and InvStdDev outputs, in the stash type (float32 by default)
        stash = "float32" if int(attrs.get("stash_type", 1)) == 1 else t.dtype
        xs = x if stash == t.dtype else ctx.call("cast", x, dtype=stash)
        outs += list(_layer_norm_statistics(ctx, xs, axis, eps, t.dtype))
    return outs


def _layer_norm_statistics(ctx: GraphContext, x: g.Expr, axis: int, eps: float,
                           dtype: str) -> tuple[g.Expr, g.Expr]:
    """LayerNormalization's Mean and InvStdDev outputs over the axes from `axis` as
    onnxruntime computes them (`dtype` the input's): a row shorter than its MLAS
    kernel's minimum (`MLAS_LAYER_NORM_MIN`, 16 for float16) by Welford's update in
    order, so an infinity before the row's last element makes the mean NaN; a longer
    one (or one of symbolic length) with the mean summed in float64, then the squared
    deviations from it."""
    t = ctx.tensor_type(x)
    row = [d for d in t.shape[axis:] if isinstance(d, int)]
    n = int(np.prod(row))
    if len(row) == t.ndim - axis and n < (16 if dtype == "float16" else MLAS_LAYER_NORM_MIN):
        mean, m2 = _welford(ctx, x, axis, row)
        var = ctx.call("divide", m2, ctx.const(float(n), t.dtype))
    else:
        axes = tuple(range(axis, t.ndim))
        wide = x if t.dtype == "float64" else ctx.call("cast", x, dtype="float64")
        mean = ctx.call("reduce_mean", wide, axes=axes, keepdims=True)
        mean = mean if t.dtype == "float64" else ctx.call("cast", mean, dtype=t.dtype)
        centred = ctx.call("subtract", x, mean)
        var = ctx.call("reduce_mean", ctx.call("multiply", centred, centred), axes=axes,
                       keepdims=True)
    inv = ctx.call("reciprocal", ctx.call("sqrt", ctx.call("add", var, ctx.const(eps, t.dtype))))
    return mean, inv


def _welford(ctx: GraphContext, x: g.Expr, axis: int, row: list[int]
             ) -> tuple[g.Expr, g.Expr]:
    """(mean, sum of squared deviations) of each row of `x` (the axes from `axis`, of
    static extents `row`) by Welford's update over its elements in row-major order."""
    dtype = ctx.tensor_type(x).dtype
    mean = m2 = ctx.const(0.0, dtype)
    for k, at in enumerate(np.ndindex(*row), start=1):
        v = ctx.call("strided_slice", x, starts=at, ends=tuple(i + 1 for i in at),
                     axes=tuple(range(axis, axis + len(row))), steps=(1,) * len(row))
        d = ctx.call("subtract", v, mean)
        mean = ctx.call("add", mean, ctx.call("divide", d, ctx.const(float(k), dtype)))
        m2 = ctx.call("add", m2, ctx.call("multiply", d, ctx.call("subtract", v, mean)))
    return mean, m2


@onnx_op("InstanceNormalization")
def _instance_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                        attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale, bias = inputs[:3]
    assert x is not None and scale is not None and bias is not None
    ndim = ctx.tensor_type(x).ndim
    check_per_channel(ctx, scale, x, "input scale")
    check_per_channel(ctx, bias, x, "input B")
    t = ctx.tensor_type(x)
    eps = float(attrs.get("epsilon", 1e-5))
    if ndim > 3 and all(isinstance(d, int) for d in t.shape):
        # spatial dims as one row: the hand-built row kernel (kiln.kernels.rows) takes it
        shape = t.static_shape
        rows = ctx.call("reshape", x, shape=(*shape[:2], int(np.prod(shape[2:]))))
        y = ctx.call("reshape", ctx.call("layer_norm", rows, axis=2, epsilon=eps), shape=shape)
    else:
        y = ctx.call("layer_norm", x, axis=2, epsilon=eps)
    y = ctx.call("multiply", y, _channel(ctx, scale, ndim))
    return [ctx.call("add", y, _channel(ctx, bias, ndim))]


@onnx_op("GroupNormalization")
def _group_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale, bias = inputs[:3]
    assert x is not None and scale is not None and bias is not None
    shape = ctx.tensor_type(x).static_shape
    groups = int(attrs["num_groups"])
    n, c = shape[:2]
    if c % groups:
        raise IRError(f"GroupNormalization: {c} channels do not split into {groups} groups")
    check_per_channel(ctx, scale, x, "input scale", (groups,))
    check_per_channel(ctx, bias, x, "input bias", (groups,))
    grouped = ctx.call("reshape", x, shape=(n, groups, int(np.prod(shape[1:])) // groups))
    y = ctx.call("layer_norm", grouped, axis=2, epsilon=float(attrs.get("epsilon", 1e-5)))
    y = ctx.call("reshape", y, shape=shape)
    if ctx.tensor_type(scale).static_shape[0] != c:
        # opset 18: scale and bias per group
        scale = ctx.call("reshape", ctx.call("broadcast_to", ctx.call(
            "reshape", scale, shape=(groups, 1)), shape=(groups, c // groups)), shape=(c,))
        bias = ctx.call("reshape", ctx.call("broadcast_to", ctx.call(
            "reshape", bias, shape=(groups, 1)), shape=(groups, c // groups)), shape=(c,))
    y = ctx.call("multiply", y, _channel(ctx, scale, len(shape)))
    return [ctx.call("add", y, _channel(ctx, bias, len(shape)))]


@onnx_op("MeanVarianceNormalization")
def _mvn_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    t = ctx.tensor_type(x)
    axes = norm_axes(attrs.get("axes", (0, 2, 3)), t.ndim)
    first = t.ndim - len(axes)
    if axes == tuple(range(first, t.ndim)) and all(isinstance(d, int) for d in t.shape):
        # trailing axes as rows: the row kernel's statistics (kiln.kernels.rows), which
        # neither overflow in the mean nor lose a far-from-zero row's digits
        shape = t.static_shape
        rows = ctx.call("reshape", x, shape=(int(np.prod(shape[:first])),
                                             int(np.prod(shape[first:]))))
        return [ctx.call("reshape", ctx.call("layer_norm", rows, axis=1, epsilon=1e-9),
                         shape=shape)]
    return [_normalized(ctx, x, axes, 1e-9)[0]]


@onnx_op("RMSNormalization")
def _rms_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    t = ctx.tensor_type(x)
    axis = norm_axes(int(attrs.get("axis", -1)), t.ndim)[0]
    stash = "float32" if int(attrs.get("stash_type", 1)) == 1 else t.dtype
    xs = x if stash == t.dtype else ctx.call("cast", x, dtype=stash)
    ms = ctx.call("reduce_mean", ctx.call("multiply", xs, xs),
                  axes=tuple(range(axis, t.ndim)), keepdims=True)
    rms = ctx.call("sqrt", ctx.call("add", ms, ctx.const(float(attrs.get("epsilon", 1e-5)),
                                                         stash)))
    y = ctx.call("divide", xs, rms)
    if stash != t.dtype:
        y = ctx.call("cast", y, dtype=t.dtype)
    return [ctx.call("multiply", y, scale)]


@onnx_op("LpNormalization")
def _lp_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    t = ctx.tensor_type(x)
    axis = norm_axes(int(attrs.get("axis", -1)), t.ndim)
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise IRError(f"LpNormalization: p must be 1 or 2, got {p}")
    norm = ctx.call("reduce_l2" if p == 2 else "reduce_l1", x, axes=axis, keepdims=True)
    zero = ctx.const(0, t.dtype)
    safe = ctx.call("where", ctx.call("equal", norm, zero), ctx.const(1, t.dtype), norm)
    return [ctx.call("divide", x, safe)]
