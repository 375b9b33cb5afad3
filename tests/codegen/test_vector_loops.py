"""Lane loops decided by the vectorize-loops pass and emitted as vector code by both
backends (kiln.codegen.llvm.vector_loops, kiln.codegen.c.vector).

Each kernel runs through the pass, then the llvmjit path, and is compared with kiln's
reference interpreter (scalar, in loop order); the LLVM IR is checked for the vector form
or for the scalar fallback the pass must choose. The C backend builds every kernel of
the file into one library (`cc -Werror`) and must agree with the interpreter too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from c_helpers import CLibrary, build_many, compile_c, have_cc
from llvm_helpers import PREFIX, jit

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.lower_to_llvm import LoweringOptions, lower_module
from kiln.ir import IRBuilder, IRModule
from kiln.ir.evaluate import evaluate
from kiln.ir.tensor import BinaryOp, Cast, Const, Intrin, UnaryOp, intrin, select
from kiln.ir.visitor import iter_stmts
from kiln.kernels.math import exp_f32
from kiln.transform.vectorize_loops import VectorizeLoops

RNG = np.random.default_rng(7)


def _decided(mod: IRModule) -> IRModule:
    return VectorizeLoops(vector_bits=256)(mod)


def _lowered(mod: IRModule) -> str:
    """The LLVM IR kiln emits for `mod` after the pass, before LLVM optimises it."""
    mod = _decided(mod)
    pool = ConstantPool.from_module(mod)
    return str(lower_module(mod, pool, LoweringOptions(prefix=PREFIX)).module)


def _run(mod: IRModule, name: str, *arrays: np.ndarray) -> tuple[list[np.ndarray], str]:
    """Run `name` compiled and interpreted on copies of `arrays`; both results must agree.
    Returns the compiled results and the LLVM IR kiln emitted."""
    m = jit(_decided(mod))
    got = [a.copy() for a in arrays]
    m[name](*got)
    want = [a.copy() for a in arrays]
    evaluate(mod, name, *want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return got, _lowered(mod)


def _tile(lanes: int, rows: int = 3) -> IRModule:
    """acc[r, v] += x[r] * w[k, v] over k, like one register tile of a convolution."""
    k_n = 5
    ib = IRBuilder()
    with ib.prim_func("tile"):
        x = ib.arg("X", (k_n, rows), "float32")
        w = ib.arg("W", (k_n, lanes), "float32")
        y = ib.arg("Y", (rows, lanes), "float32")
        with ib.allocate("acc", (rows, lanes), "float32", "local") as acc:
            with ib.for_range(lanes, name="v", kind="vectorized") as v:
                for r in range(rows):
                    ib.store(acc, [r, v], 0.0)
            with ib.for_range(k_n, name="k") as k, \
                    ib.for_range(lanes, name="v", kind="vectorized") as v, \
                    ib.let("wv", w[k, v]) as wv:
                for r in range(rows):
                    ib.store(acc, [r, v], Intrin("fma", (x[k, r], wv, acc[r, v])))
            with ib.for_range(rows, name="r") as r, \
                    ib.for_range(lanes, name="v", kind="vectorized") as v:
                ib.store(y, [r, v], BinaryOp("max", acc[r, v], UnaryOp("neg", acc[r, v])))
    return ib.get()


@pytest.mark.parametrize(("lanes", "pieces"), [(8, [8]), (7, [7]), (16, [16]), (2, [2]),
                                               (48, [32, 16]), (13, [8, 5])])
def test_register_tile_becomes_vector_code(lanes: int, pieces: list[int]) -> None:
    """More lanes than a register (8 at 256 bits) that are not a power of two run as
    power-of-two pieces and a rest under a register (48: 32 + 16; 13: 8 + 5): LLVM keeps
    a `<48 x float>` tile in memory, padded to 64 lanes."""
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    w = RNG.standard_normal((5, lanes)).astype(np.float32)
    y = np.zeros((3, lanes), np.float32)
    (_, _, got), text = _run(_tile(lanes), "tile", x, w, y)
    assert sorted(set(map(int, re.findall(r"<(\d+) x float>", text)))) == sorted(set(pieces))
    want = np.abs(np.einsum("kr,kv->rv", x.astype(np.float64), w.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _min_max() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("mm"):
        a = ib.arg("A", (8,), "float32")
        b = ib.arg("B", (8,), "float32")
        lo = ib.arg("LO", (8,), "float32")
        hi = ib.arg("HI", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(lo, [v], BinaryOp("min", a[v], b[v]))
            ib.store(hi, [v], BinaryOp("max", a[v], b[v] * 2.0 - 1.0))
    return ib.get()


NAN_A = np.array([1, np.nan, 3, -4, np.inf, 0, -0.0, 5], np.float32)
NAN_B = np.array([2, 1, np.nan, -5, 1, -0.0, 0, np.nan], np.float32)


def test_min_max_keep_nan_semantics_in_vector_form() -> None:
    a, b = NAN_A, NAN_B
    (_, _, lo, hi), text = _run(_min_max(), "mm", a, b, np.zeros(8, np.float32),
                                np.zeros(8, np.float32))
    assert "<8 x float>" in text
    np.testing.assert_array_equal(lo, np.minimum(a, b))
    np.testing.assert_array_equal(hi, np.maximum(a, b * 2 - 1))


def _scalar_loop(text: str) -> bool:
    return "llvm.loop.vectorize.enable" in text and " x float>" not in text


def test_strided_access_falls_back_to_a_scalar_loop() -> None:
    ib = IRBuilder()
    with ib.prim_func("strided"):
        x = ib.arg("X", (16,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v], x[v * 2] + 1.0)
    x = RNG.standard_normal(16).astype(np.float32)
    (_, got), text = _run(ib.get(), "strided", x, np.zeros(8, np.float32))
    assert _scalar_loop(text)
    np.testing.assert_array_equal(got, x[::2] + 1)


def test_a_wrong_independence_promise_does_not_change_the_result() -> None:
    """y[v + 1] = y[v] * 2 carries a value from one iteration to the next: as vector code
    it would read the old values; the check keeps the scalar loop."""
    ib = IRBuilder()
    with ib.prim_func("carried"):
        y = ib.arg("Y", (9,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v + 1], y[v] * 2.0)
    (got,), text = _run(ib.get(), "carried", np.ones(9, np.float32))
    assert _scalar_loop(text)
    np.testing.assert_array_equal(got, 2.0 ** np.arange(9, dtype=np.float32))


def test_parameters_that_may_alias_keep_the_scalar_loop() -> None:
    """`shift` is called with two overlapping views of one buffer, so its parameters get
    no noalias: Y[v] = X[v] + 1 then carries values between iterations and must stay a
    scalar loop (B[v + 1] = B[v] + 1 counts up)."""
    ib = IRBuilder()
    with ib.prim_func("shift"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v], x[v] + 1.0)
    with ib.prim_func("outer"):
        b = ib.arg("B", (9,), "float32")
        with ib.decl_buffer("lo", (8,), "float32", b, 0) as lo, \
                ib.decl_buffer("hi", (8,), "float32", b, 4) as hi:
            ib.call_func("shift", [lo, hi])
    (got,), text = _run(ib.get(), "outer", np.zeros(9, np.float32))
    assert _scalar_loop(text)
    np.testing.assert_array_equal(got, np.arange(9, dtype=np.float32))


def test_a_view_of_a_written_buffer_keeps_the_scalar_loop() -> None:
    """tmp[v + 1] = head[v] + 1 where head views tmp: a value carried between iterations
    through two names of one memory."""
    ib = IRBuilder()
    with ib.prim_func("viewed"):
        y = ib.arg("Y", (9,), "float32")
        with ib.allocate("tmp", (9,), "float32", "global") as tmp, \
                ib.decl_buffer("head", (8,), "float32", tmp, 0) as head:
            with ib.for_range(9, name="i") as i:
                ib.store(tmp, [i], 0.0)
            with ib.for_range(8, name="v", kind="vectorized") as v:
                ib.store(tmp, [v + 1], head[v] + 1.0)
            with ib.for_range(9, name="j") as j:
                ib.store(y, [j], tmp[j])
    (got,), text = _run(ib.get(), "viewed", np.zeros(9, np.float32))
    assert _scalar_loop(text)
    np.testing.assert_array_equal(got, np.arange(9, dtype=np.float32))


def test_other_operations_keep_the_scalar_loop() -> None:
    ib = IRBuilder()
    with ib.prim_func("exp"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v], Intrin("exp", (x[v],)))
    x = RNG.standard_normal(8).astype(np.float32)
    m = jit(_decided(ib.get()))
    y = np.zeros(8, np.float32)
    m["exp"](x, y)
    assert _scalar_loop(_lowered(ib.get()))
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)


def _exp_lanes() -> IRModule:
    """y[v] = exp(x[v]) in kiln.kernels.math's form (selects on comparisons, an
    int32-to-float32 cast, bit casts, int32 shifts, min/max and adds), without fma: the
    interpreter's float32 arithmetic is then the compiled code's, bit for bit. And
    `rounding`: floor of |x|, 0 where x is NaN (rounding intrinsics, isnan: vector code
    on llvm; the C printer keeps that loop scalar)."""
    ib = IRBuilder()
    with ib.prim_func("exp"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v], exp_f32(x[v]))
    with ib.prim_func("rounding"):
        x = ib.arg("X", (8,), "float32")
        z = ib.arg("Z", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(z, [v], select(intrin("isnan", x[v]), 0.0,
                                    intrin("floor", intrin("abs", x[v]))))
    return ib.get()


EXP_X = np.array([0.5, -1.0, 88.7, -100.0, np.nan, np.inf, -np.inf, 20.0], np.float32)


def test_select_cast_and_bit_casts_become_vector_code() -> None:
    (_, floors), _ = _run(_exp_lanes(), "rounding", EXP_X, np.zeros(8, np.float32))
    np.testing.assert_array_equal(floors, np.nan_to_num(np.floor(np.abs(EXP_X)), nan=0.0,
                                                        posinf=np.inf))
    (_, got), text = _run(_exp_lanes(), "exp", EXP_X, np.zeros(8, np.float32))
    assert "llvm.floor.v8f32" in text and "llvm.fabs.v8f32" in text
    assert "<8 x float>" in text and "shl <8 x i32>" in text and "bitcast <8 x" in text
    assert "sitofp <8 x i32>" in text and re.search(r"select\s+<8 x i1>", text)
    assert not _scalar_loop(text)
    with np.errstate(over="ignore"):
        want = np.exp(EXP_X.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=2.0 ** -149)  # a subnormal ulp


def _narrow() -> IRModule:
    """y[v] = uint8(x[v] + 3), z[v] = int8(x[v] * 2): int32 lanes stored as bytes (the
    quantized kernels' requantized outputs), each truncated as the scalar cast is."""
    ib = IRBuilder()
    with ib.prim_func("narrow"):
        x = ib.arg("X", (16,), "int32")
        y = ib.arg("Y", (16,), "uint8")
        z = ib.arg("Z", (16,), "int8")
        with ib.for_range(16, name="v", kind="vectorized") as v:
            ib.store(y, [v], Cast("uint8", x[v] + 3))
            ib.store(z, [v], Cast("int8", x[v] * 2))
    return ib.get()


NARROW_X = np.array([0, 1, -1, 127, 128, 252, 253, 300, -128, -129, 2 ** 20 + 5,
                     -2 ** 20 - 1, 65535, 7, -300, 1000], np.int32)


def _narrow_args() -> list[np.ndarray]:
    return [NARROW_X, np.zeros(16, np.uint8), np.zeros(16, np.int8)]


def test_narrowing_stores_become_vector_code() -> None:
    (_, y, z), text = _run(_narrow(), "narrow", *_narrow_args())
    assert "trunc <16 x i32>" in text and "store <16 x i8>" in text
    assert not _scalar_loop(text)
    np.testing.assert_array_equal(y, (NARROW_X.astype(np.int64) + 3) % 256)
    np.testing.assert_array_equal(z, ((NARROW_X.astype(np.int64) * 2 + 128) % 256) - 128)


def _bytes() -> IRModule:
    """Byte and word lanes (the integer max pools' rows): y = max(a, min(b, 200)) over
    uint8, z = a select on an int8 comparison, w = max of int16 rows; 54 lanes are
    pieces of 32, 16, 4 and 2 (`register_pieces`' `split_rest`)."""
    ib = IRBuilder()
    for name, dtype, n in (("bytes", "uint8", 54), ("signed", "int8", 54),
                           ("words", "int16", 54)):
        with ib.prim_func(name):
            a = ib.arg("A", (n,), dtype)
            b = ib.arg("B", (n,), dtype)
            y = ib.arg("Y", (n,), dtype)
            with ib.for_range(n, name="v", kind="vectorized") as v:
                if dtype == "int8":
                    value = select(a[v] > b[v], a[v], BinaryOp("max", b[v], Const(-100, dtype)))
                else:
                    value = BinaryOp("max", a[v], BinaryOp("min", b[v], Const(200, dtype)))
                ib.store(y, [v], value)
    with ib.prim_func("byte_add"):  # arithmetic on bytes: no vector form (scalar loop)
        a = ib.arg("A", (32,), "uint8")
        y = ib.arg("Y", (32,), "uint8")
        with ib.for_range(32, name="v", kind="vectorized") as v:
            ib.store(y, [v], a[v] + a[v])
    return ib.get()


def _byte_args(dtype: type) -> list[np.ndarray]:
    info = np.iinfo(dtype)
    return [RNG.integers(info.min, info.max + 1, 54).astype(dtype) for _ in range(2)] + [
        np.zeros(54, dtype)]


def test_byte_and_word_lanes_become_vector_code() -> None:
    text = ""
    for name, dtype in (("bytes", np.uint8), ("signed", np.int8), ("words", np.int16)):
        (a, b, y), text = _run(_bytes(), name, *_byte_args(dtype))
        want = (np.where(a > b, a, np.maximum(b, -100)) if dtype == np.int8
                else np.maximum(a, np.minimum(b, 200)))
        np.testing.assert_array_equal(y, want.astype(dtype))
    assert re.search(r"<32 x i8>.*<16 x i8>.*<4 x i8>.*<2 x i8>", text, re.S)
    assert "<32 x i16>" in text and "<22 x i8>" not in text
    assert "icmp ugt <32 x i8>" in text or "icmp uge <32 x i8>" in text  # unsigned max
    add = _decided(_bytes())["byte_add"]
    assert not any(getattr(s, "kind", None) == "vector" for s in iter_stmts(add.body))


def _widen() -> IRModule:
    """Bytes widened (every dequantize of bytes): y = float32(a) * 0.5 + float32(b),
    z = int32(a) - int32(b), w = float32(int8(int32(a) + int32(b))) for uint8 `a` and int8
    `b` over 20 lanes (16 + 4): `uitofp`/`zext` from uint8, `sitofp`/`sext` from int8,
    the int8 narrowing inside the expression wraps."""
    ib = IRBuilder()
    with ib.prim_func("widen"):
        a = ib.arg("A", (20,), "uint8")
        b = ib.arg("B", (20,), "int8")
        y = ib.arg("Y", (20,), "float32")
        z = ib.arg("Z", (20,), "int32")
        w = ib.arg("W", (20,), "float32")
        with ib.for_range(20, name="v", kind="vectorized") as v:
            ib.store(y, [v], Cast("float32", a[v]) * 0.5 + Cast("float32", b[v]))
            ib.store(z, [v], Cast("int32", a[v]) - Cast("int32", b[v]))
            ib.store(w, [v], Cast("float32", Cast("int8", Cast("int32", a[v])
                                                  + Cast("int32", b[v]))))
    return ib.get()


def _widen_args() -> list[np.ndarray]:
    a = np.array([0, 1, 127, 128, 200, 255, 254, 129, 3, 250] * 2, np.uint8)
    b = np.array([0, -1, 127, -128, -100, 5, -2, 100, 100, -127] * 2, np.int8)
    return [a, b, np.zeros(20, np.float32), np.zeros(20, np.int32), np.zeros(20, np.float32)]


def test_byte_widening_casts_become_vector_code() -> None:
    (a, b, y, z, w), text = _run(_widen(), "widen", *_widen_args())
    assert "uitofp <16 x i8>" in text and "sitofp <16 x i8>" in text
    assert "zext <16 x i8>" in text and "sext <16 x i8>" in text
    assert "trunc <16 x i32>" in text and not _scalar_loop(text)
    wide_a, wide_b = a.astype(np.int32), b.astype(np.int32)
    np.testing.assert_array_equal(y, a.astype(np.float32) * 0.5 + b.astype(np.float32))
    np.testing.assert_array_equal(z, wide_a - wide_b)
    np.testing.assert_array_equal(w, (wide_a + wide_b).astype(np.int8).astype(np.float32))
    assert y.max() > 127 and z.min() < 0  # both signs reached


# ------------------------------------------------------------------ the C backend


def _float64_lanes() -> IRModule:
    """y[v] = max(-(a[v] * s) + a[v], -a[v]) over 6 float64 lanes (chunks of 4 and 2 at
    256 bits; the max blends with an int64 mask)."""
    ib = IRBuilder()
    with ib.prim_func("f64"):
        a = ib.arg("A", (6,), "float64")
        s = ib.arg("S", (1,), "float64")
        y = ib.arg("Y", (6,), "float64")
        with ib.for_range(6, name="v", kind="vectorized") as v, \
                ib.let("unused", a[v] * 3.0):  # printed nowhere: -Wunused-variable
            ib.store(y, [v], BinaryOp("max", UnaryOp("neg", a[v] * s[0]) + a[v],
                                      UnaryOp("neg", a[v])))
    return ib.get()


def _carried() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("carried"):
        y = ib.arg("Y", (9,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [v + 1], y[v] * 2.0)
    return ib.get()


def _tile_args(lanes: int) -> list[np.ndarray]:
    return [RNG.standard_normal((5, 3)).astype(np.float32),
            RNG.standard_normal((5, lanes)).astype(np.float32), np.zeros((3, lanes), np.float32)]


# name -> (module, vector bits to decide for, kernel, arguments). 40 lanes at 128 bits
# are 10 chunks: the C loop over chunks; 7 lanes at 256 bits: chunks of 4, 2 and 1.
C_CASES = {
    "tile8": (_tile(8), 256, "tile", _tile_args(8)),
    "tile7": (_tile(7), 256, "tile", _tile_args(7)),
    "tile2": (_tile(2), 256, "tile", _tile_args(2)),
    "tile72": (_tile(72), 128, "tile", _tile_args(72)),
    "minmax": (_min_max(), 256, "mm", [NAN_A, NAN_B, np.zeros(8, np.float32),
                                        np.zeros(8, np.float32)]),
    "f64": (_float64_lanes(), 256, "f64", [RNG.standard_normal(6), np.array([1.5]),
                                          np.zeros(6)]),
    "carried": (_carried(), 256, "carried", [np.ones(9, np.float32)]),
    # selects (masks and blends), bit casts, int32 shifts, __builtin_convertvector
    "exp": (_exp_lanes(), 256, "exp", [EXP_X, np.zeros(8, np.float32)]),
    # a narrowing store: the C printer keeps the loop scalar (the C compiler's to vectorize)
    "narrow": (_narrow(), 256, "narrow", _narrow_args()),
    # byte and word lanes: 54 = 32 + 16 + 4 + 2 bytes at 256 bits, 16 + 16 + 16 + 4 + 2
    # words; a select on an int8 mask
    "bytes": (_bytes(), 256, "bytes", _byte_args(np.uint8)),
    "signed": (_bytes(), 256, "signed", _byte_args(np.int8)),
    "words": (_bytes(), 256, "words", _byte_args(np.int16)),
    # bytes widened to int32 / float32 by their sign, int32 narrowed to int8 in between
    "widen": (_widen(), 256, "widen", _widen_args()),
}


@pytest.fixture(scope="module")
def c_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CLibrary]:
    if not have_cc():
        pytest.skip("no C compiler")
    mods = {f"kiln_{name}_": VectorizeLoops(vector_bits=bits)(mod)
            for name, (mod, bits, _, _) in C_CASES.items()}
    return build_many(mods, Path(tmp_path_factory.mktemp("c_vector_loops")), host_opt="-O0")


@pytest.mark.parametrize("case", sorted(C_CASES))
def test_c_vector_code_agrees_with_the_interpreter(case: str,
                                                   c_libs: dict[str, CLibrary]) -> None:
    mod, _, kernel, args = C_CASES[case]
    lib = c_libs[f"kiln_{case}_"]
    got = [a.copy() for a in args]
    lib.run(kernel, *got)
    want = [a.copy() for a in args]
    evaluate(mod, kernel, *want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    source = lib.source("kernels.c")
    assert ("#if KILN_VECTORS" in source) == (case not in ("carried", "narrow"))


def test_c_vector_loops_print_register_chunks(c_libs: dict[str, CLibrary]) -> None:
    """The C form uses the recorded register width: 8 float lanes at 256 bits, 4 at 128
    (with a C loop over the chunks of a long loop: 72 lanes are pieces of 64 and 8), 4
    doubles at 256."""
    assert "kiln_f32x8 load" in c_libs["kiln_tile8_"].source("kernels.c")
    seven = c_libs["kiln_tile7_"].source("kernels.c")
    assert "kiln_f32x4 load" in seven and "kiln_f32x2 load" in seven
    assert "for (int64_t lane = 0; lane < 64; lane += 4)" in c_libs[
        "kiln_tile72_"].source("kernels.c")
    assert "kiln_f64x4" in c_libs["kiln_f64_"].source("kernels.c")
    assert "kiln_u8x32 load" in c_libs["kiln_bytes_"].source("kernels.c")
    assert "kiln_i8x32 pick" in c_libs["kiln_signed_"].source("kernels.c")
    assert "kiln_i16x16 load" in c_libs["kiln_words_"].source("kernels.c")
    widen = c_libs["kiln_widen_"].source("kernels.c")  # float32 lanes: 8 bytes a chunk
    assert "kiln_u8x8 load" in widen and "__builtin_convertvector" in widen


def test_c_scalar_fallback_compiles(c_libs: dict[str, CLibrary], tmp_path: Path) -> None:
    """-DKILN_VECTORS=0 (a compiler without vector extensions) keeps the scalar loops."""
    lib = c_libs["kiln_tile7_"]
    path = tmp_path / "kernels.c"
    path.write_text(lib.source("kernels.c"))
    art = next(a for a in lib.artifacts if a.file_name == "kernels.c")
    flags = [*art.metadata["cflags"], "-DKILN_VECTORS=0"]
    compile_c(path, flags)
