"""ONNX converters onto kiln.ops.logic's operators: Cast and CastLike (a float ->
integer cast converts out-of-range values as onnxruntime does on x86), Where, Clip,
the comparisons and And/Or/Xor/Not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import (
    Converter,
    GraphContext,
    first_input,
    onnx_dtype,
    onnx_op,
)
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ops.logic import X86


@onnx_op("Cast")
def _cast_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    dtype = onnx_dtype(int(attrs["to"]), "Cast: to")
    return [_onnx_cast(ctx, first_input(inputs), dtype)]


@onnx_op("CastLike")
def _cast_like_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    like = inputs[1]
    assert like is not None
    return [_onnx_cast(ctx, first_input(inputs), ctx.tensor_type(like).dtype)]


def _onnx_cast(ctx: GraphContext, x: g.Expr, dtype: str) -> g.Expr:
    """ONNX's Cast: a float -> integer one converts out-of-range values as onnxruntime
    does on x86 (X86); every other pair is the plain cast."""
    if dt.is_float(ctx.tensor_type(x).dtype) and dt.is_int(dtype):
        return ctx.call("cast", x, dtype=dtype, float_to_int=X86)
    return ctx.call("cast", x, dtype=dtype)


@onnx_op("Where")
def _where_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    c, a, b = inputs
    assert c is not None and a is not None and b is not None
    return [ctx.call("where", c, a, b)]


@onnx_op("Clip")
def _clip_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    if ctx.opset >= 11:
        lo_v = ctx.value(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        hi_v = ctx.value(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        if (len(inputs) > 1 and inputs[1] is not None and lo_v is None) or (
                len(inputs) > 2 and inputs[2] is not None and hi_v is None):
            raise IRError("Clip min/max must be compile-time constants")
        lo = None if lo_v is None else lo_v.reshape(-1)[0].item()
        hi = None if hi_v is None else hi_v.reshape(-1)[0].item()
    else:
        lo, hi = attrs.get("min"), attrs.get("max")
    dtype = ctx.tensor_type(x).dtype
    if dt.is_float(dtype):
        # a bound left out is the type's finite limit (ONNX's default, onnxruntime's):
        # +-inf become the largest finite values
        limit = (2 - 2 ** -7) * 2.0 ** 127 if dtype == "bfloat16" else \
            float(np.finfo(dt.to_numpy(dtype)).max)
        lo, hi = (-limit if lo is None else lo), (limit if hi is None else hi)
    return [ctx.call("clip", x, min=lo, max=hi)]


def _cmp_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        return [ctx.call(op, a, b)]
    return convert


for _o, _k in {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal",
               "Greater": "greater", "GreaterOrEqual": "greater_equal", "And": "logical_and",
               "Or": "logical_or", "Xor": "logical_xor"}.items():
    onnx_op(_o)(_cmp_converter(_k))


@onnx_op("Not")
def _not_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    return [ctx.call("logical_not", first_input(inputs))]
