"""Dtype-changing and selecting elementwise ops: cast, where, clip, comparisons and
logic (equal, less, logical_and, logical_not, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.tensor import (
    Cast,
    Const,
    PrimExpr,
    UnaryOp,
    as_expr,
    binary,
    compare,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes, broadcast_types
from kiln.ops.onnx_map import Converter, GraphContext, first_input, onnx_dtype, onnx_op
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


# ----------------------------------------------------------------------- cast

def _cast_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    return TensorType(types[0].shape, dt.check_dtype(attrs["dtype"]))


def _cast_value(v: PrimExpr, dtype: str) -> PrimExpr:
    if v.dtype == dtype:
        return v
    if dtype == "bool":
        return compare("ne", v, Const(0, v.dtype))
    return Cast(dtype, v)


register_op("cast", pattern="elemwise", infer=_cast_infer,
            compute=lambda ins, a: te.compute(
                ins[0].shape, lambda *i: _cast_value(ins[0][i], a["dtype"]), a["dtype"], "cast"),
            reference=lambda x, dtype, **a: x.astype(dt.to_numpy(dtype)))


@onnx_op("Cast")
def _cast_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    dtype = onnx_dtype(int(attrs["to"]), "Cast: to")
    return [ctx.call("cast", first_input(inputs), dtype=dtype)]


@onnx_op("CastLike")
def _cast_like_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    like = inputs[1]
    assert like is not None
    return [ctx.call("cast", first_input(inputs), dtype=ctx.tensor_type(like).dtype)]


# ---------------------------------------------------------------- where, clip

def _where_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    c, a, b = types
    if c.dtype != "bool":
        raise IRError(f"where: condition must be bool, got {c.dtype}")
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return TensorType(shape, broadcast_types([a, b]).dtype)


def _where_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    c, a, b = inputs
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return te.compute(shape, lambda *i: select(
        c[broadcast_index(i, c.shape)], a[broadcast_index(i, a.shape)],
        b[broadcast_index(i, b.shape)]), a.dtype, "where")


register_op("where", pattern="broadcast", infer=_where_infer, compute=_where_compute,
            reference=lambda c, a, b, **k: np.where(c, a, b))


@onnx_op("Where")
def _where_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    c, a, b = inputs
    assert c is not None and a is not None and b is not None
    return [ctx.call("where", c, a, b)]


def _clip_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    lo, hi = attrs.get("min"), attrs.get("max")

    def element(*i: PrimExpr) -> PrimExpr:
        v = x[i]
        if lo is not None:
            v = max_(v, as_expr(lo, x.dtype))
        if hi is not None:
            v = min_(v, as_expr(hi, x.dtype))
        return v

    return te.compute(x.shape, element, x.dtype, "clip")


register_op("clip", pattern="elemwise", infer=lambda t, a: t[0], compute=_clip_compute,
            reference=lambda x, min=None, max=None, **a: _clip_ref(x, min, max))


def _clip_ref(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo).astype(x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi).astype(x.dtype))
    return np.array(out, dtype=x.dtype)


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
    return [ctx.call("clip", x, min=lo, max=hi)]


# --------------------------------------------------------- comparisons, logic

COMPARISONS: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "equal": ("eq", np.equal), "not_equal": ("ne", np.not_equal), "less": ("lt", np.less),
    "less_equal": ("le", np.less_equal), "greater": ("gt", np.greater),
    "greater_equal": ("ge", np.greater_equal),
}


LOGIC: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "logical_and": ("and", np.logical_and), "logical_or": ("or", np.logical_or),
    "logical_xor": ("xor", np.logical_xor),
}


def _register_cmp(name: str, fn: Callable[[PrimExpr, PrimExpr], PrimExpr], ref: Callable[..., Any],
                  check_bool: bool) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        t = broadcast_types(types)
        if check_bool and t.dtype != "bool":
            raise IRError(f"{name} needs bool operands, got {t.dtype}")
        return TensorType(t.shape, "bool")

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        a, b = inputs
        shape = broadcast_shapes(a.shape, b.shape)
        return te.compute(shape, lambda *i: fn(a[broadcast_index(i, a.shape)],
                                               b[broadcast_index(i, b.shape)]), "bool", name)

    register_op(name, pattern="broadcast", infer=infer, compute=compute,
                reference=lambda a, b, **k: ref(a, b))


def _scalar_op(op: str, comparison: bool) -> Callable[[PrimExpr, PrimExpr], PrimExpr]:
    def fn(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        return compare(op, a, b) if comparison else binary(op, a, b)
    return fn


for _n, (_op, _r) in COMPARISONS.items():
    _register_cmp(_n, _scalar_op(_op, True), _r, False)


for _n, (_op, _r) in LOGIC.items():
    _register_cmp(_n, _scalar_op(_op, False), _r, True)


register_op("logical_not", pattern="elemwise",
            infer=lambda t, a: t[0] if t[0].dtype == "bool" else _not_bool(t[0]),
            compute=lambda ins, a: te.compute(ins[0].shape, lambda *i: UnaryOp("not", ins[0][i]),
                                              "bool", "logical_not"),
            reference=lambda x, **a: np.logical_not(x))


def _not_bool(t: TensorType) -> Type:
    raise IRError(f"logical_not needs a bool tensor, got {t.dtype}")


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
