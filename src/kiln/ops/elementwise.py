"""Elementwise operators: unary math and broadcasting binary arithmetic.

Each op is one table row: its scalar expression (used by the lowering) beside
its numpy reference (used by the interpreter and constant folding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.tensor import (
    PrimExpr,
    as_expr,
    binary,
    intrin,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_types
from kiln.ops.onnx_map import Converter, GraphContext, onnx_op
from kiln.ops.registry import register_op

BinaryFn = Callable[[PrimExpr, PrimExpr], PrimExpr]


def _c(x: PrimExpr, v: float) -> PrimExpr:
    return as_expr(v, x.dtype)


def _f(x: PrimExpr, attrs: Mapping[str, Any], key: str, default: float) -> PrimExpr:
    return as_expr(float(attrs.get(key, default)), x.dtype)


def _erf_ref(a: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(a)


def _sign(x: PrimExpr) -> PrimExpr:
    zero = _c(x, 0)
    return select(x > zero, _c(x, 1), select(x < zero, _c(x, -1), zero))


def _elu(x: PrimExpr, alpha: PrimExpr) -> PrimExpr:
    return select(x > _c(x, 0), x, alpha * (intrin("exp", x) - _c(x, 1)))


def _gelu(x: PrimExpr, attrs: Mapping[str, Any]) -> PrimExpr:
    if attrs.get("approximate", "none") == "tanh":
        inner = _c(x, 0.7978845608028654) * (x + _c(x, 0.044715) * x * x * x)
        return _c(x, 0.5) * x * (_c(x, 1) + intrin("tanh", inner))
    return _c(x, 0.5) * x * (_c(x, 1) + intrin("erf", x * _c(x, 0.7071067811865476)))


def _gelu_ref(a: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    a64 = a.astype(np.float64)
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * a64 * (1 + np.tanh(0.7978845608028654 * (a64 + 0.044715 * a64 ** 3)))
    return 0.5 * a64 * (1 + _erf_ref(a64 / np.sqrt(2)))


UnaryFn = Callable[[PrimExpr, Mapping[str, Any]], PrimExpr]
UnaryRef = Callable[[np.ndarray, Mapping[str, Any]], np.ndarray]

# name -> (scalar expression, numpy reference); both see the op's attributes.
UNARY: dict[str, tuple[UnaryFn, UnaryRef]] = {
    "neg": (lambda x, a: -x, lambda v, a: np.negative(v)),
    "abs": (lambda x, a: intrin("abs", x) if dt.is_float(x.dtype) else select(x < 0, -x, x),
            lambda v, a: np.abs(v)),
    "sign": (lambda x, a: _sign(x), lambda v, a: np.sign(v)),
    "sqrt": (lambda x, a: intrin("sqrt", x), lambda v, a: np.sqrt(v)),
    "exp": (lambda x, a: intrin("exp", x), lambda v, a: np.exp(v)),
    "log": (lambda x, a: intrin("log", x), lambda v, a: np.log(v)),
    "erf": (lambda x, a: intrin("erf", x), lambda v, a: _erf_ref(v)),
    "floor": (lambda x, a: intrin("floor", x), lambda v, a: np.floor(v)),
    "ceil": (lambda x, a: intrin("ceil", x), lambda v, a: np.ceil(v)),
    "round": (lambda x, a: intrin("round", x), lambda v, a: np.rint(v)),
    "reciprocal": (lambda x, a: _c(x, 1) / x, lambda v, a: 1 / v),
    "sin": (lambda x, a: intrin("sin", x), lambda v, a: np.sin(v)),
    "cos": (lambda x, a: intrin("cos", x), lambda v, a: np.cos(v)),
    "tanh": (lambda x, a: intrin("tanh", x), lambda v, a: np.tanh(v)),
    "sigmoid": (lambda x, a: intrin("sigmoid", x), lambda v, a: 1 / (1 + np.exp(-v))),
    "relu": (lambda x, a: max_(x, _c(x, 0)), lambda v, a: np.maximum(v, 0)),
    "leaky_relu": (lambda x, a: select(x >= _c(x, 0), x, _f(x, a, "alpha", 0.01) * x),
                   lambda v, a: np.where(v >= 0, v, float(a.get("alpha", 0.01)) * v)),
    "elu": (lambda x, a: _elu(x, _f(x, a, "alpha", 1.0)),
            lambda v, a: np.where(v > 0, v, float(a.get("alpha", 1.0)) * np.expm1(v))),
    "selu": (lambda x, a: _f(x, a, "gamma", 1.0507009873554805) * _elu(
        x, _f(x, a, "alpha", 1.6732632423543772)),
             lambda v, a: float(a.get("gamma", 1.0507009873554805)) * np.where(
                 v > 0, v, float(a.get("alpha", 1.6732632423543772)) * np.expm1(v))),
    "hard_sigmoid": (lambda x, a: max_(_c(x, 0), min_(_c(x, 1), _f(x, a, "alpha", 0.2) * x
                                                      + _f(x, a, "beta", 0.5))),
                     lambda v, a: np.clip(float(a.get("alpha", 0.2)) * v
                                          + float(a.get("beta", 0.5)), 0, 1)),
    "hard_swish": (lambda x, a: x * max_(_c(x, 0), min_(_c(x, 1), x / 6 + _c(x, 0.5))),
                   lambda v, a: v * np.clip(v / 6 + 0.5, 0, 1)),
    "softplus": (lambda x, a: intrin("log1p", intrin("exp", x)),
                 lambda v, a: np.log1p(np.exp(v))),
    "gelu": (_gelu, _gelu_ref),
}


def _unary_infer(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> Type:
    return types[0]


def _register_unary(name: str, fn: UnaryFn, ref: UnaryRef) -> None:
    def compute(inputs: Sequence[te.Tensor], attrs: Mapping[str, Any]) -> te.Tensor:
        (x,) = inputs
        return te.compute(x.shape, lambda *i: fn(x[i], attrs), x.dtype, name)

    register_op(name, pattern="elemwise", infer=_unary_infer, compute=compute,
                reference=lambda a, **attrs: np.asarray(ref(a, attrs)).astype(a.dtype))


# name -> (scalar expression, numpy reference)
BINARY: dict[str, tuple[BinaryFn, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": (lambda a, b: a + b, np.add),
    "subtract": (lambda a, b: a - b, np.subtract),
    "multiply": (lambda a, b: a * b, np.multiply),
    "divide": (lambda a, b: a / b,
               lambda a, b: np.divide(a, b) if a.dtype.kind == "f"
               else np.trunc(np.divide(a, b)).astype(a.dtype)),
    "maximum": (max_, np.maximum),
    "minimum": (min_, np.minimum),
    "power": (lambda a, b: intrin("pow", a, b), np.power),
    "prelu": (lambda a, b: select(a >= as_expr(0, a.dtype), a, a * b),
              lambda a, b: np.where(a >= 0, a, a * b)),
    "mod": (lambda a, b: binary("mod", a, b) if dt.is_float(a.dtype) else binary("floormod", a, b),
            lambda a, b: np.fmod(a, b) if a.dtype.kind == "f" else np.mod(a, b)),
    "fmod": (lambda a, b: binary("mod", a, b), np.fmod),
}


def _register_binary(name: str, fn: BinaryFn,
                     ref: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    def infer(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> Type:
        return broadcast_types(types)

    def compute(inputs: Sequence[te.Tensor], attrs: Mapping[str, Any]) -> te.Tensor:
        a, b = inputs
        shape = broadcast_types([TensorType(a.shape, a.dtype), TensorType(b.shape, b.dtype)])
        return te.compute(
            shape.shape,  # type: ignore[arg-type]
            lambda *i: fn(a[broadcast_index(i, a.shape)], b[broadcast_index(i, b.shape)]),
            a.dtype, name)

    register_op(name, pattern="broadcast", infer=infer, compute=compute,
                reference=lambda a, b, **attrs: np.asarray(ref(a, b)).astype(a.dtype))


for _name, (_fn, _ref) in UNARY.items():
    _register_unary(_name, _fn, _ref)
for _name, (_fn2, _ref2) in BINARY.items():
    _register_binary(_name, _fn2, _ref2)

__all__ = ["BINARY", "UNARY"]


# --------------------------------------------------------------------------- ONNX mapping

ONNX_UNARY = {
    "Neg": "neg", "Abs": "abs", "Sign": "sign", "Sqrt": "sqrt", "Exp": "exp", "Log": "log",
    "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Reciprocal": "reciprocal",
    "Sin": "sin", "Cos": "cos", "Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu",
    "LeakyRelu": "leaky_relu", "Elu": "elu", "Selu": "selu", "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish", "Softplus": "softplus", "Gelu": "gelu",
}
ONNX_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power",
    "PRelu": "prelu",
}
ONNX_VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}


def _unary_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        keep = {k: v for k, v in attrs.items() if k in ("alpha", "beta", "gamma", "approximate")}
        return [ctx.call(op, x, **keep)]
    return convert


def _binary_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if op == "power" and ctx.tensor_type(b).dtype != ctx.tensor_type(a).dtype:
            b = ctx.call("cast", b, dtype=ctx.tensor_type(a).dtype)
        return [ctx.call(op, a, b)]
    return convert


def _variadic_converter(onnx_name: str, op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        args = [x for x in inputs if x is not None]
        acc = args[0]
        for x in args[1:]:
            acc = ctx.call(op, acc, x)
        if onnx_name == "Mean" and len(args) > 1:
            acc = ctx.call("divide", acc, ctx.const(len(args), ctx.tensor_type(acc).dtype))
        elif len(args) == 1:
            acc = ctx.call("copy", acc)
        return [acc]
    return convert


def _mod_converter(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [ctx.call("fmod" if attrs.get("fmod", 0) else "mod", a, b)]


for _onnx, _kiln in ONNX_UNARY.items():
    onnx_op(_onnx)(_unary_converter(_kiln))
for _onnx, _kiln in ONNX_BINARY.items():
    onnx_op(_onnx)(_binary_converter(_kiln))
for _onnx, _kiln in ONNX_VARIADIC.items():
    onnx_op(_onnx)(_variadic_converter(_onnx, _kiln))
onnx_op("Mod")(_mod_converter)
