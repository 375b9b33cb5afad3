"""Scalar semantics of the llvm backend, run through llvmjit and compared with numpy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from llvm_helpers import elementwise, jit, np_dtype

from kiln.ir import IRBuilder
from kiln.ir import dtype as dt
from kiln.ir.tensor import BinaryOp, Cast, Compare, Intrin, PrimExpr, Select, UnaryOp, Var, const

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
ALL_DTYPES = ["bool", *INT_DTYPES, *FLOAT_DTYPES]

RNG = np.random.default_rng(1234)


def _binary_module(ops: list[str], dtypes: list[str], n: int):
    ib = IRBuilder()
    for op, d in itertools.product(ops, dtypes):
        elementwise(f"{op}_{d}", [d, d], d, lambda a, b, op=op: BinaryOp(op, a, b), n, ib)
    return jit(ib.get())


# --------------------------------------------------------------------- integer arithmetic


def _int_operands(d: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(np_dtype(d))
    lo, hi = max(info.min, -100), min(info.max, 100)
    a = RNG.integers(lo, hi + 1, n).astype(np_dtype(d))
    b = RNG.integers(lo, hi + 1, n).astype(np_dtype(d))
    # Edge cases: zero divisors, the minimum value, -1 divisors.
    a[:4] = [info.min, info.max, 7, 0]
    b[:4] = [-1 if info.min < 0 else 3, 0, 0, 5]
    return a, b


@pytest.mark.parametrize("d", INT_DTYPES)
def test_integer_division_family_matches_numpy(d: str) -> None:
    n = 64
    ops = ["add", "sub", "mul", "div", "mod", "floordiv", "floormod", "min", "max"]
    m = _binary_module(ops, [d], n)
    a, b = _int_operands(d, n)
    with np.errstate(all="ignore"):
        expected = {
            "add": a + b, "sub": a - b, "mul": a * b,
            # C truncating division and remainder; by zero -> 0 (numpy's result).
            "div": np.where(b == 0, 0, _trunc_div(a, b)).astype(a.dtype),
            "mod": np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))).astype(a.dtype),
            "floordiv": np.floor_divide(a, b), "floormod": np.remainder(a, b),
            "min": np.minimum(a, b), "max": np.maximum(a, b),
        }
    for op in ops:
        y = np.zeros(n, a.dtype)
        m[f"{op}_{d}"](a, b, y)
        np.testing.assert_array_equal(y, expected[op], err_msg=f"{op} {d}")


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    if a.dtype.kind == "u":
        return a // safe
    q = np.abs(a.astype(object)) // np.abs(safe.astype(object))
    sign = np.sign(a.astype(object)) * np.sign(safe.astype(object))
    out = np.array([int(x) for x in q * sign], dtype=object)
    bits = a.dtype.itemsize * 8
    wrapped = [((int(v) + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) for v in out]
    return np.array(wrapped, dtype=a.dtype)


@pytest.mark.parametrize("d", ["int8", "int32", "int64", "uint8", "uint32", "uint64"])
def test_shifts_and_bitwise_match_numpy(d: str) -> None:
    n = 32
    m = _binary_module(["shl", "shr", "and", "or", "xor"], [d], n)
    bits = np.dtype(d).itemsize * 8
    a = RNG.integers(np.iinfo(d).min, np.iinfo(d).max, n, dtype=d, endpoint=True)
    b = RNG.integers(0, bits, n).astype(d)
    b[:3] = [bits, bits + 5, np.iinfo(d).max]  # out-of-range shift amounts
    if np.iinfo(d).min < 0:
        b[3] = -1
        a[:4] = [-8, 8, -1, 5]
    for op, ref in [("shl", np.left_shift), ("shr", np.right_shift), ("and", np.bitwise_and),
                    ("or", np.bitwise_or), ("xor", np.bitwise_xor)]:
        y = np.zeros(n, d)
        m[f"{op}_{d}"](a, b, y)
        np.testing.assert_array_equal(y, ref(a, b), err_msg=f"{op} {d}")


@pytest.mark.parametrize("d", ["int8", "int32", "int64", "uint16"])
def test_integer_pow(d: str) -> None:
    n = 16
    m = _binary_module(["pow"], [d], n)
    a = RNG.integers(-3 if d[0] == "i" else 0, 4, n).astype(d)
    b = RNG.integers(0, 7, n).astype(d)
    y = np.zeros(n, d)
    m[f"pow_{d}"](a, b, y)
    np.testing.assert_array_equal(y, np.power(a, b))
    if d[0] == "i":
        a = np.array([1, -1, -1, 2, 0] * 3 + [5], d)
        b = np.array([-3, -3, -2, -1, -1] * 3 + [-1], d)
        m[f"pow_{d}"](a, b, y)
        np.testing.assert_array_equal(y, [1, -1, 1, 0, 0] * 3 + [0])


# --------------------------------------------------------------------- floats


@pytest.mark.parametrize("d", ["float32", "float64"])
def test_float_arithmetic_matches_numpy(d: str) -> None:
    n = 64
    ops = ["add", "sub", "mul", "div", "mod", "floordiv", "floormod", "min", "max", "pow"]
    m = _binary_module(ops, [d], n)
    a = (RNG.standard_normal(n) * 10).astype(d)
    b = (RNG.standard_normal(n) * 3).astype(d)
    a[:8] = [1.0, -1.0, 7.5, -7.5, np.nan, 3.0, 0.0, -0.0]
    b[:8] = [0.1, 0.1, -2.0, 2.0, 1.0, np.nan, 0.0, 3.0]
    pa, pb = np.abs(a), b  # pow: non-negative bases keep the reference real
    with np.errstate(all="ignore"):
        expected = {
            "add": a + b, "sub": a - b, "mul": a * b, "div": a / b, "mod": np.fmod(a, b),
            # kiln.ir.evaluate's definitions (numpy's floor_divide differs for 1.0 // 0.1).
            "floordiv": np.floor(a / b), "floormod": a - np.floor(a / b) * b,
            "min": np.minimum(a, b), "max": np.maximum(a, b), "pow": np.power(pa, pb),
        }
    for op in ops:
        y = np.zeros(n, d)
        args = (pa, pb) if op == "pow" else (a, b)
        m[f"{op}_{d}"](*args, y)
        np.testing.assert_allclose(y, expected[op], rtol=1e-6 if d == "float32" else 1e-13,
                                   equal_nan=True, err_msg=f"{op} {d}")
    # beside a constant (a ReLU6's bounds: one vminps / vmaxps) a NaN still wins and a
    # tie still gives the first operand (-0.0 against 0.0)
    ib = IRBuilder()
    bounds = {"min_last": ("min", True), "max_last": ("max", True),
              "min_first": ("min", False), "max_first": ("max", False)}
    for name, (op, x_side) in bounds.items():
        elementwise(name, [d], d, lambda x, op=op, x_side=x_side: BinaryOp(
            op, *((x, const(0.0, d)) if x_side else (const(0.0, d), x))), n, ib)
    m = jit(ib.get())
    zero = np.zeros(n, d)
    for name, (op, x_side) in bounds.items():
        y = np.ones(n, d)
        m[name](a, y)
        first, second = (a, zero) if x_side else (zero, a)
        with np.errstate(invalid="ignore"):  # the rule: (x <= y || isnan(x)) ? x : y
            keep = (first <= second) if op == "min" else (first >= second)
        want = np.where(keep | np.isnan(first), first, second)
        np.testing.assert_array_equal(y, want, err_msg=f"{name} {d}")
        np.testing.assert_array_equal(np.signbit(y), np.signbit(want), err_msg=f"{name} {d}")


def test_float_compare_is_ordered_except_ne() -> None:
    ib = IRBuilder()
    n = 6
    for op in ["eq", "ne", "lt", "le", "gt", "ge"]:
        elementwise(f"cmp_{op}", ["float32", "float32"], "bool",
                    lambda a, b, op=op: Compare(op, a, b), n, ib)
    m = jit(ib.get())
    a = np.array([1.0, np.nan, 2.0, np.nan, -0.0, 3.0], np.float32)
    b = np.array([1.0, 1.0, np.nan, np.nan, 0.0, 2.0], np.float32)
    for op, ref in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                    ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)]:
        y = np.zeros(n, bool)
        m[f"cmp_{op}"](a, b, y)
        np.testing.assert_array_equal(y, ref(a, b), err_msg=op)


def test_unary_ops_and_select() -> None:
    ib = IRBuilder()
    n = 8
    elementwise("neg_i32", ["int32"], "int32", lambda a: UnaryOp("neg", a), n, ib)
    elementwise("not_i32", ["int32"], "int32", lambda a: UnaryOp("not", a), n, ib)
    elementwise("not_bool", ["bool"], "bool", lambda a: UnaryOp("not", a), n, ib)
    elementwise("neg_f32", ["float32"], "float32", lambda a: UnaryOp("neg", a), n, ib)
    elementwise("sel", ["bool", "float32", "float32"], "float32",
                lambda c, a, b: Select(c, a, b), n, ib)
    elementwise("bool_logic", ["bool", "bool"], "bool",
                lambda a, b: BinaryOp("xor", BinaryOp("and", a, b), BinaryOp("or", a, b)), n, ib)
    m = jit(ib.get())
    xi = np.array([0, 1, -1, 5, -(2**31), 2**31 - 1, 7, -7], np.int32)
    xb = np.array([True, False] * 4)
    yb = np.array([True, True, False, False] * 2)
    xf = np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 3.0], np.float32)
    out_i, out_b, out_f = np.zeros(n, np.int32), np.zeros(n, bool), np.zeros(n, np.float32)
    with np.errstate(over="ignore"):
        m["neg_i32"](xi, out_i)
        np.testing.assert_array_equal(out_i, -xi)
    m["not_i32"](xi, out_i)
    np.testing.assert_array_equal(out_i, ~xi)
    m["not_bool"](xb, out_b)
    np.testing.assert_array_equal(out_b, ~xb)
    m["neg_f32"](xf, out_f)
    np.testing.assert_array_equal(np.signbit(out_f), np.signbit(-xf))
    m["sel"](xb, xf, -xf, out_f)
    np.testing.assert_array_equal(out_f, np.where(xb, xf, -xf))
    m["bool_logic"](xb, yb, out_b)
    np.testing.assert_array_equal(out_b, (xb & yb) ^ (xb | yb))


# --------------------------------------------------------------------- casts


def _cast_values(src: str, dst: str) -> np.ndarray:
    """Values of `src` that every numpy platform converts to `dst` the same way."""
    vals: list[float] = [0, 1, 2, 3, 7, 100, 126]
    if dt.is_signed(src) and dt.is_signed(dst):
        vals += [-1, -5, -100, -128]
    if dt.is_float(src):
        vals += [0.25, 2.5, 3.5, 99.75, 1.0009765625]
        if dt.is_signed(dst):
            vals += [-2.5, -0.75, -126.5]
    if src == "bool" or dst == "bool":
        vals = [0, 1, 0, 1, 1] + ([2, -3, 0.5] if src != "bool" else [])
    if src == "bool":
        return np.array([bool(v) for v in vals])
    arr = np.array(vals, dtype=np.float64)
    if not dt.is_signed(src):
        arr = arr[arr >= 0]
    if dt.is_int(src):
        info = np.iinfo(np_dtype(src))
        arr = arr[(arr == np.round(arr)) & (arr >= info.min) & (arr <= info.max)]
    return arr.astype(np_dtype(src))


def test_casts_between_every_dtype_pair() -> None:
    pairs = [(s, d) for s in ALL_DTYPES for d in ALL_DTYPES if s != d]
    ib = IRBuilder()
    inputs = {}
    for s, d in pairs:
        x = _cast_values(s, d)
        inputs[s, d] = x
        elementwise(f"cast_{s}_{d}", [s], d, lambda a, d=d: Cast(d, a), len(x), ib)
    m = jit(ib.get())
    for (s, d), x in inputs.items():
        y = np.zeros(len(x), np_dtype(d))
        m[f"cast_{s}_{d}"](x, y)
        expected = x.astype(np.float64).astype(np_dtype(d)) if s in ("float16", "bfloat16") \
            else x.astype(np_dtype(d))
        np.testing.assert_array_equal(y, expected, err_msg=f"cast {s} -> {d}: {x}")


def test_float_to_int_out_of_range_is_defined() -> None:
    ib = IRBuilder()
    elementwise("f2i8", ["float32"], "int8", lambda a: Cast("int8", a), 4, ib)
    elementwise("f2u64", ["float64"], "uint64", lambda a: Cast("uint64", a), 4, ib)
    m = jit(ib.get())
    y8 = np.zeros(4, np.int8)
    m["f2i8"](np.array([300.7, -129.0, np.nan, 1e30], np.float32), y8)
    # Wraps modulo 2**8 within int64 range, NaN -> 0, saturates beyond int64.
    np.testing.assert_array_equal(y8, [300 - 256, 127, 0, -1])
    yu = np.zeros(4, np.uint64)
    m["f2u64"](np.array([2.0**63, 2.0**64 - 2048, 3.9, 1e300]), yu)
    np.testing.assert_array_equal(yu, [2**63, 2**64 - 2048, 3, 2**64 - 1])


def _low_bits_of_saturated_int64(x: np.ndarray, d: str) -> np.ndarray:
    """The documented float -> int cast: truncate, saturate to int64 (NaN 0), wrap to d."""
    t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=2.0**64, neginf=-2.0**64))
    inside = np.clip(t, -2.0**63, 2.0**63 - 2.0**39).astype(np.int64)  # float32's largest < 2**63
    wide = np.where(t >= 2.0**63, np.iinfo(np.int64).max, inside)
    return wide.astype(np_dtype(d))


@pytest.mark.parametrize("d", ["int8", "uint8", "int16", "int32", "uint32"])
def test_float32_to_narrow_int_in_vector_loops(d: str) -> None:
    """float32 -> (u)int8..32 in loops LLVM vectorizes (a requantizing epilogue) takes
    the 32-bit-lane lowering: the same values as the int64 rule at every edge."""
    edges = [0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 127.5, 255.9, -128.7, 65535.5, 2.0**31,
             -2.0**31, 2.0**31 - 128, 2.0**31 + 256, -2.0**31 - 256, 2.0**32, 2.0**32 + 512,
             3e9, -3e9, 2.0**62, 2.0**63, -2.0**63, 2.0**64, -2.0**64, 1e30, -1e30,
             np.inf, -np.inf, np.nan, 4294967295.0, 1e10, -1e10]
    wide = RNG.standard_normal(96) * 10.0 ** RNG.integers(0, 20, 96)
    x = np.concatenate([edges, wide]).astype(np.float32)
    ib = IRBuilder()
    elementwise("f2i", ["float32"], d, lambda a: Cast(d, a), len(x), ib)
    y = np.zeros(len(x), np_dtype(d))
    jit(ib.get())["f2i"](x, y)
    np.testing.assert_array_equal(y, _low_bits_of_saturated_int64(x, d), err_msg=str(x))


def test_clamped_float_to_int_takes_one_conversion_and_keeps_nan_as_zero() -> None:
    """A cast of an operand clamped by bounds it can see (quantization) is one fptosi
    (kiln.codegen.llvm.float_range); NaN still gives 0 and every value the general rule's."""
    from kiln.codegen.llvm.float_range import fits_int32, float_range

    def clamp(a: PrimExpr) -> PrimExpr:
        zp = Cast("float32", Cast("uint8", const(7, "int32")))
        lo = BinaryOp("sub", const(-300.0, "float32"), zp)
        return BinaryOp("min", BinaryOp("max", Intrin("round", (a,)), lo),
                        const(300.0, "float32"))

    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 2.5, -3.5, 299.7, -0.0, 127.5,
                  *RNG.standard_normal(54) * 200], np.float32)
    v = clamp(Var("x", "float32"))
    assert float_range(v) == (-300.0 - 255, 300.0) and fits_int32(v)  # zp: any uint8
    assert not fits_int32(Intrin("round", (Var("x", "float32"),)))
    for d in ("int8", "int16", "int32"):
        ib = IRBuilder()
        elementwise("f", ["float32"], d, lambda a, d=d: Cast(d, clamp(a)), len(x), ib)
        y = np.zeros(len(x), np_dtype(d))
        jit(ib.get())["f"](x, y)
        with np.errstate(invalid="ignore"):
            clamped = np.minimum(np.maximum(np.round(x), np.float32(-307.0)), np.float32(300.0))
        np.testing.assert_array_equal(y, _low_bits_of_saturated_int64(clamped, d))


@pytest.mark.parametrize("d", ["float16", "bfloat16"])
def test_half_rounding_matches_numpy_bit_for_bit(d: str) -> None:
    n = 4096
    ib = IRBuilder()
    elementwise("from32", ["float32"], d, lambda a: Cast(d, a), n, ib)
    elementwise("from64", ["float64"], d, lambda a: Cast(d, a), n, ib)
    elementwise("to32", [d], "float32", lambda a: Cast("float32", a), n, ib)
    m = jit(ib.get())
    exps = RNG.uniform(-30, 20, n)
    x64 = np.sign(RNG.standard_normal(n)) * np.exp2(exps)
    x64[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.99,
                2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 1.0 + 2.0**-11]
    want = np_dtype(d)
    with np.errstate(over="ignore"):
        x32 = x64.astype(np.float32)
        ref32, ref64 = x32.astype(want), x64.astype(want)
    y = np.zeros(n, want)
    m["from32"](x32, y)
    np.testing.assert_array_equal(y.view(np.uint16), ref32.view(np.uint16))
    m["from64"](x64, y)
    # NaN payloads may differ; compare NaN-ness, and bits everywhere else.
    nan = np.isnan(ref64.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(y.astype(np.float32)), nan)
    np.testing.assert_array_equal(y.view(np.uint16)[~nan], ref64.view(np.uint16)[~nan])
    back = np.zeros(n, np.float32)
    m["to32"](ref64, back)
    np.testing.assert_array_equal(back, ref64.astype(np.float32))


def test_float16_arithmetic_computes_in_float32_and_rounds_on_store() -> None:
    n = 256
    ib = IRBuilder()
    elementwise("fma16", ["float16", "float16", "float16"], "float16",
                lambda a, b, c: a * b + c, n, ib)
    m = jit(ib.get())
    a, b, c = (RNG.standard_normal(n).astype(np.float16) for _ in range(3))
    y = np.zeros(n, np.float16)
    m["fma16"](a, b, c, y)
    ref = (a.astype(np.float32) * b.astype(np.float32) + c.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(y, ref)


def test_scalar_parameters_of_every_kind() -> None:
    ib = IRBuilder()
    with ib.prim_func("scale"):
        x = ib.arg("X", (4,), "float16")
        y = ib.arg("Y", (4,), "float32")
        s16 = ib.scalar_arg("s16", "float16")
        k = ib.scalar_arg("k", "int8")
        flag = ib.scalar_arg("flag", "bool")
        f64 = ib.scalar_arg("f64", "float64")
        with ib.for_range(4, name="i") as i:
            v = Cast("float32", x[i] * s16) + Cast("float32", k) + Cast("float32", f64)
            ib.store(y, [i], Select(flag, v, -v))
    m = jit(ib.get())
    x = np.array([1, 2, 3, 4], np.float16)
    y = np.zeros(4, np.float32)
    m["scale"](x, y, 0.5, -3, True, 0.25)
    np.testing.assert_array_equal(y, x.astype(np.float32) * 0.5 - 3 + 0.25)
    m["scale"](x, y, 0.5, -3, False, 0.25)
    np.testing.assert_array_equal(y, -(x.astype(np.float32) * 0.5 - 3 + 0.25))


# --------------------------------------------------------------------- intrinsics

# name -> (numpy reference, input generator)
_POS = lambda n: RNG.uniform(0.1, 10, n)  # noqa: E731
_ANY = lambda n: RNG.uniform(-4, 4, n)  # noqa: E731
_UNIT = lambda n: RNG.uniform(-0.95, 0.95, n)  # noqa: E731
UNARY_INTRINSICS = {
    "exp": (np.exp, _ANY), "exp2": (np.exp2, _ANY), "expm1": (np.expm1, _ANY),
    "log": (np.log, _POS), "log2": (np.log2, _POS), "log1p": (np.log1p, _POS),
    "sqrt": (np.sqrt, _POS), "rsqrt": (lambda x: 1 / np.sqrt(x), _POS),
    "sin": (np.sin, _ANY), "cos": (np.cos, _ANY), "tan": (np.tan, _UNIT),
    "tanh": (np.tanh, _ANY), "sinh": (np.sinh, _ANY), "cosh": (np.cosh, _ANY),
    "asin": (np.arcsin, _UNIT), "acos": (np.arccos, _UNIT), "atan": (np.arctan, _ANY),
    "asinh": (np.arcsinh, _ANY), "acosh": (np.arccosh, lambda n: RNG.uniform(1, 10, n)),
    "atanh": (np.arctanh, _UNIT), "erf": (np.vectorize(math.erf), _ANY),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), _ANY), "abs": (np.abs, _ANY),
    "floor": (np.floor, _ANY), "ceil": (np.ceil, _ANY), "trunc": (np.trunc, _ANY),
    "round": (np.round, lambda n: RNG.integers(-20, 20, n) / 2),
}
BINARY_INTRINSICS = {
    "pow": (np.power, _POS, _ANY), "atan2": (np.arctan2, _ANY, _ANY), "fmod": (np.fmod, _ANY, _POS),
}


@pytest.mark.parametrize("d", ["float32", "float64", "float16"])
def test_math_intrinsics_match_numpy(d: str) -> None:
    n = 64
    ib = IRBuilder()
    for name in UNARY_INTRINSICS:
        elementwise(name, [d], d, lambda a, name=name: Intrin(name, (a,)), n, ib)
    for name in BINARY_INTRINSICS:
        elementwise(name, [d, d], d, lambda a, b, name=name: Intrin(name, (a, b)), n, ib)
    m = jit(ib.get())
    npd = np_dtype(d)
    rtol = {"float32": 2e-6, "float64": 1e-14, "float16": 1e-3}[d]
    for name, (ref, gen) in UNARY_INTRINSICS.items():
        x = gen(n).astype(npd)
        y = np.zeros(n, npd)
        m[name](x, y)
        want = ref(x.astype(np.float64)).astype(npd)
        np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=rtol, err_msg=f"{name} {d}")
    for name, (ref, gen_a, gen_b) in BINARY_INTRINSICS.items():
        a, b = gen_a(n).astype(npd), gen_b(n).astype(npd)
        y = np.zeros(n, npd)
        m[name](a, b, y)
        want = ref(a.astype(np.float64), b.astype(np.float64)).astype(npd)
        np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=rtol, err_msg=f"{name} {d}")


def test_round_is_half_to_even_and_classification() -> None:
    ib = IRBuilder()
    n = 8
    elementwise("rnd", ["float32"], "float32", lambda a: Intrin("round", (a,)), n, ib)
    elementwise("isnan", ["float64"], "bool", lambda a: Intrin("isnan", (a,)), n, ib)
    elementwise("isinf", ["float64"], "bool", lambda a: Intrin("isinf", (a,)), n, ib)
    elementwise("iabs", ["int32"], "int32", lambda a: Intrin("abs", (a,)), n, ib)
    elementwise("ifloor", ["int16"], "int16", lambda a: Intrin("floor", (a,)), n, ib)
    m = jit(ib.get())
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 1e9 + 0.5], np.float32)
    y = np.zeros(n, np.float32)
    m["rnd"](x, y)
    np.testing.assert_array_equal(y, np.round(x))
    f = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -np.nan, 1e308, -1e-308])
    b = np.zeros(n, bool)
    m["isnan"](f, b)
    np.testing.assert_array_equal(b, np.isnan(f))
    m["isinf"](f, b)
    np.testing.assert_array_equal(b, np.isinf(f))
    xi = np.array([0, -1, 1, -(2**31), 2**31 - 1, -7, 7, 3], np.int32)
    yi = np.zeros(n, np.int32)
    with np.errstate(over="ignore"):
        m["iabs"](xi, yi)
        np.testing.assert_array_equal(yi, np.abs(xi))
    xs = np.arange(-4, 4, dtype=np.int16)
    ys = np.zeros(n, np.int16)
    m["ifloor"](xs, ys)
    np.testing.assert_array_equal(ys, xs)


def test_constants_of_every_dtype() -> None:
    ib = IRBuilder()
    values = {"bool": True, "int8": -128, "uint8": 255, "int64": -(2**63), "uint64": 2**64 - 1,
              "uint32": 2**32 - 1, "float16": 0.1, "bfloat16": 0.1, "float32": 0.1,
              "float64": 0.1}
    for d, v in values.items():
        with ib.prim_func(f"c_{d}"):
            y = ib.arg("Y", (1,), d)
            ib.store(y, [0], const(v, d))
    m = jit(ib.get())
    for d, v in values.items():
        y = np.zeros(1, np_dtype(d))
        m[f"c_{d}"](y)
        np.testing.assert_array_equal(y, np.array([v]).astype(np_dtype(d)), err_msg=d)


def test_select_clamp_bounds_the_cast_and_gives_min_max_bytes() -> None:
    """requantize_value's select clamp (`v < lo ? lo : v`, one vmaxps per bound) is a
    min/max to float_range (the cast stays one conversion) and gives the bytes of the
    min/max clamp for every accumulator and multiplier, NaN and infinities included."""
    from kiln.codegen.llvm.float_range import float_range
    from kiln.ops.quant import requantize_value

    x, lo, hi = Var("x", "float32"), const(-3.0, "float32"), const(5.0, "float32")
    low = Select(Compare("lt", x, lo), lo, x)
    assert float_range(low) == (-3.0, math.inf)
    assert float_range(Select(Compare("gt", low, hi), hi, low)) == (-3.0, 5.0)
    assert float_range(Select(Compare("gt", x, lo), x, lo))[0] == -3.0  # max(x, lo) too
    assert float_range(Select(Compare("lt", x, lo), hi, x)) == (-math.inf, math.inf)

    acc = np.array([0, 1, -1, 127, -128, 1000, -1000, 2**31 - 1, -2**31, 77, -77, 5] * 4,
                   np.int32)
    mult = np.repeat(np.array([0.01, np.nan, np.inf, -np.inf], np.float32), 12)
    zp = Cast("uint8", const(131, "int32"))
    out = {}
    for selects in (False, True):
        ib = IRBuilder()
        elementwise("rq", ["int32", "float32"], "uint8", lambda a, m, s=selects: requantize_value(
            a, m, zp, 0, 255, "uint8", selects=s), len(acc), ib)
        out[selects] = np.zeros(len(acc), np.uint8)
        jit(ib.get())["rq"](acc, mult, out[selects])
    np.testing.assert_array_equal(out[True], out[False])
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(acc * mult)
        want = np.clip(np.rint(acc.astype(np.float32) * mult), -131, 124) + 131
    np.testing.assert_array_equal(out[True][finite], want[finite].astype(np.uint8))
