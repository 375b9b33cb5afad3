"""Elementwise corpus cases: float arithmetic, math intrinsics, broadcasting, selects."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir import tensor as t
from kiln.ir.tensor import Cast, Intrin, const, max_, min_, select

from ._build import elementwise, f32, loop_nest
from ._case import CorpusCase

SHAPE = (3, 5)


# --------------------------------------------------------------------------- binary float32


def _binary_f32() -> IRModule:
    ib = IRBuilder()
    elementwise(ib, "add", SHAPE, ["float32"] * 2, "float32", lambda a, b: a + b)
    elementwise(ib, "sub", SHAPE, ["float32"] * 2, "float32", lambda a, b: a - b)
    elementwise(ib, "mul", SHAPE, ["float32"] * 2, "float32", lambda a, b: a * b)
    elementwise(ib, "div", SHAPE, ["float32"] * 2, "float32", lambda a, b: a / b)
    elementwise(ib, "minimum", SHAPE, ["float32"] * 2, "float32", min_)
    elementwise(ib, "maximum", SHAPE, ["float32"] * 2, "float32", max_)
    elementwise(ib, "power", SHAPE, ["float32"] * 2, "float32",
                lambda a, b: t.binary("pow", a, b))
    elementwise(ib, "fused", SHAPE, ["float32"] * 3, "float32",
                lambda a, b, c: (a * b + c) * 0.5 - a / (c * c + 1.0))
    return ib.get()


def _binary_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    if name == "div":
        a = rng.standard_normal(SHAPE).astype(np.float32)
        b = (rng.uniform(0.5, 2.0, SHAPE) * rng.choice([-1, 1], SHAPE)).astype(np.float32)
        return [a, b, np.zeros(SHAPE, np.float32)]
    if name == "power":
        a = rng.uniform(0.1, 3.0, SHAPE).astype(np.float32)
        b = rng.uniform(-2.0, 2.0, SHAPE).astype(np.float32)
        return [a, b, np.zeros(SHAPE, np.float32)]
    return None


BINARY_F32 = CorpusCase(
    "binary_f32", _binary_f32, _binary_inputs,
    reference={
        "add": lambda a, b, y: a + b,
        "sub": lambda a, b, y: a - b,
        "mul": lambda a, b, y: a * b,
        "div": lambda a, b, y: a / b,
        "minimum": lambda a, b, y: np.minimum(a, b),
        "maximum": lambda a, b, y: np.maximum(a, b),
        "power": lambda a, b, y: np.power(a.astype(np.float64), b),
        "fused": lambda a, b, c, y: (a * b + c) * np.float32(0.5) - a / (c * c + 1),
    },
)

# --------------------------------------------------------------------------- intrinsics


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


# name -> (IR builder of the expression, numpy reference, input sampler)
_UNARY: dict[str, tuple[Any, Any, Any]] = {
    "exp": (lambda x: Intrin("exp", (x,)), np.exp, None),
    "tanh": (lambda x: Intrin("tanh", (x,)), np.tanh, None),
    "sigmoid": (lambda x: Intrin("sigmoid", (x,)), lambda x: 1 / (1 + np.exp(-x)), None),
    "erf": (lambda x: Intrin("erf", (x,)), _erf, None),
    "sqrt_abs": (lambda x: Intrin("sqrt", (Intrin("abs", (x,)),)),
                 lambda x: np.sqrt(np.abs(x)), None),
    "rsqrt": (lambda x: Intrin("rsqrt", (x * x + 1.0,)),
              lambda x: 1 / np.sqrt(x.astype(np.float64) ** 2 + 1), None),
    "log_abs": (lambda x: Intrin("log", (Intrin("abs", (x,)) + 0.01,)),
                lambda x: np.log(np.abs(x) + np.float32(0.01)), None),
    "log1p_abs": (lambda x: Intrin("log1p", (Intrin("abs", (x,)),)),
                  lambda x: np.log1p(np.abs(x)), None),
    "sin_cos": (lambda x: Intrin("sin", (x,)) * Intrin("cos", (x,)),
                lambda x: np.sin(x) * np.cos(x), None),
    "atan2": (lambda x: Intrin("atan2", (x, x * x + 0.5)),
              lambda x: np.arctan2(x, x * x + np.float32(0.5)), None),
    "exp2_expm1": (lambda x: Intrin("exp2", (x,)) + Intrin("expm1", (x,)),
                   lambda x: np.exp2(x) + np.expm1(x), None),
    "floor": (lambda x: Intrin("floor", (x,)), np.floor, "halves"),
    "ceil": (lambda x: Intrin("ceil", (x,)), np.ceil, "halves"),
    "trunc": (lambda x: Intrin("trunc", (x,)), np.trunc, "halves"),
    "round_half_even": (lambda x: Intrin("round", (x,)), np.rint, "halves"),
    "fmod": (lambda x: Intrin("fmod", (x * 7.0, f32(2.5))),
             lambda x: np.fmod(x * np.float32(7), np.float32(2.5)), None),
    "nan_to_num": (lambda x: select(Intrin("isnan", (x,)), f32(0.0),
                                    select(Intrin("isinf", (x,)), f32(1.0), x)),
                   lambda x: np.where(np.isnan(x), 0, np.where(np.isinf(x), 1, x)), "special"),
}


def _unary_math() -> IRModule:
    ib = IRBuilder()
    for name, (expr, _, _) in _UNARY.items():
        elementwise(ib, name, SHAPE, ["float32"], "float32", expr)
    return ib.get()


def _unary_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    sampler = _UNARY[name][2]
    out = np.zeros(SHAPE, np.float32)
    if sampler == "halves":
        x = (rng.integers(-8, 9, SHAPE) / 2).astype(np.float32)
        return [x, out]
    if sampler == "special":
        x = rng.standard_normal(SHAPE).astype(np.float32)
        x.flat[[0, 4, 7]] = [np.nan, np.inf, -np.inf]
        return [x, out]
    return None


def _unary_ref(fn: Any) -> Any:
    return lambda x, y: fn(x)


UNARY_MATH = CorpusCase(
    "unary_math", _unary_math, _unary_inputs,
    reference={name: _unary_ref(fn) for name, (_, fn, _) in _UNARY.items()},
    rtol=2e-6, atol=1e-6,
)

# --------------------------------------------------------------------------- broadcasting


def _broadcast() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_row"):
        A = ib.arg("A", (4, 3), "float32")
        B = ib.arg("B", (3,), "float32")
        C = ib.arg("C", (4, 3), "float32")
        with loop_nest(ib, (4, 3)) as (i, j):
            ib.store(C, [i, j], A[i, j] + B[j])
    with ib.prim_func("add_outer"):
        A = ib.arg("A", (4, 1), "float32")
        B = ib.arg("B", (1, 3), "float32")
        C = ib.arg("C", (4, 3), "float32")
        with loop_nest(ib, (4, 3)) as (i, j):
            ib.store(C, [i, j], A[i, 0] + B[0, j])
    with ib.prim_func("scale_by_scalar_tensor"):
        A = ib.arg("A", (4, 3), "float32")
        S = ib.arg("S", (), "float32")
        C = ib.arg("C", (4, 3), "float32")
        with loop_nest(ib, (4, 3)) as (i, j):
            ib.store(C, [i, j], A[i, j] * S[()])
    return ib.get()


BROADCAST = CorpusCase(
    "broadcast", _broadcast,
    reference={
        "add_row": lambda a, b, c: a + b,
        "add_outer": lambda a, b, c: a + b,
        "scale_by_scalar_tensor": lambda a, s, c: a * s,
    },
)

# --------------------------------------------------------------------------- clip / relu / where


def _activations() -> IRModule:
    ib = IRBuilder()
    elementwise(ib, "clip", SHAPE, ["float32"], "float32",
                lambda x: min_(max_(x, -0.5), 0.5))
    elementwise(ib, "relu", SHAPE, ["float32"], "float32", lambda x: max_(x, 0.0))
    elementwise(ib, "relu6", SHAPE, ["float32"], "float32",
                lambda x: min_(max_(x * 4.0, 0.0), 6.0))
    elementwise(ib, "leaky_relu", SHAPE, ["float32"], "float32",
                lambda x: select(x > 0.0, x, x * 0.1))
    return ib.get()


ACTIVATIONS = CorpusCase(
    "activations", _activations,
    reference={
        "clip": lambda x, y: np.clip(x, -0.5, 0.5),
        "relu": lambda x, y: np.maximum(x, 0),
        "relu6": lambda x, y: np.clip(x * 4, 0, 6),
        "leaky_relu": lambda x, y: np.where(x > 0, x, x * np.float32(0.1)),
    },
)


def _where() -> IRModule:
    ib = IRBuilder()
    elementwise(ib, "where", SHAPE, ["bool", "float32", "float32"], "float32", select)
    elementwise(ib, "where_int", SHAPE, ["bool", "int32", "int32"], "int32",
                lambda c, a, b: select(c, a * 2, b - a))
    return ib.get()


WHERE = CorpusCase(
    "where", _where,
    reference={
        "where": lambda c, a, b, y: np.where(c, a, b),
        "where_int": lambda c, a, b, y: np.where(c, a * 2, b - a),
    },
)

# --------------------------------------------------------------------------- other float types


def _float64_math() -> IRModule:
    ib = IRBuilder()
    elementwise(ib, "mix", SHAPE, ["float64", "float64"], "float64",
                lambda a, b: a * b + Intrin("exp", (a,)) / (b * b + 1.0))
    elementwise(ib, "pow_log", SHAPE, ["float64", "float64"], "float64",
                lambda a, b: Intrin("pow", (Intrin("abs", (a,)) + 0.5, b))
                + Intrin("log", (b * b + 1.0,)))
    elementwise(ib, "narrow", SHAPE, ["float64"], "float32",
                lambda a: Cast("float32", a * 3.0) + 1.0)
    return ib.get()


FLOAT64_MATH = CorpusCase(
    "float64_math", _float64_math,
    reference={
        "mix": lambda a, b, y: a * b + np.exp(a) / (b * b + 1),
        "pow_log": lambda a, b, y: np.power(np.abs(a) + 0.5, b) + np.log(b * b + 1),
        "narrow": lambda a, y: (a * 3).astype(np.float32) + np.float32(1),
    },
    rtol=1e-12, atol=1e-12,
)


def _float16_storage() -> IRModule:
    ib = IRBuilder()
    # Computed in float32, rounded once by the store.
    elementwise(ib, "square_plus_one", SHAPE, ["float16"], "float16", lambda x: x * x + 1.0)
    elementwise(ib, "widen", SHAPE, ["float16", "float16"], "float32",
                lambda a, b: Cast("float32", a) * Cast("float32", b))
    # An explicit Cast to float16 rounds in the middle of an expression.
    elementwise(ib, "round_trip", SHAPE, ["float32"], "float32",
                lambda x: Cast("float32", Cast("float16", x * 1.001)) - x)
    return ib.get()


def _f16_square_plus_one(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    w = x.astype(np.float32)
    return (w * w + np.float32(1)).astype(np.float16)


FLOAT16_STORAGE = CorpusCase(
    "float16_storage", _float16_storage,
    reference={
        "square_plus_one": _f16_square_plus_one,
        "widen": lambda a, b, y: a.astype(np.float32) * b.astype(np.float32),
        "round_trip": lambda x, y: (x * np.float32(1.001)).astype(np.float16)
        .astype(np.float32) - x,
    },
    rtol=1e-6, atol=1e-6, tags=frozenset({"float16"}),
)


def _bool_logic() -> IRModule:
    ib = IRBuilder()
    elementwise(ib, "logic", SHAPE, ["float32", "float32", "bool"], "bool",
                lambda a, b, c: ((a > 0.0) & ~(b < 0.5)) ^ c | (a.eq(b)))
    with ib.prim_func("count_true"):
        X = ib.arg("X", (4, 6), "bool")
        N = ib.arg("N", (4,), "int32")
        with ib.for_range(4, name="i") as i:
            ib.store(N, [i], const(0, "int32"))
            with ib.for_range(6, name="j") as j:
                ib.store(N, [i], N[i] + Cast("int32", X[i, j]))
    with ib.prim_func("any_positive"):
        X = ib.arg("X", (4, 6), "float32")
        Y = ib.arg("Y", (4,), "bool")
        with ib.for_range(4, name="i") as i:
            ib.store(Y, [i], const(False))
            with ib.for_range(6, name="j") as j:
                ib.store(Y, [i], Y[i] | (X[i, j] > 1.0))
    return ib.get()


BOOL_LOGIC = CorpusCase(
    "bool_logic", _bool_logic,
    reference={
        "logic": lambda a, b, c, y: ((a > 0) & ~(b < 0.5)) ^ c | (a == b),
        "count_true": lambda x, n: x.sum(axis=1).astype(np.int32),
        "any_positive": lambda x, y: (x > 1).any(axis=1),
    },
)

CASES = [BINARY_F32, UNARY_MATH, BROADCAST, ACTIVATIONS, WHERE, FLOAT64_MATH, FLOAT16_STORAGE,
         BOOL_LOGIC]
