"""Elementwise operators: unary math, activations and broadcasting binary arithmetic.

Each op is one table row: its scalar expression (used by the lowering) beside
its numpy reference (used by the interpreter and constant folding). References
compute 16-bit floats in float32, like the IR does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.tensor import (
    PrimExpr,
    UnaryOp,
    as_expr,
    binary,
    intrin,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import nan_order, te
from kiln.ops._numpy import is_float, widen
from kiln.ops.broadcast import broadcast_index, broadcast_types
from kiln.ops.registry import register_op

BinaryFn = Callable[[PrimExpr, PrimExpr], PrimExpr]
Attrs = Mapping[str, Any]


def _c(x: PrimExpr, v: float) -> PrimExpr:
    return as_expr(v, x.dtype)


def _f(x: PrimExpr, attrs: Attrs, key: str, default: float) -> PrimExpr:
    return as_expr(float(attrs.get(key, default)), x.dtype)


def _a(attrs: Attrs, key: str, default: float) -> float:
    return float(attrs.get(key, default))


_erf_vec = np.vectorize(math.erf, otypes=[np.float64])


def _erf_ref(a: np.ndarray) -> np.ndarray:
    return _erf_vec(a.astype(np.float64)) if a.size else a.astype(np.float64)


def _sign(x: PrimExpr) -> PrimExpr:
    zero = _c(x, 0)
    # NaN stays NaN (np.sign; onnxruntime's float and double), a zero gives +0
    rest = select(nan_order.is_nan(x), x, zero) if dt.is_float(x.dtype) else zero
    return select(x > zero, _c(x, 1), select(x < zero, _c(x, -1), rest))


def _elu(x: PrimExpr, alpha: PrimExpr) -> PrimExpr:
    return select(x > _c(x, 0), x, alpha * (intrin("exp", x) - _c(x, 1)))


def _softplus(x: PrimExpr) -> PrimExpr:
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))
    return max_(x, _c(x, 0)) + intrin("log1p", intrin("exp", -intrin("abs", x)))


def _softplus_ref(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))


def _gelu(x: PrimExpr, attrs: Attrs) -> PrimExpr:
    if attrs.get("approximate", "none") == "tanh":
        inner = _c(x, 0.7978845608028654) * (x + _c(x, 0.044715) * x * x * x)
        # 0.5 (1 + tanh(u)) is sigmoid(2u): one exp and one division, no cancellation
        return x * intrin("sigmoid", inner + inner)
    return _c(x, 0.5) * x * (_c(x, 1) + intrin("erf", x * _c(x, 0.7071067811865476)))


def _gelu_ref(a: np.ndarray, attrs: Attrs) -> np.ndarray:
    a64 = a.astype(np.float64)
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * a64 * (1 + np.tanh(0.7978845608028654 * (a64 + 0.044715 * a64 ** 3)))
    return 0.5 * a64 * (1 + _erf_ref(a64 / np.sqrt(2)))


def _celu(x: PrimExpr, attrs: Attrs) -> PrimExpr:
    alpha = _f(x, attrs, "alpha", 1.0)
    return max_(_c(x, 0), x) + min_(_c(x, 0), alpha * (intrin("exp", x / alpha) - _c(x, 1)))


def _shrink(x: PrimExpr, attrs: Attrs) -> PrimExpr:
    lambd, bias = _f(x, attrs, "lambd", 0.5), _f(x, attrs, "bias", 0.0)
    return select(x < -lambd, x + bias, select(x > lambd, x - bias, _c(x, 0)))


def _shrink_ref(v: np.ndarray, attrs: Attrs) -> np.ndarray:
    lambd, bias = _a(attrs, "lambd", 0.5), _a(attrs, "bias", 0.0)
    return np.where(v < -lambd, v + bias, np.where(v > lambd, v - bias, 0))


def _int_abs(x: PrimExpr) -> PrimExpr:
    return intrin("abs", x) if dt.is_float(x.dtype) or dt.is_signed(x.dtype) else x


UnaryFn = Callable[[PrimExpr, Attrs], PrimExpr]
UnaryRef = Callable[[np.ndarray, Attrs], np.ndarray]

# name -> (scalar expression, numpy reference); both see the op's attributes.
UNARY: dict[str, tuple[UnaryFn, UnaryRef]] = {
    "neg": (lambda x, a: -x, lambda v, a: np.negative(v)),
    "abs": (lambda x, a: _int_abs(x), lambda v, a: np.abs(v)),
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
    "tan": (lambda x, a: intrin("tan", x), lambda v, a: np.tan(v)),
    "asin": (lambda x, a: intrin("asin", x), lambda v, a: np.arcsin(v)),
    "acos": (lambda x, a: intrin("acos", x), lambda v, a: np.arccos(v)),
    "atan": (lambda x, a: intrin("atan", x), lambda v, a: np.arctan(v)),
    "sinh": (lambda x, a: intrin("sinh", x), lambda v, a: np.sinh(v)),
    "cosh": (lambda x, a: intrin("cosh", x), lambda v, a: np.cosh(v)),
    "asinh": (lambda x, a: intrin("asinh", x), lambda v, a: np.arcsinh(v)),
    "acosh": (lambda x, a: intrin("acosh", x), lambda v, a: np.arccosh(v)),
    "atanh": (lambda x, a: intrin("atanh", x), lambda v, a: np.arctanh(v)),
    "tanh": (lambda x, a: intrin("tanh", x), lambda v, a: np.tanh(v)),
    "sigmoid": (lambda x, a: intrin("sigmoid", x), lambda v, a: 1 / (1 + np.exp(-v))),
    "relu": (lambda x, a: max_(x, _c(x, 0)), lambda v, a: np.maximum(v, 0)),
    "leaky_relu": (lambda x, a: select(x >= _c(x, 0), x, _f(x, a, "alpha", 0.01) * x),
                   lambda v, a: np.where(v >= 0, v, _a(a, "alpha", 0.01) * v)),
    # exp(x) - 1 as the kernels (and onnxruntime) compute it: 0 where exp(x) rounds to 1
    "elu": (lambda x, a: _elu(x, _f(x, a, "alpha", 1.0)),
            lambda v, a: np.where(v > 0, v, _a(a, "alpha", 1.0) * (np.exp(v) - 1))),
    "selu": (lambda x, a: _f(x, a, "gamma", 1.0507009873554805) * _elu(
        x, _f(x, a, "alpha", 1.6732632423543772)),
             lambda v, a: _a(a, "gamma", 1.0507009873554805) * np.where(
                 v > 0, v, _a(a, "alpha", 1.6732632423543772) * (np.exp(v) - 1))),
    "celu": (_celu, lambda v, a: np.maximum(0, v) + np.minimum(
        0, _a(a, "alpha", 1.0) * (np.exp(v / _a(a, "alpha", 1.0)) - 1))),
    "hard_sigmoid": (lambda x, a: max_(_c(x, 0), min_(_c(x, 1), _f(x, a, "alpha", 0.2) * x
                                                      + _f(x, a, "beta", 0.5))),
                     lambda v, a: np.clip(_a(a, "alpha", 0.2) * v + _a(a, "beta", 0.5), 0, 1)),
    "hard_swish": (lambda x, a: x * max_(_c(x, 0), min_(_c(x, 1), x / 6 + _c(x, 0.5))),
                   lambda v, a: v * np.clip(v / 6 + 0.5, 0, 1)),
    "softplus": (lambda x, a: _softplus(x), lambda v, a: _softplus_ref(v)),
    "softsign": (lambda x, a: x / (_c(x, 1) + intrin("abs", x)), lambda v, a: v / (1 + np.abs(v))),
    "mish": (lambda x, a: x * intrin("tanh", _softplus(x)),
             lambda v, a: v * np.tanh(_softplus_ref(v))),
    "thresholded_relu": (lambda x, a: select(x > _f(x, a, "alpha", 1.0), x, _c(x, 0)),
                         lambda v, a: np.where(v > _a(a, "alpha", 1.0), v, 0)),
    "shrink": (_shrink, _shrink_ref),
    "swish": (lambda x, a: x * intrin("sigmoid", _f(x, a, "alpha", 1.0) * x),
              lambda v, a: v / (1 + np.exp(-_a(a, "alpha", 1.0) * v))),
    "gelu": (_gelu, _gelu_ref),
    "bitwise_not": (lambda x, a: UnaryOp("not", x), lambda v, a: np.invert(v)),
}


def _unary_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    return types[0]


def _register_unary(name: str, fn: UnaryFn, ref: UnaryRef) -> None:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        return te.compute(x.shape, lambda *i: fn(x[i], attrs), x.dtype, name)

    def reference(a: np.ndarray, **attrs: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(ref(widen(a), attrs)).astype(a.dtype)

    register_op(name, pattern="elemwise", infer=_unary_infer, compute=compute,
                reference=reference)


for _name, (_fn, _ref) in UNARY.items():
    _register_unary(_name, _fn, _ref)


def _isinf(x: PrimExpr, attrs: Attrs) -> PrimExpr:
    neg, pos = bool(attrs.get("detect_negative", 1)), bool(attrs.get("detect_positive", 1))
    inf = intrin("isinf", x)
    if neg and pos:
        return inf
    if not neg and not pos:
        return as_expr(False)
    return inf & ((x > _c(x, 0)) if pos else (x < _c(x, 0)))


def _isinf_ref(v: np.ndarray, **attrs: Any) -> np.ndarray:
    neg, pos = bool(attrs.get("detect_negative", 1)), bool(attrs.get("detect_positive", 1))
    v = widen(v)
    return (np.isposinf(v) & pos) | (np.isneginf(v) & neg)


def _register_predicate(name: str, fn: UnaryFn, ref: Callable[..., np.ndarray]) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        if not dt.is_float(types[0].dtype):
            raise IRError(f"{name} needs a float tensor, got {types[0].dtype}")
        return TensorType(types[0].shape, "bool")

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        return te.compute(x.shape, lambda *i: fn(x[i], attrs), "bool", name)

    register_op(name, pattern="elemwise", infer=infer, compute=compute, reference=ref)


_register_predicate("isnan", lambda x, a: intrin("isnan", x),
                    lambda v, **a: np.isnan(widen(v)))
_register_predicate("isinf", _isinf, _isinf_ref)


def _mod_expr(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Remainder with the divisor's sign (Python's %), for ints and floats."""
    if not dt.is_float(a.dtype):
        return binary("floormod", a, b)
    r = binary("mod", a, b)
    zero = _c(a, 0)
    wrong_sign = r.ne(zero) & ((r < zero).ne(b < zero))
    return select(wrong_sign, r + b, r)


def _divide_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if is_float(a):
        return np.divide(widen(a), widen(b))
    # integer division truncates toward zero (C), like the IR's `div`
    q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
    return np.where((a < 0) != (b < 0), -q, q)


def _power_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if is_float(a):
        return np.power(widen(a), widen(b))
    return np.power(a.astype(np.int64), b.astype(np.int64))


def _mod_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(widen(a), widen(b))


def _fmod_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.fmod(widen(a), widen(b))


def _shift(left: bool) -> BinaryFn:
    """Shift; amounts outside [0, bits) give 0 (left) or the sign fill (right), like ONNX."""
    def fn(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        if not dt.is_int(a.dtype):
            raise IRError(f"bit shifts need integer operands, got {a.dtype}")
        bits = dt.bits(a.dtype)
        ok = (b >= as_expr(0, b.dtype)) & (b < as_expr(bits, b.dtype))
        safe = select(ok, b, as_expr(0, b.dtype))     # the IR rejects out-of-range shifts
        shifted = binary("shl" if left else "shr", a, safe)
        zero = as_expr(0, a.dtype)
        if left or not dt.is_signed(a.dtype):
            fill = zero
        else:
            fill = select(a < zero, as_expr(-1, a.dtype), zero)
        return select(ok, shifted, fill)
    return fn


def _shift_ref(left: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        bits = a.dtype.itemsize * 8
        ok = (b >= 0) & (b < bits)
        safe = np.where(ok, b, 0).astype(a.dtype)
        shifted = np.left_shift(a, safe) if left else np.right_shift(a, safe)
        fill = np.zeros_like(a) if left or a.dtype.kind == "u" else np.where(a < 0, -1, 0)
        return np.where(ok, shifted, fill)
    return ref


def _int_only(name: str, fn: BinaryFn) -> BinaryFn:
    def checked(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        if not dt.is_int(a.dtype):
            raise IRError(f"{name} needs integer operands, got {a.dtype}")
        return fn(a, b)
    return checked


# name -> (scalar expression, numpy reference)
BINARY: dict[str, tuple[BinaryFn, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": (lambda a, b: a + b, lambda a, b: np.add(widen(a), widen(b))),
    "subtract": (lambda a, b: a - b, lambda a, b: np.subtract(widen(a), widen(b))),
    "multiply": (lambda a, b: a * b, lambda a, b: np.multiply(widen(a), widen(b))),
    "divide": (lambda a, b: a / b, _divide_ref),
    "maximum": (max_, lambda a, b: np.maximum(widen(a), widen(b))),
    "minimum": (min_, lambda a, b: np.minimum(widen(a), widen(b))),
    "power": (lambda a, b: intrin("pow", a, b) if dt.is_float(a.dtype) else binary("pow", a, b),
              _power_ref),
    "prelu": (lambda a, b: select(a >= as_expr(0, a.dtype), a, a * b),
              lambda a, b: np.where(a >= 0, widen(a), widen(a) * widen(b))),
    "mod": (_mod_expr, _mod_ref),
    "fmod": (lambda a, b: binary("mod", a, b), _fmod_ref),
    "bitwise_and": (_int_only("bitwise_and", lambda a, b: binary("and", a, b)), np.bitwise_and),
    "bitwise_or": (_int_only("bitwise_or", lambda a, b: binary("or", a, b)), np.bitwise_or),
    "bitwise_xor": (_int_only("bitwise_xor", lambda a, b: binary("xor", a, b)), np.bitwise_xor),
    "left_shift": (_shift(True), _shift_ref(True)),
    "right_shift": (_shift(False), _shift_ref(False)),
}


def _register_binary(name: str, fn: BinaryFn,
                     ref: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        return broadcast_types(types)

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        a, b = inputs
        shape = broadcast_types([TensorType(a.shape, a.dtype), TensorType(b.shape, b.dtype)])
        return te.compute(
            te.dims(shape.shape),
            lambda *i: fn(a[broadcast_index(i, a.shape)], b[broadcast_index(i, b.shape)]),
            a.dtype, name)

    def reference(a: np.ndarray, b: np.ndarray, **attrs: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(ref(a, b)).astype(a.dtype)

    register_op(name, pattern="broadcast", infer=infer, compute=compute, reference=reference)


for _name, (_fn2, _ref2) in BINARY.items():
    _register_binary(_name, _fn2, _ref2)

__all__ = ["BINARY", "UNARY"]
