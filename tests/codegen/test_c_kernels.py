"""The C backend end to end: IR -> kernels.c + host.c -> cc -Werror -> .so -> numpy.

One module holds a function per feature, so the file compiles a single library.
Results are compared with numpy and, where it is the sharper reference, with the
IR interpreter (kiln.ir.evaluate), the executable meaning of the IR.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from c_helpers import CLibrary, build, have_cc

from kiln.ir import IRBuilder, IRModule, evaluate, verify
from kiln.ir.tensor import (
    CallExtern,
    Cast,
    Const,
    ExternDependency,
    Intrin,
    Reinterpret,
    Select,
    UnaryOp,
    binary,
    const,
    max_,
    min_,
    select,
)
from support.seeds import reseed

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

RNG = np.random.default_rng(1234)
N = 16
INT_OPS = ("add", "sub", "mul", "div", "mod", "floordiv", "floormod", "min", "max",
           "and", "or", "xor")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint32", "uint64")
FLOAT_INTRINSICS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
                    "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh",
                    "atanh", "erf", "sigmoid", "abs", "floor", "ceil", "round", "trunc")

# A C file linked into the library: an external function taking a buffer.
EXTRA_C = """
#include <stdint.h>
float test_sum3(float* p, int64_t offset) {
  return p[offset] + p[offset + 1] + p[offset + 2];
}
int32_t test_bump(int32_t* counter) {
  return ++counter[0];
}
"""


def elementwise(ib: IRBuilder) -> None:
    with ib.prim_func("elementwise"):
        x = ib.arg("X", (4, N), "float32")
        y = ib.arg("Y", (4, N), "float32")
        with (ib.for_range(4, name="i", kind="parallel") as i,
              ib.for_range(N, name="j", kind="vectorized") as j):
            ib.store(y, [i, j], Intrin("exp", (x[i, j],)) * 0.5 + 1.0)


def matmul(ib: IRBuilder) -> None:
    with ib.prim_func("matmul"):
        a = ib.arg("A", (4, 5), "float32")
        b = ib.arg("B", (5, 3), "float32")
        c = ib.arg("C", (4, 3), "float32")
        with (ib.for_range(4, name="i") as i, ib.for_range(3, name="j", kind="scalar") as j,
              ib.allocate("acc", (1,), "float32", "local") as acc):
            ib.store(acc, [0], 0.0)
            with ib.for_range(5, name="k", kind="unrolled") as k:
                ib.store(acc, [0], acc[0] + a[i, k] * b[k, j])
            ib.store(c, [i, j], acc[0])


def conv1d(ib: IRBuilder) -> None:
    """Zero padding two ways: Select over a clamped index, and IfThenElse."""
    with ib.prim_func("conv1d"):
        x = ib.arg("X", (10,), "float32")
        w = ib.arg("W", (3,), "float32")
        y = ib.arg("Y", (10,), "float32")
        z = ib.arg("Z", (10,), "float32")
        with ib.for_range(10, name="i") as i:
            ib.store(y, [i], 0.0)
            ib.store(z, [i], 0.0)
            with ib.for_range(3, name="k") as k, ib.let("p", i + k - 1) as p:
                inside = (p >= 0) & (p < 10)
                clamped = min_(max_(p, 0), 9)
                ib.store(y, [i], y[i] + select(inside, x[clamped], 0.0) * w[k])
                with ib.if_(inside):
                    ib.store(z, [i], z[i] + x[p] * w[k])
                with ib.else_():
                    ib.store(z, [i], z[i] + 0.0)


def int_ops(ib: IRBuilder, dtype: str) -> None:
    with ib.prim_func(f"int_ops_{dtype}"):
        a = ib.arg("A", (N,), dtype)
        b = ib.arg("B", (N,), dtype)
        y = ib.arg("Y", (len(INT_OPS), N), dtype)
        with ib.for_range(N, name="i") as i:
            for k, op in enumerate(INT_OPS):
                ib.store(y, [k, i], binary(op, a[i], b[i]))


def shifts(ib: IRBuilder, dtype: str) -> None:
    with ib.prim_func(f"shifts_{dtype}"):
        a = ib.arg("A", (N,), dtype)
        s = ib.arg("S", (N,), dtype)
        y = ib.arg("Y", (4, N), dtype)
        with ib.for_range(N, name="i") as i:
            ib.store(y, [0, i], a[i] << s[i])
            ib.store(y, [1, i], a[i] >> s[i])
            ib.store(y, [2, i], ~a[i])
            ib.store(y, [3, i], binary("pow", a[i], s[i]))


def casts(ib: IRBuilder) -> None:
    with ib.prim_func("casts"):
        f = ib.arg("F", (N,), "float32")
        d = ib.arg("D", (N,), "float64")
        i64 = ib.arg("I", (N,), "int64")
        to_i32 = ib.arg("ToI32", (N,), "int32")
        to_bool = ib.arg("ToBool", (N,), "bool")
        to_f16 = ib.arg("ToF16", (N,), "float16")
        to_bf16 = ib.arg("ToBF16", (N,), "bfloat16")
        to_i8 = ib.arg("ToI8", (N,), "int8")
        to_u32 = ib.arg("ToU32", (N,), "uint32")
        to_f32 = ib.arg("ToF32", (N,), "float32")
        with ib.for_range(N, name="i") as i:
            ib.store(to_i32, [i], Cast("int32", f[i]))
            ib.store(to_bool, [i], Cast("bool", f[i]))
            ib.store(to_f16, [i], Cast("float16", d[i]))
            ib.store(to_bf16, [i], Cast("bfloat16", f[i]))
            ib.store(to_i8, [i], Cast("int8", i64[i]))
            ib.store(to_u32, [i], Cast("uint32", i64[i]))
            # plus +0.0 through both bit casts (the float's bits with every bit cleared)
            no_bits = Reinterpret("int32", f[i]) & Const(0, "int32")
            ib.store(to_f32, [i], Cast("float32", Cast("bool", i64[i]))
                     + Cast("float32", i64[i]) + Reinterpret("float32", no_bits))


def intrinsics(ib: IRBuilder, dtype: str) -> None:
    with ib.prim_func(f"intrinsics_{dtype}"):
        x = ib.arg("X", (N,), dtype)
        y = ib.arg("Y", (len(FLOAT_INTRINSICS) + 4, N), dtype)
        flags = ib.arg("Flags", (2, N), "bool")
        with ib.for_range(N, name="i") as i:
            for k, name in enumerate(FLOAT_INTRINSICS):
                ib.store(y, [k, i], Intrin(name, (x[i],)))
            k = len(FLOAT_INTRINSICS)
            ib.store(y, [k, i], Intrin("acosh", (x[i] + 1.0,)))
            ib.store(y, [k + 1, i], Intrin("pow", (x[i], x[i] + 0.5)))
            ib.store(y, [k + 2, i], Intrin("atan2", (x[i], x[i] - 0.5)))
            ib.store(y, [k + 3, i], Intrin("fmod", (x[i] * 7.0, x[i] + 0.25)))
            ib.store(flags, [0, i], Intrin("isnan", (x[i] / x[i],)))
            ib.store(flags, [1, i], Intrin("isinf", (x[i] / (x[i] - x[i]),)))


def float_ops(ib: IRBuilder) -> None:
    with ib.prim_func("float_ops"):
        a = ib.arg("A", (N,), "float32")
        b = ib.arg("B", (N,), "float32")
        y = ib.arg("Y", (7, N), "float32")
        with ib.for_range(N, name="i") as i:
            for k, op in enumerate(("div", "mod", "floordiv", "floormod", "min", "max", "pow")):
                ib.store(y, [k, i], binary(op, a[i], b[i]))


def logic(ib: IRBuilder) -> None:
    with ib.prim_func("logic"):
        a = ib.arg("A", (N,), "int32")
        b = ib.arg("B", (N,), "int32")
        y = ib.arg("Y", (N,), "int32")
        z = ib.arg("Z", (N,), "bool")
        with ib.for_range(N, name="i") as i:
            cond = (a[i] > 0) & UnaryOp("not", b[i] < 0)
            ib.store(y, [i], Select(cond, -a[i], b[i]))
            ib.store(z, [i], (a[i].eq(b[i]) | (a[i] > b[i])) ^ (b[i] >= 3))


def externs(ib: IRBuilder) -> None:
    libm = ExternDependency("libm", libs=("-lm",))
    with ib.prim_func("externs"):
        x = ib.arg("X", (N,), "float32")
        y = ib.arg("Y", (N - 2,), "float32")
        with ib.for_range(N - 2, name="i") as i:
            two = const(2.0, "float32")
            value = (CallExtern("expf", (x[i],), "float32", libm)
                     + CallExtern("hypotf", (x[i], two), "float32", libm)
                     + CallExtern("test_sum3", (x, i), "float32"))
            ib.store(y, [i], value)


def side_effects(ib: IRBuilder) -> None:
    """Evaluate and an unused let keep their external calls; pure ones print nothing."""
    with ib.prim_func("side_effects"):
        counter = ib.arg("Counter", (1,), "int32")
        bump = CallExtern("test_bump", (counter,), "int32")
        ib.evaluate(bump)
        ib.evaluate(const(1, "int32") + 2)
        with ib.let("unused", bump):
            ib.evaluate(bump)


def while_loop(ib: IRBuilder) -> None:
    """A While whose condition reads a buffer the body updates (a graph Loop's shape)."""
    with ib.prim_func("while_loop"):
        x = ib.arg("X", (1,), "int64")
        y = ib.arg("Y", (1,), "int64")
        ib.store(y, [0], const(0, "int64"))
        with ib.allocate("n", (1,), "int64", "local") as n:
            ib.store(n, [0], x[0])
            with ib.while_(n[0] > 0):
                ib.store(y, [0], y[0] + n[0])
                ib.store(n, [0], n[0] - 1)


def calls(ib: IRBuilder) -> None:
    with ib.prim_func("callee"):
        x = ib.arg("X", (N,), "float32")
        y = ib.arg("Y", (N,), "float32")
        s = ib.scalar_arg("scale", "float32")
        with ib.allocate("tmp", (N,), "float32", "global") as tmp:
            with ib.for_range(N, name="i") as i:
                ib.store(tmp, [i], x[i] * s)
            with ib.for_range(N, name="i") as i:
                ib.store(y, [i], tmp[i] + 1.0)
    with ib.prim_func("caller"):
        x = ib.arg("X", (N,), "float32")
        y = ib.arg("Y", (N,), "float32")
        ib.call_func("callee", [x, y, const(3.0, "float32")])
        with ib.for_range(N, name="i") as i:
            ib.store(y, [i], y[i] * 2.0)


WEIGHTS = RNG.standard_normal(N).astype(np.float32)
BIAS = RNG.integers(-5, 5, N).astype(np.int32)


def weights(ib: IRBuilder) -> None:
    with ib.prim_func("weights"):
        x = ib.arg("X", (N,), "float32")
        y = ib.arg("Y", (N,), "float32")
        with (ib.alloc_const("W", WEIGHTS) as w, ib.alloc_const("bias", BIAS) as bias,
              ib.for_range(N, name="i") as i):
            ib.store(y, [i], x[i] * w[i] + Cast("float32", bias[i]))


def arena(ib: IRBuilder) -> None:
    """Memory-planned style: two float views into one heap arena, one into a param."""
    with ib.prim_func("arena"):
        x = ib.arg("X", (4,), "float32")
        y = ib.arg("Y", (4,), "float32")
        scratch = ib.arg("Scratch", (32,), "uint8")
        with (ib.allocate("pool", (64,), "uint8", "global") as pool,
              ib.decl_buffer("t0", (4,), "float32", pool, 0) as t0,
              ib.decl_buffer("t1", (4,), "float32", pool, 16) as t1,
              ib.decl_buffer("t2", (4,), "int32", scratch, 16) as t2):
            with ib.for_range(4, name="i") as i:
                ib.store(t0, [i], x[i] * 2.0)
            with ib.for_range(4, name="i") as i:
                ib.store(t1, [i], t0[i] + 1.0)
                ib.store(t2, [i], Cast("int32", t1[i]))
            with ib.for_range(4, name="i") as i:
                ib.store(y, [i], t1[i] + Cast("float32", t2[i]))


def half(ib: IRBuilder, dtype: str) -> None:
    with ib.prim_func(f"half_{dtype}"):
        x = ib.arg("X", (N,), dtype)
        y = ib.arg("Y", (N,), dtype)
        z = ib.arg("Z", (N,), "float32")
        with ib.for_range(N, name="i") as i:
            ib.store(y, [i], x[i] * const(2.0, dtype) + const(0.1, dtype))
            ib.store(z, [i], Cast("float32", Intrin("sqrt", (Intrin("abs", (x[i],)),))))


def scalars(ib: IRBuilder) -> None:
    with ib.prim_func("scalars"):
        x = ib.arg("X", (N,), "float32")
        y = ib.arg("Y", (N,), "float32")
        s = ib.scalar_arg("s", "float32")
        k = ib.scalar_arg("k", "int8")
        flag = ib.scalar_arg("flag", "bool")
        h = ib.scalar_arg("h", "float16")
        ib.scalar_arg("unused", "int64")
        with ib.for_range(N, name="i") as i:
            ib.store(y, [i], x[i] * s + Cast("float32", k)
                     + select(flag, Cast("float32", h), const(0.0, "float32")))


def oom(ib: IRBuilder) -> None:
    with ib.prim_func("oom"):
        y = ib.arg("Y", (1,), "float32")
        with ib.allocate("huge", (1 << 60,), "float32", "global") as huge:
            ib.store(huge, [0], 1.0)
            ib.store(y, [0], huge[0])
    with ib.prim_func("oom_caller"):
        y = ib.arg("Y", (1,), "float32")
        ib.call_func("oom", [y])


BUILDERS: list[Callable[[IRBuilder], None]] = [
    elementwise, matmul, conv1d, casts, float_ops, logic, externs, side_effects, while_loop,
    calls, weights,
    arena,
    scalars, oom,
    *(lambda ib, d=d: int_ops(ib, d) for d in INT_DTYPES),  # type: ignore[misc]
    *(lambda ib, d=d: shifts(ib, d) for d in ("int8", "int32", "uint16", "int64")),
    *(lambda ib, d=d: intrinsics(ib, d) for d in ("float32", "float64")),
    *(lambda ib, d=d: half(ib, d) for d in ("float16", "bfloat16")),
]


@pytest.fixture(scope="module")
def mod() -> IRModule:
    ib = IRBuilder()
    for make in BUILDERS:
        make(ib)
    module = ib.get()
    verify(module)
    return module


@pytest.fixture(scope="module")
def lib(mod: IRModule, tmp_path_factory: pytest.TempPathFactory) -> CLibrary:
    return build(mod, Path(tmp_path_factory.mktemp("c_kernels")), extra_c=EXTRA_C)


@pytest.fixture(autouse=True)
def _per_test_rng(request: pytest.FixtureRequest) -> None:
    reseed(request)  # RNG per test, from its node id (support.seeds)


def run_both(lib: CLibrary, mod: IRModule, name: str, *args: Any) -> tuple[list[Any], list[Any]]:
    """Run `name` compiled and interpreted on copies of `args`; return both arg lists."""
    compiled = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    interpreted = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    lib.run(name, *compiled)
    evaluate(mod, name, *interpreted)
    return compiled, interpreted


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


# ------------------------------------------------------------------ loops and memory


def test_elementwise(lib: CLibrary) -> None:
    x = f32(4, N)
    y = np.zeros((4, N), np.float32)
    lib.run("elementwise", x, y)
    np.testing.assert_allclose(y, np.exp(x) * np.float32(0.5) + 1, rtol=2e-7)


def test_while_loop(lib: CLibrary, mod: IRModule) -> None:
    for start in (0, 1, 9):
        compiled, interpreted = run_both(lib, mod, "while_loop", np.array([start], np.int64),
                                         np.zeros(1, np.int64))
        assert compiled[1][0] == interpreted[1][0] == start * (start + 1) // 2


def test_matmul_with_local_accumulator(lib: CLibrary) -> None:
    a, b = f32(4, 5), f32(5, 3)
    c = np.zeros((4, 3), np.float32)
    lib.run("matmul", a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-6)
    assert "KILN_UNROLL(5)" in lib.source()
    assert "KILN_NO_VECTORIZE" in lib.source()  # the j loop, kind "scalar"


def test_conv1d_select_and_if(lib: CLibrary, mod: IRModule) -> None:
    x, w = f32(10), f32(3)
    (_, _, y, z), (_, _, ry, rz) = run_both(lib, mod, "conv1d", x, w, np.zeros(10, np.float32),
                                             np.zeros(10, np.float32))
    padded = np.concatenate([[0], x, [0]]).astype(np.float32)
    expected = np.array([padded[i:i + 3] @ w for i in range(10)], np.float32)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(z, rz)
    np.testing.assert_array_equal(y, z)


def test_calls_and_heap_workspace(lib: CLibrary) -> None:
    x = f32(N)
    y = np.zeros(N, np.float32)
    lib.run("caller", x, y)
    np.testing.assert_array_equal(y, (x * np.float32(3) + 1) * 2)


def test_constants(lib: CLibrary) -> None:
    x = f32(N)
    y = np.zeros(N, np.float32)
    lib.run("weights", x, y)
    np.testing.assert_array_equal(y, x * WEIGHTS + BIAS.astype(np.float32))
    assert "kiln__const_table[" in lib.source()  # each constant's address, by slot


def test_decl_buffer_views(lib: CLibrary) -> None:
    x = f32(4)
    y = np.zeros(4, np.float32)
    scratch = np.zeros(32, np.uint8)
    lib.run("arena", x, y, scratch)
    t1 = x * 2 + 1
    np.testing.assert_array_equal(y, t1 + t1.astype(np.int32).astype(np.float32))
    np.testing.assert_array_equal(scratch[16:].view(np.int32), t1.astype(np.int32))


def test_out_of_memory_is_status_1_with_message(lib: CLibrary) -> None:
    y = np.zeros(1, np.float32)
    for name in ("oom", "oom_caller"):
        assert lib.call(name, y) == 1
        assert lib.last_error() == (
            f"{name}: out of memory allocating a workspace of {4 << 60} bytes")


# ------------------------------------------------------------------ arithmetic


def int_inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
    # extremes and signs on both sides; no zero divisors (undefined in C and the IR)
    a[:4] = [info.min, info.max, info.min, 7]
    b[:4] = [info.max, info.min, 3, 1 if info.min == 0 else -3]
    b[b == 0] = 5
    if info.min < 0:
        b[(a == info.min) & (b == -1)] = 2  # INT_MIN / -1 traps in C
    return a, b


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_ops_match_interpreter_and_numpy(lib: CLibrary, mod: IRModule,
                                                 dtype: str) -> None:
    a, b = int_inputs(dtype)
    y = np.zeros((len(INT_OPS), N), dtype)
    (_, _, got), (_, _, want) = run_both(lib, mod, f"int_ops_{dtype}", a, b, y)
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore"):
        wide_a, wide_b = a.astype(object), b.astype(object)
        trunc_div = [int(x / y) if abs(x) < 2**52 else _tdiv(x, y) for x, y in zip(wide_a, wide_b)]
        expected = {
            "add": a + b, "sub": a - b, "mul": a * b,
            "div": np.array(trunc_div, object).astype(np.int64).astype(dtype),
            "floordiv": np.floor_divide(a, b), "floormod": np.mod(a, b),
            "min": np.minimum(a, b), "max": np.maximum(a, b),
            "and": a & b, "or": a | b, "xor": a ^ b,
        }
    for k, op in enumerate(INT_OPS):
        if op in expected:
            np.testing.assert_array_equal(got[k], expected[op], err_msg=f"{dtype} {op}")
    np.testing.assert_array_equal(got[INT_OPS.index("mod")], np.fmod(a, b))


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def test_floordiv_floormod_negative_operands(lib: CLibrary) -> None:
    a = np.array([-7, 7, -7, 7, -1, 0, -8, 8] * 2, np.int32)
    b = np.array([2, -2, -2, 2, 3, -3, 3, -3] * 2, np.int32)
    y = np.zeros((len(INT_OPS), N), np.int32)
    lib.run("int_ops_int32", a, b, y)
    np.testing.assert_array_equal(y[INT_OPS.index("floordiv")], a // b)
    np.testing.assert_array_equal(y[INT_OPS.index("floormod")], a % b)
    np.testing.assert_array_equal(y[INT_OPS.index("div")], np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(y[INT_OPS.index("mod")], np.fmod(a, b))


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint16", "int64"])
def test_shifts_not_and_pow(lib: CLibrary, mod: IRModule, dtype: str) -> None:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
    s = RNG.integers(0, np.dtype(dtype).itemsize * 8, N).astype(dtype)
    y = np.zeros((4, N), dtype)
    (_, _, got), (_, _, want) = run_both(lib, mod, f"shifts_{dtype}", a, s, y)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], np.left_shift(a, s))
    np.testing.assert_array_equal(got[1], np.right_shift(a, s))
    np.testing.assert_array_equal(got[2], ~a)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[3], np.power(a, s))


def test_float_ops(lib: CLibrary, mod: IRModule) -> None:
    a, b = f32(N, lo=-5, hi=5), f32(N, lo=0.5, hi=3)
    b[::2] *= -1
    b[0] = a[0]  # a tie for min/max
    (_, _, got), (_, _, want) = run_both(lib, mod, "float_ops", a, b, np.zeros((7, N),
                                                                                np.float32))
    np.testing.assert_array_equal(got[:6], want[:6])
    np.testing.assert_allclose(got[6], want[6], rtol=1e-6)
    np.testing.assert_array_equal(got[2], np.floor(a / b))
    np.testing.assert_array_equal(got[1], np.fmod(a, b))
    np.testing.assert_array_equal(got[4], np.minimum(a, b))


def test_logic_select_not_neg(lib: CLibrary, mod: IRModule) -> None:
    a = RNG.integers(-5, 5, N).astype(np.int32)
    b = RNG.integers(-5, 5, N).astype(np.int32)
    (_, _, y, z), (_, _, ry, rz) = run_both(lib, mod, "logic", a, b, np.zeros(N, np.int32),
                                             np.zeros(N, np.bool_))
    np.testing.assert_array_equal(y, np.where((a > 0) & ~(b < 0), -a, b))
    np.testing.assert_array_equal(z, ((a == b) | (a > b)) ^ (b >= 3))
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(z, rz)


def test_casts(lib: CLibrary, mod: IRModule) -> None:
    f = f32(N, lo=-300, hi=300)
    f[:3] = [0.0, -0.0, 2.5]
    d = RNG.uniform(-70000, 70000, N)
    d[:4] = [65519.99, 65520.0, 1e-8, 2.0**-24 * 1.5]  # overflow edge, subnormal, tie
    i64 = RNG.integers(-(2**40), 2**40, N)
    outs = [np.zeros(N, t) for t in ("int32", "bool", "float16", ml_dtypes.bfloat16, "int8",
                                     "uint32", "float32")]
    got, want = run_both(lib, mod, "casts", f, d, i64, *outs)
    for g, w in zip(got[3:], want[3:]):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
    np.testing.assert_array_equal(got[3], np.trunc(f).astype(np.int32))
    np.testing.assert_array_equal(got[4], f != 0)
    with np.errstate(over="ignore"):
        want_f16 = d.astype(np.float16)
    np.testing.assert_array_equal(got[5].view(np.uint16), want_f16.view(np.uint16))
    np.testing.assert_array_equal(got[6], f.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(got[7], i64.astype(np.int8))
    np.testing.assert_array_equal(got[8], i64.astype(np.uint32))
    np.testing.assert_array_equal(got[9], (i64 != 0) + i64.astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_intrinsics(lib: CLibrary, mod: IRModule, dtype: str) -> None:
    x = RNG.uniform(0.05, 0.95, N).astype(dtype)
    x[::3] *= -1
    x[0] = 0.0
    x[1:4] = [0.5, 1.5, -2.5]  # round: half to even
    y = np.zeros((len(FLOAT_INTRINSICS) + 4, N), dtype)
    flags = np.zeros((2, N), np.bool_)
    (_, got, got_flags), (_, want, want_flags) = run_both(
        lib, mod, f"intrinsics_{dtype}", x, y, flags)
    # libm's float functions may differ from the interpreter's by an ulp or so.
    rtol = 4e-7 if dtype == "float32" else 1e-15
    for k, name in enumerate(FLOAT_INTRINSICS):
        finite = np.isfinite(want[k])
        np.testing.assert_allclose(got[k][finite], want[k][finite], rtol=rtol, atol=1e-30,
                                   err_msg=name)
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(want[k]), err_msg=name)
    k = len(FLOAT_INTRINSICS)
    np.testing.assert_allclose(got[k:], want[k:], rtol=rtol, atol=1e-30)
    round_row = got[FLOAT_INTRINSICS.index("round")]
    np.testing.assert_array_equal(round_row[1:4], [0.0, 2.0, -2.0])
    np.testing.assert_array_equal(round_row, np.rint(x))
    np.testing.assert_array_equal(got_flags, want_flags)
    np.testing.assert_array_equal(got_flags[0], x == 0)  # 0/0 is NaN
    np.testing.assert_array_equal(got_flags[1], x != 0)  # x/0 is inf


def test_externs_libm_and_buffer_argument(lib: CLibrary) -> None:
    x = f32(N)
    y = np.zeros(N - 2, np.float32)
    lib.run("externs", x, y)
    sums = np.array([x[i] + x[i + 1] + x[i + 2] for i in range(N - 2)], np.float32)
    terms = [np.exp(x[:-2]), np.hypot(x[:-2], np.float32(2)), sums]
    # The sum may cancel: its error is bounded by the terms' magnitudes, not its own.
    magnitude = np.abs(terms[0]) + np.abs(terms[1]) + np.abs(sums)
    np.testing.assert_array_less(np.abs(y - sum(terms)), 1e-6 * magnitude)
    assert "extern float test_sum3(float*, int64_t);" in lib.source()
    assert "extern float expf" not in lib.source()  # <math.h> declares it


def test_evaluate_and_unused_let_keep_side_effects(lib: CLibrary) -> None:
    counter = np.array([10], np.int32)
    lib.run("side_effects", counter)
    assert counter[0] == 13
    source = lib.source()
    body = source[source.index("kiln__kernel_side_effects(int32_t* restrict Counter) {"):]
    assert "(void)test_bump(Counter);" in body and "unused" not in body.split("}")[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_floats(lib: CLibrary, mod: IRModule, dtype: str) -> None:
    np_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = f32(N, lo=-100, hi=100).astype(np_type)
    x[:3] = np.array([0.0, -1.5, 60000.0 if dtype == "float16" else 1e38], np.float32)
    y = np.zeros(N, np_type)
    z = np.zeros(N, np.float32)
    (_, got_y, got_z), (_, want_y, want_z) = run_both(lib, mod, f"half_{dtype}", x, y, z)
    np.testing.assert_array_equal(got_y.view(np.uint16), want_y.view(np.uint16))
    np.testing.assert_array_equal(got_z, want_z)
    x32 = x.astype(np.float32)
    with np.errstate(over="ignore"):
        expected = (x32 * np.float32(2) + np.float32(np_type(0.1))).astype(np_type)
    np.testing.assert_array_equal(got_y.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(got_z, np.sqrt(np.abs(x32)))


def test_scalar_parameters(lib: CLibrary) -> None:
    x = f32(N)
    y = np.zeros(N, np.float32)
    lib.run("scalars", x, y, 1.5, -3, True, 0.1, 99)
    expected = x * np.float32(1.5) + np.float32(-3) + np.float32(np.float16(0.1))
    np.testing.assert_array_equal(y, expected)
    lib.run("scalars", x, y, 2, 127, False, 7.0, 0)  # an int for a float parameter
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(127))


def test_kernels_are_hidden_and_entries_exported(lib: CLibrary, mod: IRModule) -> None:
    for name in mod.prim_funcs():
        assert lib.has_symbol(f"kiln_{name}")
        assert not lib.has_symbol(f"kiln__kernel_{name}")
    assert not lib.has_symbol("kiln__consts")


def test_every_statement_and_expression_kind_is_covered(mod: IRModule) -> None:
    """The module above really exercises every IR node type the backend prints."""
    from kiln.codegen.c.expr import _EMITTERS
    from kiln.codegen.c.kernel import _STATEMENTS
    from kiln.ir.visitor import iter_nodes

    seen = {type(n) for fn in mod.prim_funcs().values() for n in iter_nodes(fn.body)}
    missing = (set(_EMITTERS) | set(_STATEMENTS)) - seen
    assert not missing, missing

