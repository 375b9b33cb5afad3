"""The reference interpreter's semantics, checked against numpy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.errors import IRError, KilnError
from kiln.ir import Interpreter, IRBuilder, IRModule, TensorType, TupleType, evaluate
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.evaluate import python_source, register_extern_reference
from kiln.ir.tensor import Buffer, Cast, Intrin, PrimFunc, Store, Var, const

N = 64


def unary_module(dtype_in: str, dtype_out: str, fn: Callable[[t.PrimExpr], t.PrimExpr],
                 n: int = N) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (n,), dtype_in)
        Y = ib.arg("Y", (n,), dtype_out)
        with ib.for_range(n, name="i") as i:
            ib.store(Y, [i], fn(X[i]))
    return ib.get()


def binary_module(dtype: str, fn: Callable[[t.PrimExpr, t.PrimExpr], t.PrimExpr],
                  out_dtype: str | None = None, n: int = N) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        A = ib.arg("A", (n,), dtype)
        B = ib.arg("B", (n,), dtype)
        Y = ib.arg("Y", (n,), out_dtype or dtype)
        with ib.for_range(n, name="i") as i:
            ib.store(Y, [i], fn(A[i], B[i]))
    return ib.get()


def run(mod: IRModule, *inputs: np.ndarray, out_dtype: str | None = None) -> np.ndarray:
    out = np.zeros(inputs[0].shape, dt.to_numpy(out_dtype) if out_dtype else inputs[0].dtype)
    evaluate(mod, "f", *inputs, out)
    return out


def full_range(dtype: str, rng: np.random.Generator, n: int = N) -> np.ndarray:
    info = np.iinfo(dt.to_numpy(dtype))
    a = rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=dt.to_numpy(dtype))
    a[:2] = [info.min, info.max]
    return a


# --------------------------------------------------------------------------- integers


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "and", "or", "xor", "min", "max"])
def test_integer_ops_wrap_like_numpy(dtype: str, op: str) -> None:
    rng = np.random.default_rng(0)
    a, b = full_range(dtype, rng), full_range(dtype, rng)
    got = run(binary_module(dtype, lambda x, y: t.BinaryOp(op, x, y)), a, b)
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
           "or": np.bitwise_or, "xor": np.bitwise_xor, "min": np.minimum, "max": np.maximum}[op]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, ref(a, b))


def test_int32_overflow_wraps() -> None:
    a = np.array([2**31 - 1, -2**31, 65536, 46341], np.int32)
    got = run(unary_module("int32", "int32", lambda x: x * 65536 + 1 + x * x, n=4), a)
    expected = (a.astype(np.int64) * 65536 + 1 + a.astype(np.int64) ** 2)
    np.testing.assert_array_equal(got, expected.astype(np.int32))  # astype wraps


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_division_families_with_negative_operands(dtype: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-100, 101, N).astype(dtype)
    b = rng.integers(1, 9, N).astype(dtype) * rng.choice([-1, 1], N).astype(dtype)
    a[:4], b[:4] = [-7, 7, -7, 7], [2, -2, -2, 2]
    got = {op: run(binary_module(dtype, lambda x, y, op=op: t.BinaryOp(op, x, y)), a, b)
           for op in ("div", "mod", "floordiv", "floormod")}
    np.testing.assert_array_equal(got["floordiv"], np.floor_divide(a, b))
    np.testing.assert_array_equal(got["floormod"], np.mod(a, b))
    trunc = np.trunc(a.astype(np.float64) / b).astype(dtype)
    np.testing.assert_array_equal(got["div"], trunc)  # C: toward zero
    np.testing.assert_array_equal(got["mod"], np.fmod(a, b))  # C: sign of the dividend
    assert list(got["div"][:4]) == [-3, -3, 3, 3]
    assert list(got["mod"][:4]) == [-1, 1, -1, 1]
    assert list(got["floordiv"][:4]) == [-4, -4, 3, 3]
    assert list(got["floormod"][:4]) == [1, -1, -1, 1]


def test_integer_division_by_zero_is_an_error() -> None:
    mod = binary_module("int32", lambda x, y: x // y, n=2)
    with pytest.raises(KilnError, match="f: integer division or remainder by zero"):
        run(mod, np.array([1, 2], np.int32), np.array([1, 0], np.int32))


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint32"])
def test_shifts(dtype: str) -> None:
    bits = dt.bits(dtype)
    rng = np.random.default_rng(2)
    a = full_range(dtype, rng)
    s = rng.integers(0, bits, N).astype(dtype)
    np.testing.assert_array_equal(run(binary_module(dtype, lambda x, y: x << y), a, s), a << s)
    np.testing.assert_array_equal(run(binary_module(dtype, lambda x, y: x >> y), a, s), a >> s)
    bad = np.full(N, bits, dtype)
    with pytest.raises(KilnError, match=f"shift amount {bits} is outside"):
        run(binary_module(dtype, lambda x, y: x << y), a, bad)


def test_unary_integer_ops() -> None:
    a = full_range("int32", np.random.default_rng(3))
    np.testing.assert_array_equal(run(unary_module("int32", "int32", lambda x: -x), a), -a)
    np.testing.assert_array_equal(run(unary_module("int32", "int32", lambda x: ~x), a), ~a)
    np.testing.assert_array_equal(
        run(unary_module("int32", "int32", lambda x: Intrin("abs", (x,))), a), np.abs(a))
    u = full_range("uint16", np.random.default_rng(4))
    np.testing.assert_array_equal(run(unary_module("uint16", "uint16", lambda x: ~x), u), ~u)
    np.testing.assert_array_equal(run(unary_module("uint16", "uint16", lambda x: -x), u), -u)


def test_integer_pow() -> None:
    a = np.array([3, -2, 1, -1, 5, 2], np.int32)
    b = np.array([4, 3, -5, -3, -1, 40], np.int32)
    got = run(binary_module("int32", lambda x, y: t.BinaryOp("pow", x, y), n=6), a, b)
    assert list(got) == [81, -8, 1, -1, 0, (2**40) % 2**32 - 0]


# --------------------------------------------------------------------------- random expressions

INT_OPS = ["add", "sub", "mul", "and", "or", "xor", "min", "max", "floordiv", "floormod",
           "div", "mod"]


def random_int_expr(rng: np.random.Generator, leaves: list[t.PrimExpr], dtype: str,
                    depth: int) -> t.PrimExpr:
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.3:
            info = np.iinfo(dt.to_numpy(dtype))
            return const(int(rng.integers(int(info.min), int(info.max), endpoint=True)), dtype)
        return leaves[int(rng.integers(len(leaves)))]
    op = INT_OPS[int(rng.integers(len(INT_OPS)))]
    a = random_int_expr(rng, leaves, dtype, depth - 1)
    b = random_int_expr(rng, leaves, dtype, depth - 1)
    if op in ("floordiv", "floormod", "div", "mod"):
        b = b | const(1, dtype)  # odd, hence never zero
    return t.BinaryOp(op, a, b)


def numpy_eval(e: t.PrimExpr, env: dict[int, np.ndarray], npdt: Any) -> np.ndarray:
    if isinstance(e, t.Const):
        return np.full(N, e.value, npdt)
    if isinstance(e, t.Load):
        return env[id(e.buffer)]
    assert isinstance(e, t.BinaryOp)
    a, b = numpy_eval(e.a, env, npdt), numpy_eval(e.b, env, npdt)
    if e.op == "div":
        return (a - np.fmod(a, b)) // b  # exact: a - fmod(a, b) is a multiple of b
    fns = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
           "or": np.bitwise_or, "xor": np.bitwise_xor, "min": np.minimum, "max": np.maximum,
           "floordiv": np.floor_divide, "floormod": np.mod, "mod": np.fmod}
    return fns[e.op](a, b)  # type: ignore[no-any-return]


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16"])
def test_random_integer_expressions_match_numpy(dtype: str) -> None:
    """Differential test: catches a wrap or a bounds proof the interpreter gets wrong."""
    rng = np.random.default_rng(dt.bits(dtype))
    npdt = dt.to_numpy(dtype)
    for _ in range(40):
        A = Buffer("A", (N,), dtype)
        B = Buffer("B", (N,), dtype)
        Y = Buffer("Y", (N,), dtype)
        i = Var("i")
        expr = random_int_expr(rng, [A[i], B[i]], dtype, 4)
        mod = IRModule({"f": PrimFunc((A, B, Y), t.For(i, const(0), const(N), "serial",
                                                        Store(Y, expr, (i,))))})
        a, b = full_range(dtype, rng), full_range(dtype, rng)
        with np.errstate(all="ignore"):
            expected = numpy_eval(expr, {id(A): a, id(B): b}, npdt)
        got = run(mod, a, b)
        np.testing.assert_array_equal(got, expected, err_msg=python_source(mod["f"]))


def test_random_float32_expressions_are_computed_in_float32() -> None:
    rng = np.random.default_rng(5)
    ops = ["add", "sub", "mul", "div", "min", "max"]
    for _ in range(30):
        A, B, Y = (Buffer(n, (N,), "float32") for n in "ABY")
        i = Var("i")

        def build(depth: int, A: Buffer = A, B: Buffer = B, i: Var = i) -> t.PrimExpr:
            if depth == 0 or rng.random() < 0.2:
                return [A[i], B[i], const(float(rng.standard_normal()), "float32")][
                    int(rng.integers(3))]
            return t.BinaryOp(ops[int(rng.integers(len(ops)))], build(depth - 1),
                              build(depth - 1))

        def ref(e: t.PrimExpr, a: np.ndarray, b: np.ndarray, A: Buffer = A) -> np.ndarray:
            if isinstance(e, t.Const):
                return np.full(N, e.value, np.float32)
            if isinstance(e, t.Load):
                return a if e.buffer is A else b
            assert isinstance(e, t.BinaryOp)
            x, y = ref(e.a, a, b), ref(e.b, a, b)
            if e.op == "min":
                return np.where(y < x, y, x)  # the interpreter's rule: b < a ? b : a
            if e.op == "max":
                return np.where(y > x, y, x)
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                    "div": np.divide}[e.op](x, y)  # type: ignore[no-any-return]

        expr = build(4)
        mod = IRModule({"f": PrimFunc((A, B, Y), t.For(i, const(0), const(N), "serial",
                                                        Store(Y, expr, (i,))))})
        a = rng.standard_normal(N).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        with np.errstate(all="ignore"):
            expected = ref(expr, a, b)
        np.testing.assert_array_equal(run(mod, a, b), expected)  # bit-exact, NaN-aware


# --------------------------------------------------------------------------- floats and casts


def test_float_to_int_cast_truncates() -> None:
    x = np.array([-2.7, -0.5, 0.5, 2.7, 127.9, -128.9, 1e3, 3.0], np.float32)
    got = run(unary_module("float32", "int32", lambda v: Cast("int32", v), n=8), x,
              out_dtype="int32")
    assert list(got) == [-2, 0, 0, 2, 127, -128, 1000, 3]
    got8 = run(unary_module("int32", "int8", lambda v: Cast("int8", v), n=8),
               np.array([127, 128, 255, 256, -129, -1, 1000, 0], np.int32), out_dtype="int8")
    assert list(got8) == [127, -128, -1, 0, 127, -1, -24, 0]
    with pytest.raises(KilnError, match="cannot convert nan to an integer"):
        run(unary_module("float32", "int32", lambda v: Cast("int32", v), n=1),
            np.array([np.nan], np.float32), out_dtype="int32")


def test_casts_to_bool_and_back() -> None:
    x = np.array([0.0, -0.0, 0.5, np.nan, -3.0], np.float32)
    got = run(unary_module("float32", "bool", lambda v: Cast("bool", v), n=5), x,
              out_dtype="bool")
    assert list(got) == [False, False, True, True, True]
    got = run(unary_module("bool", "float32", lambda v: Cast("float32", v) * 2.0, n=2),
              np.array([True, False]), out_dtype="float32")
    assert list(got) == [2.0, 0.0]


def test_float32_math_is_float32() -> None:
    # 1 + 2**-24 is not representable in float32: the sum rounds to 1 in float32.
    x = np.array([2.0**-24, 1e-8], np.float32)
    got = run(unary_module("float32", "float32", lambda v: (v + 1.0) - 1.0, n=2), x)
    np.testing.assert_array_equal(got, (x + np.float32(1)) - np.float32(1))
    assert list(got) == [0.0, 0.0]


def test_float16_rounds_on_store_only() -> None:
    # 2049 is not a float16; 2049 - 2048 computed in float32 is exactly 1.
    x = np.array([2048.0, 1.0], np.float16)
    got = run(unary_module("float16", "float16", lambda v: (v + 1.0) - 2048.0, n=2), x)
    assert list(got) == [1.0, np.float16(np.float32(1.0) + 1 - 2048)]
    # ... while a Cast from float32 to float16 rounds in the middle of an expression
    # (2049 rounds to the even 2048). A cast between equal dtypes is a no-op.
    got = run(unary_module("float16", "float16",
                           lambda v: Cast("float16", Cast("float32", v) + 1.0) - 2048.0, n=2), x)
    assert got[0] == 0.0
    got = run(unary_module("float16", "float16",
                           lambda v: Cast("float16", v + 1.0) - 2048.0, n=2), x)
    assert got[0] == 1.0


def test_round_is_half_to_even_and_intrinsics() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6, 3.5], np.float32)
    got = run(unary_module("float32", "float32", lambda v: Intrin("round", (v,)), n=8), x)
    assert list(got) == [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0, 4.0]
    y = np.linspace(-3, 3, 8).astype(np.float32)
    erf = run(unary_module("float32", "float32", lambda v: Intrin("erf", (v,)), n=8), y)
    np.testing.assert_allclose(erf, [math.erf(v) for v in y], rtol=1e-6)
    sig = run(unary_module("float32", "float32", lambda v: Intrin("sigmoid", (v,)), n=8), y)
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-y.astype(np.float64))), rtol=1e-6)
    flags = run(unary_module("float32", "bool", lambda v: Intrin("isnan", (v,)), n=3),
                np.array([np.nan, np.inf, 1.0], np.float32), out_dtype="bool")
    assert list(flags) == [True, False, False]


def test_float_division_by_zero_and_overflow_are_ieee() -> None:
    a = np.array([1.0, -1.0, 0.0, 3e38], np.float32)
    b = np.array([0.0, 0.0, 0.0, 10.0], np.float32)
    got = run(binary_module("float32", lambda x, y: x / y + x * y, n=4), a, b)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == np.inf


def test_select_evaluates_both_sides() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (4,), "float32")
        Y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            # The false side reads X[4] for i == 3 even though it is not selected.
            ib.store(Y, [i], t.select(i < 3, X[i], X[i + 1]))
    with pytest.raises(KilnError, match="index 4 is out of bounds for dimension 0 of size 4"):
        evaluate(ib.get(), "f", np.zeros(4, np.float32), np.zeros(4, np.float32))


# --------------------------------------------------------------------------- memory


def test_out_of_bounds_accesses_are_errors() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (3, 4), "float32")
        k = ib.scalar_arg("k")
        ib.store(X, [1, k], const(1.0, "float32"))
    mod = ib.get()
    x = np.zeros((3, 4), np.float32)
    evaluate(mod, "f", x, 3)
    assert x[1, 3] == 1.0
    # Row 1, column 4 is inside the flat array but outside dimension 1.
    with pytest.raises(KilnError, match=r"f: store to buffer 'X': index 4 is out of bounds "
                                        r"for dimension 1 of size 4"):
        evaluate(mod, "f", x, 4)
    with pytest.raises(KilnError, match="index -1 is out of bounds"):
        evaluate(mod, "f", x, -1)


def test_allocations_start_poisoned() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        Y = ib.arg("Y", (2,), "float32")
        Z = ib.arg("Z", (2,), "int32")
        with ib.allocate("tmp", (2,), "float32") as tmp, \
                ib.allocate("itmp", (2,), "int32", "local") as itmp:
            ib.store(tmp, [0], const(1.0, "float32"))
            ib.store(Y, [0], tmp[0])
            ib.store(Y, [1], tmp[1])  # never written
            ib.store(Z, [0], itmp[0])
    y, z = np.zeros(2, np.float32), np.zeros(2, np.int32)
    evaluate(ib.get(), "f", y, z)
    assert y[0] == 1.0 and np.isnan(y[1])
    assert z[0] == np.frombuffer(b"\xa5" * 4, np.int32)[0]


def test_constant_buffers_and_read_only_arrays() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (2,), "float32")
        with ib.alloc_const("W", np.array([3.0, 4.0], np.float32)) as W, ib.for_range(2) as i:
            ib.store(X, [i], X[i] * W[i])
    x = np.ones(2, np.float32)
    evaluate(ib.get(), "f", x)
    assert list(x) == [3.0, 4.0]
    x.flags.writeable = False
    with pytest.raises(KilnError, match="f: a store wrote to a read-only array"):
        evaluate(ib.get(), "f", x)


def test_zero_dim_buffers() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        S = ib.arg("S", (), "float32")
        ib.store(S, [], S[()] * 2.0)
    s = np.array(1.5, np.float32)
    evaluate(ib.get(), "f", s)
    assert s.shape == () and s == 3.0


# --------------------------------------------------------------------------- arguments


def test_argument_checks_name_the_parameter() -> None:
    mod = unary_module("float32", "float32", lambda v: v, n=4)
    x, y = np.zeros(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(KilnError, match=r"f: expected 2 arguments \(X, Y\), got 1"):
        evaluate(mod, "f", x)
    with pytest.raises(KilnError, match="f: argument 1 'Y': expected dtype float32, got int64"):
        evaluate(mod, "f", x, np.zeros(4, np.int64))
    with pytest.raises(KilnError, match=r"f: argument 0 'X': expected shape \(4,\), got \(5,\)"):
        evaluate(mod, "f", np.zeros(5, np.float32), y)
    with pytest.raises(KilnError, match="argument 0 'X': expected a contiguous array"):
        evaluate(mod, "f", np.zeros(8, np.float32)[::2], y)
    with pytest.raises(KilnError, match="argument 0 'X': expected a numpy array of shape"):
        evaluate(mod, "f", [0.0] * 4, y)
    evaluate(mod, "f", Y=y, X=x)  # keyword arguments by parameter name
    with pytest.raises(KilnError, match="no parameter named 'Z'"):
        evaluate(mod, "f", x, Z=y)


def test_scalar_arguments() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        n = ib.scalar_arg("n", "int8")
        s = ib.scalar_arg("s", "float32")
        Y = ib.arg("Y", (1,), "float32")
        ib.store(Y, [0], Cast("float32", n) * s)
    y = np.zeros(1, np.float32)
    evaluate(ib.get(), "f", 3, 0.5, y)
    assert y[0] == 1.5
    with pytest.raises(KilnError, match="argument 0 'n': 300 does not fit int8"):
        evaluate(ib.get(), "f", 300, 0.5, y)
    with pytest.raises(KilnError, match="argument 1 's': expected a float scalar"):
        evaluate(ib.get(), "f", 3, "x", y)


def test_symbolic_shape_mismatch_is_reported() -> None:
    m = Var("m")
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (m,), "float32")
        Y = ib.arg("Y", (m,), "float32")
        with ib.for_range(m) as i:
            ib.store(Y, [i], X[i])
    x = np.arange(3, dtype=np.float32)
    y = np.zeros(3, np.float32)
    evaluate(ib.get(), "f", x, y)
    np.testing.assert_array_equal(x, y)
    with pytest.raises(KilnError, match="argument 'Y': dimension 0 is 4 but the parameter's "
                                        "shape says m = 3"):
        evaluate(ib.get(), "f", x, np.zeros(4, np.float32))


# --------------------------------------------------------------------------- externs and calls


def test_extern_reference_table() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (3,), "float32")
        with ib.for_range(3) as i:
            ib.store(X, [i], t.CallExtern("my_twice", (X[i],), "float32"))
    mod = ib.get()
    with pytest.raises(IRError, match="f: no reference for extern 'my_twice'"):
        evaluate(mod, "f", np.ones(3, np.float32))
    register_extern_reference("my_twice", ("float32",), "float32", lambda v: v * 2)
    x = np.ones(3, np.float32)
    evaluate(mod, "f", x)
    assert list(x) == [2.0, 2.0, 2.0]
    with pytest.raises(IRError, match="already registered"):
        register_extern_reference("my_twice", ("float32",), "float32", lambda v: v)


def test_extern_dtype_mismatch_and_memcpy() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (3,), "float64")
        with ib.for_range(3) as i:
            ib.store(X, [i], t.CallExtern("expf", (X[i],), "float64"))
    with pytest.raises(IRError, match=r"extern 'expf' takes \(float32\) -> float32, but is "
                                      r"called with \(float64\) -> float64"):
        evaluate(ib.get(), "f", np.ones(3))
    ib = IRBuilder()
    with ib.prim_func("g"):
        A = ib.arg("A", (4,), "int32")
        B = ib.arg("B", (4,), "int32")
        ib.evaluate(t.CallExtern("memcpy", (B, A, const(8, "uint64")), "uint64"))
    a, b = np.arange(4, dtype=np.int32), np.zeros(4, np.int32)
    evaluate(ib.get(), "g", a, b)
    assert list(b) == [0, 1, 0, 0]


def test_call_func_runtime_checks() -> None:
    A = Buffer("A", (4,), "float32")
    i = Var("i")
    callee = PrimFunc((A,), t.For(i, const(0), const(4), "serial",
                                  Store(A, A[i] + 1.0, (i,))))
    B = Buffer("B", (2,), "float32")
    caller = PrimFunc((B,), t.CallFunc("inc", (B,)))
    mod = IRModule({"inc": callee, "caller": caller})
    with pytest.raises(KilnError, match=r"inc: argument 0 'A': expected shape \(4,\), got \(2,\)"):
        evaluate(mod, "caller", np.zeros(2, np.float32))


# --------------------------------------------------------------------------- graph level


def test_graph_call_uses_operator_references() -> None:
    ops = pytest.importorskip("kiln.ops")
    ty = TensorType((2, 3), "float32")
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", ty)
        y = ib.emit(ops.call("add", x, g.Constant(np.ones((2, 3), np.float32))), "y")
        z = ib.emit(ops.call("transpose", y, perm=(1, 0)), "z")
        ib.ret(g.Tuple((z, y)))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    z, y = Interpreter(ops=ops.get_op)(ib.get(), "main", x)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(z, (x + 1).T)
    assert z.flags.c_contiguous
    # kiln.evaluate is the same interpreter with kiln's operators.
    z2, y2 = kiln.evaluate(ib.get(), "main", x)
    np.testing.assert_array_equal(z2, z)
    np.testing.assert_array_equal(y2, y)
    # kiln.ir knows no operators: without a resolver a Call says where to get one.
    with pytest.raises(IRError, match=r"operator 'add': this interpreter has no op resolver; "
                                      r"run the module with kiln\.evaluate"):
        evaluate(ib.get(), "main", x)


def test_graph_call_without_reference() -> None:
    class NoReference:
        reference = None

    x = g.Var("x", TensorType((2,), "float32"))
    fn = g.Function((x,), (), g.Call("mystery", (x,), {}, TensorType((2,), "float32")))
    interpret = Interpreter(ops=lambda name: NoReference())
    with pytest.raises(IRError, match="operator 'mystery' has no reference implementation; "
                                      "legalize it first"):
        interpret(IRModule({"main": fn}), "main", np.zeros(2, np.float32))


def test_graph_tuples_constants_and_argument_checks() -> None:
    ty = TensorType((2,), "float32")
    const_data = np.array([1.0, 2.0], np.float32)
    x = g.Var("x", TupleType((ty, ty)))
    first = g.Var("first", ty)
    fn = g.Function((x,), (g.Binding(first, g.TupleGetItem(x, 0)),),
                    g.Tuple((first, g.Constant(const_data))))
    mod = IRModule({"main": fn})
    a, b = np.zeros(2, np.float32), np.ones(2, np.float32)
    out_first, out_const = evaluate(mod, "main", (a, b))
    assert out_first is a
    np.testing.assert_array_equal(out_const, const_data)
    out_const[0] = 9.0  # results are writable copies of constants
    with pytest.raises(KilnError, match=r"main: argument 0 'x'\[1\]: expected dtype float32"):
        evaluate(mod, "main", (a, b.astype(np.float64)))
    with pytest.raises(KilnError, match="expected a tuple of 2 arrays"):
        evaluate(mod, "main", a)


def test_graph_symbolic_dimensions() -> None:
    n = Var("n")
    A = Buffer("A", (Var("rows"),), "float32")
    B = Buffer("B", (A.shape[0],), "float32")
    i = Var("i")
    kernel = PrimFunc((A, B), t.For(i, const(0), A.shape[0], "serial",
                                    Store(B, A[i] * 3.0, (i,))))
    x = g.Var("x", TensorType((n,), "float32"))
    y = g.Var("y", TensorType((n,), "float32"))
    main = g.Function((x,), (g.Binding(y, g.CallTensor("triple", (x,),
                                                       TensorType((n,), "float32"))),), y)
    mod = IRModule({"triple": kernel, "main": main})
    for size in (1, 5):
        x_val = np.arange(size, dtype=np.float32)
        np.testing.assert_array_equal(evaluate(mod, "main", x_val), x_val * 3)


# --------------------------------------------------------------------------- speed


def test_interpreter_runs_loops_as_compiled_python() -> None:
    """A loop nest runs as one generated Python kernel (`def _kernel`), not by walking the
    IR node by node, which took about a minute for these 64k multiply-adds. Nothing is
    timed here: the host's load decides times (bench/ holds the speed figures)."""
    n = 40
    ib = IRBuilder()
    with ib.prim_func("f"):
        A = ib.arg("A", (n, n), "float32")
        B = ib.arg("B", (n, n), "float32")
        C = ib.arg("C", (n, n), "float32")
        with ib.for_range(n, name="i") as i, ib.for_range(n, name="j") as j:
            ib.store(C, [i, j], const(0.0, "float32"))
            with ib.for_range(n, name="k") as k:
                ib.store(C, [i, j], C[i, j] + A[i, k] * B[k, j])
    mod = ib.get()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.zeros((n, n), np.float32)
    evaluate(mod, "f", a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert "def _kernel" in python_source(mod["f"])


def _chain_module(terms: int) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (4,), "float32")
        Y = ib.arg("Y", (1,), "int32")
        e: t.PrimExpr = Cast("int32", X[0])
        for k in range(terms):
            e = e + Cast("int32", X[k % 4])
        ib.store(Y, [0], e)
    return ib.get()


def test_long_expressions() -> None:
    """A 120-term chain (more operators than FuseOps puts in one kernel) walks fine."""
    from kiln.ir import structural_equal, verify

    mod = _chain_module(120)
    verify(mod)
    assert structural_equal(mod, _chain_module(120))
    y = np.zeros(1, np.int32)
    evaluate(mod, "f", np.array([1, 2, 3, 4], np.float32), y)
    assert y[0] == 1 + sum((1, 2, 3, 4)[k % 4] for k in range(120))


def test_too_deep_expression_is_a_clear_error() -> None:
    """Walks are recursive over expressions and the frame limit is never raised: a
    hand-built 5,000-deep expression is refused up front by an iterative depth check,
    an IRError naming the function, the depth and the limit."""
    from kiln.ir import structural_equal, verify

    mod = _chain_module(5000)
    with pytest.raises(IRError, match=r"function 'f': nested too deeply \(depth 5004 > limit"):
        verify(mod)
    with pytest.raises(IRError, match="nested too deeply"):
        structural_equal(mod, _chain_module(5000))
    with pytest.raises(IRError, match="nested too deeply"):
        evaluate(mod, "f", np.zeros(4, np.float32), np.zeros(1, np.int32))
    from kiln.script import from_source, print_module

    with pytest.raises(IRError, match="nested too deeply"):
        print_module(mod)
    # Refused before Python's own parser, which recurses per level too.
    deep = ("@T.prim_func\ndef f(X: T.Buffer((4,), \"float32\"), Y: T.Buffer((4,), "
            "\"float32\")):\n    Y[0] = " + " + ".join(["X[0]"] * 5000) + "\n")
    with pytest.raises(IRError, match="nested too deeply"):
        from_source(deep)


def test_variable_reused_in_sibling_scopes_gets_fresh_bounds() -> None:
    """A let variable bound twice must not keep the first binding's proven range."""
    X = Buffer("X", (4,), "int32")
    Y = Buffer("Y", (4,), "int32")
    v = Var("v", "int32")
    i, j = Var("i"), Var("j")
    # Each let is flat, in scope to the end of its own loop body.
    first = t.For(i, const(0), const(1), "serial",
                  t.seq(t.LetStmt(v, const(1, "int32")), Store(Y, v, (const(0),))))
    # Second binding: unbounded value, so v + v must wrap and X[v] must be checked.
    second = t.For(j, const(0), const(1), "serial",
                   t.seq(t.LetStmt(v, X[const(0)]), Store(Y, v + v, (const(1),)),
                         Store(Y, X[v], (const(2),))))
    mod = IRModule({"f": PrimFunc((X, Y), t.seq(first, second))})
    y = np.zeros(4, np.int32)
    with pytest.raises(KilnError, match="index 2147483647 is out of bounds"):
        evaluate(mod, "f", np.array([2**31 - 1, 0, 0, 0], np.int32), y)
    assert y[1] == -2  # (2**31 - 1) * 2 wrapped
