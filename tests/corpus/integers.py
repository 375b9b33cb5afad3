"""Integer semantics: wrapping, C vs floor division, shifts, bitwise ops, casts."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir import tensor as t
from kiln.ir.tensor import Cast, Intrin, const, max_, min_

from ._build import loop_nest
from ._case import CorpusCase

N = 16


def _int_division() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("int_division"):
        A = ib.arg("A", (N,), "int32")
        B = ib.arg("B", (N,), "int32")
        outs = [ib.arg(name, (N,), "int32") for name in ("floordiv", "floormod", "div", "mod")]
        with ib.for_range(N, name="i") as i:
            for out, op in zip(outs, ("floordiv", "floormod", "div", "mod")):
                ib.store(out, [i], t.BinaryOp(op, A[i], B[i]))
    with ib.prim_func("index_math"):
        # Loop-index arithmetic with constants, including negative offsets.
        Y = ib.arg("Y", (4, N), "int64")
        with loop_nest(ib, (4, N)) as (i, j):
            k = j - 7
            ib.store(Y, [i, j], (k // 3) * 100 + (k % 3) * 10 + t.BinaryOp("mod", k, const(3)))
    return ib.get()


def _int_division_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    if name != "int_division":
        return None
    a = rng.integers(-50, 51, N).astype(np.int32)
    b = rng.integers(1, 8, N).astype(np.int32) * rng.choice([-1, 1], N).astype(np.int32)
    a[:4], b[:4] = [-7, 7, -7, 7], [2, -2, -2, 2]
    return [a, b, *(np.zeros(N, np.int32) for _ in range(4))]


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b)


def _index_math_reference(y: np.ndarray) -> np.ndarray:
    k = np.arange(N) - 7
    row = (k // 3) * 100 + (k % 3) * 10 + np.fmod(k, 3)
    return np.broadcast_to(row, (4, N)).astype(np.int64)


INT_DIVISION = CorpusCase(
    "int_division", _int_division, _int_division_inputs,
    reference={
        "int_division": lambda a, b, *outs: (np.floor_divide(a, b), np.mod(a, b),
                                              _trunc_div(a, b), np.fmod(a, b)),
        "index_math": _index_math_reference,
    },
)


def _int8_arith() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("int8_ops"):
        A = ib.arg("A", (N,), "int8")
        B = ib.arg("B", (N,), "int8")
        outs = [ib.arg(f"Y{k}", (N,), "int8") for k in range(5)]
        with ib.for_range(N, name="i") as i:
            a, b = A[i], B[i]
            ib.store(outs[0], [i], a * b + a)                  # wraps
            ib.store(outs[1], [i], a - b)
            ib.store(outs[2], [i], (a & b) | (a ^ const(3, "int8")))
            ib.store(outs[3], [i], (a >> const(2, "int8")) + (b << const(1, "int8")))
            ib.store(outs[4], [i], -a)                         # -(-128) == -128
    return ib.get()


def _int8_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    a = rng.integers(-128, 128, N).astype(np.int8)
    b = rng.integers(-128, 128, N).astype(np.int8)
    a[0] = -128
    return [a, b, *(np.zeros(N, np.int8) for _ in range(5))]


INT8_ARITH = CorpusCase(
    "int8_arith", _int8_arith, _int8_inputs,
    reference={"int8_ops": lambda a, b, *o: (a * b + a, a - b, (a & b) | (a ^ np.int8(3)),
                                             (a >> 2) + (b << 1), -a)},
)


def _int32_arith() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("int32_ops"):
        A = ib.arg("A", (N,), "int32")
        B = ib.arg("B", (N,), "int32")
        outs = [ib.arg(f"Y{k}", (N,), "int32") for k in range(4)]
        with ib.for_range(N, name="i") as i:
            a, b = A[i], B[i]
            ib.store(outs[0], [i], a * 7919 + b)               # overflows and wraps
            ib.store(outs[1], [i], max_(a, b) - min_(a, b))
            ib.store(outs[2], [i], Intrin("abs", (a,)))         # abs(INT_MIN) wraps
            ib.store(outs[3], [i], (a ^ (a >> 3)) + ~b)
    with ib.prim_func("int64_accumulate"):
        A = ib.arg("A", (N,), "int32")
        S = ib.arg("S", (1,), "int64")
        ib.store(S, [0], const(0))
        with ib.for_range(N, name="i") as i:
            ib.store(S, [0], S[0] + Cast("int64", A[i]) * Cast("int64", A[i]))
    return ib.get()


def _int32_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    a = rng.integers(-2**31, 2**31, N).astype(np.int32)
    b = rng.integers(-2**31, 2**31, N).astype(np.int32)
    a[0] = -2**31
    if name == "int32_ops":
        return [a, b, *(np.zeros(N, np.int32) for _ in range(4))]
    return [a, np.zeros(1, np.int64)]


INT32_ARITH = CorpusCase(
    "int32_arith", _int32_arith, _int32_inputs,
    reference={
        "int32_ops": lambda a, b, *o: (a * np.int32(7919) + b, np.maximum(a, b) - np.minimum(a, b),
                                       np.abs(a), (a ^ (a >> 3)) + ~b),
        "int64_accumulate": lambda a, s: np.array([np.sum(a.astype(np.int64) ** 2)]),
    },
)


def _uint8_arith() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("uint8_ops"):
        A = ib.arg("A", (N,), "uint8")
        B = ib.arg("B", (N,), "uint8")
        outs = [ib.arg(f"Y{k}", (N,), "uint8") for k in range(4)]
        with ib.for_range(N, name="i") as i:
            a, b = A[i], B[i]
            ib.store(outs[0], [i], a + b)                       # wraps at 256
            ib.store(outs[1], [i], a - b)                       # wraps below 0
            ib.store(outs[2], [i], ~a >> const(1, "uint8"))     # logical shift
            ib.store(outs[3], [i], a * const(3, "uint8") // (b | const(1, "uint8")))
    return ib.get()


def _uint8_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    a = rng.integers(0, 256, N).astype(np.uint8)
    b = rng.integers(0, 256, N).astype(np.uint8)
    return [a, b, *(np.zeros(N, np.uint8) for _ in range(4))]


UINT8_ARITH = CorpusCase(
    "uint8_arith", _uint8_arith, _uint8_inputs,
    reference={"uint8_ops": lambda a, b, *o: (a + b, a - b, ~a >> 1,
                                              (a * np.uint8(3)) // (b | np.uint8(1)))},
)


def _cast_chain() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("cast_chain"):
        X = ib.arg("X", (N,), "float32")
        Y8 = ib.arg("as_int8", (N,), "int8")
        YU = ib.arg("as_uint8", (N,), "uint8")
        YF = ib.arg("back_to_float", (N,), "float32")
        YB = ib.arg("nonzero", (N,), "bool")
        YH = ib.arg("as_half", (N,), "float16")
        # float32 -> int32 truncates toward zero; int32 -> int8 / uint8 wraps.
        with ib.for_range(N, name="i") as i, ib.let("i32", Cast("int32", X[i])) as i32:
            ib.store(Y8, [i], Cast("int8", i32))
            ib.store(YU, [i], Cast("uint8", i32))
            ib.store(YF, [i], Cast("float32", Cast("float16", Cast("int8", i32)))
                     + Cast("float32", Cast("float64", X[i]) * 0.5))
            ib.store(YB, [i], Cast("bool", i32))
            ib.store(YH, [i], Cast("float16", X[i]))
    return ib.get()


def _cast_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    x = rng.uniform(-300, 300, N).astype(np.float32)
    x[:4] = [-0.75, 0.75, 255.9, -129.5]
    return [x, np.zeros(N, np.int8), np.zeros(N, np.uint8), np.zeros(N, np.float32),
            np.zeros(N, bool), np.zeros(N, np.float16)]


def _cast_reference(x: np.ndarray, *outs: np.ndarray) -> tuple[np.ndarray, ...]:
    i32 = x.astype(np.int32)
    back = i32.astype(np.int8).astype(np.float16).astype(np.float32) + \
        (x.astype(np.float64) * 0.5).astype(np.float32)
    return (i32.astype(np.int8), i32.astype(np.uint8), back, i32 != 0, x.astype(np.float16))


CAST_CHAIN = CorpusCase("cast_chain", _cast_chain, _cast_inputs,
                        reference={"cast_chain": _cast_reference}, rtol=0, atol=0)

CASES = [INT_DIVISION, INT8_ARITH, INT32_ARITH, UINT8_ARITH, CAST_CHAIN]
