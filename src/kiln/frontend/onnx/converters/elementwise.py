"""ONNX converters onto kiln.ops.elementwise's operators: the unary, binary and
variadic tables (ONNX op type -> kiln op), Pow with an exponent of another type than
its base, Mod and BitShift."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import Converter, GraphContext, onnx_op
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ops.logic import X86

ONNX_UNARY = {
    "Neg": "neg", "Abs": "abs", "Sign": "sign", "Sqrt": "sqrt", "Exp": "exp", "Log": "log",
    "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Reciprocal": "reciprocal",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu", "LeakyRelu": "leaky_relu",
    "Elu": "elu", "Selu": "selu", "Celu": "celu", "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish", "Softplus": "softplus", "Softsign": "softsign", "Mish": "mish",
    "ThresholdedRelu": "thresholded_relu", "Shrink": "shrink", "Swish": "swish", "Gelu": "gelu",
    "BitwiseNot": "bitwise_not", "IsNaN": "isnan", "IsInf": "isinf",
}


# Attributes a unary converter passes on (the rest belong to other ops).
UNARY_ATTRS = ("alpha", "beta", "gamma", "approximate", "lambd", "bias", "detect_negative",
               "detect_positive")


ONNX_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power",
    "PRelu": "prelu", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}


ONNX_VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}


def _unary_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        keep = {k: v for k, v in attrs.items() if k in UNARY_ATTRS}
        return [ctx.call(op, x, **keep)]
    return convert


def _binary_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if ctx.opset < 7 and attrs.get("broadcast", 0) and "axis" in attrs:
            raise IRError("legacy broadcast with an axis attribute (opset < 7) is not supported")
        if op == "power" and ctx.tensor_type(b).dtype != ctx.tensor_type(a).dtype:
            return [_mixed_power(ctx, a, b)]
        return [ctx.call(op, a, b)]
    return convert


def _mixed_power(ctx: GraphContext, a: g.Expr, b: g.Expr) -> g.Expr:
    """ONNX Pow whose exponent's type is not the base's. An integer base with a float
    exponent is onnxruntime's `std::pow` in double, cast back by x86's conversion:
    `3 ** 2.5` is 15, a NaN exponent, `3 ** inf` or an overflow the type's most negative
    value, `3 ** -1e20` 0 (docs/onnx.md, *Numerics at the edges*). Otherwise the
    exponent takes the base's type."""
    base = ctx.tensor_type(a).dtype
    if not (dt.is_int(base) and dt.is_float(ctx.tensor_type(b).dtype)):
        return ctx.call("power", a, ctx.call("cast", b, dtype=base))
    wide = [ctx.call("cast", v, dtype="float64") for v in (a, b)]
    return ctx.call("cast", ctx.call("power", *wide), dtype=base, float_to_int=X86)


def _variadic_converter(onnx_name: str, op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        args = [x for x in inputs if x is not None]
        if not args:
            raise IRError(f"{onnx_name} needs at least one input")
        acc = args[0]
        for x in args[1:]:
            acc = ctx.call(op, acc, x)
        if onnx_name == "Mean" and len(args) > 1:
            acc = ctx.call("divide", acc, ctx.const(len(args), ctx.tensor_type(acc).dtype))
        elif len(args) == 1:
            acc = ctx.call("copy", acc)
        return [acc]
    return convert


@onnx_op("Mod")
def _mod_converter(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [ctx.call("fmod" if attrs.get("fmod", 0) else "mod", a, b)]


@onnx_op("BitShift")
def _bitshift_converter(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                        attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    direction = attrs.get("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise IRError(f"BitShift direction must be LEFT or RIGHT, got {direction!r}")
    return [ctx.call("left_shift" if direction == "LEFT" else "right_shift", a, b)]


for _onnx, _kiln in ONNX_UNARY.items():
    onnx_op(_onnx)(_unary_converter(_kiln))


for _onnx, _kiln in ONNX_BINARY.items():
    onnx_op(_onnx)(_binary_converter(_kiln))


for _onnx, _kiln in ONNX_VARIADIC.items():
    onnx_op(_onnx)(_variadic_converter(_onnx, _kiln))
