"""Elementwise operators: unary math and broadcasting binary arithmetic.

Each op is one table row: its scalar expression (used by the lowering) beside
its numpy reference (used by the interpreter and constant folding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.tensor import (
    Const,
    PrimExpr,
    as_expr,
    intrin,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_types
from kiln.ops.registry import register_op

ScalarFn = Callable[[PrimExpr], PrimExpr]
BinaryFn = Callable[[PrimExpr, PrimExpr], PrimExpr]


def _c(x: PrimExpr, v: float) -> PrimExpr:
    return as_expr(v, x.dtype)


# name -> (scalar expression, numpy reference)
UNARY: dict[str, tuple[ScalarFn, Callable[[np.ndarray], np.ndarray]]] = {
    "neg": (lambda x: -x, np.negative),
    "abs": (lambda x: intrin("abs", x) if dt.is_float(x.dtype) else select(x < 0, -x, x),
            np.abs),
    "relu": (lambda x: max_(x, _c(x, 0)), lambda a: np.maximum(a, 0).astype(a.dtype)),
    "sqrt": (lambda x: intrin("sqrt", x), np.sqrt),
    "exp": (lambda x: intrin("exp", x), np.exp),
    "log": (lambda x: intrin("log", x), np.log),
    "tanh": (lambda x: intrin("tanh", x), np.tanh),
    "sigmoid": (lambda x: intrin("sigmoid", x),
                lambda a: (1 / (1 + np.exp(-a))).astype(a.dtype)),
    "floor": (lambda x: intrin("floor", x), np.floor),
    "ceil": (lambda x: intrin("ceil", x), np.ceil),
    "round": (lambda x: intrin("round", x), np.rint),
    "reciprocal": (lambda x: _c(x, 1) / x, lambda a: (1 / a).astype(a.dtype)),
}


def _unary_infer(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> Type:
    return types[0]


def _register_unary(name: str, fn: ScalarFn, ref: Callable[[np.ndarray], np.ndarray]) -> None:
    def compute(inputs: Sequence[te.Tensor], attrs: Mapping[str, Any]) -> te.Tensor:
        (x,) = inputs
        return te.compute(x.shape, lambda *i: fn(x[i]), x.dtype, name)

    register_op(name, pattern="elemwise", infer=_unary_infer, compute=compute,
                reference=lambda a, **attrs: np.asarray(ref(a)).astype(a.dtype))


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

__all__ = ["BINARY", "UNARY", "Const"]
