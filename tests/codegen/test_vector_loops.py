"""`vectorized` loops emitted as LLVM vector instructions (kiln.codegen.llvm.vector_loops).

Each kernel runs through the llvmjit path and is compared with kiln's reference
interpreter (scalar, in loop order), and the LLVM IR is checked for the vector form or
for the scalar fallback the check must choose.
"""

from __future__ import annotations

import numpy as np
import pytest
from llvm_helpers import PREFIX, jit

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.lower_to_llvm import LoweringOptions, lower_module
from kiln.ir import IRBuilder, IRModule
from kiln.ir.evaluate import evaluate
from kiln.ir.tensor import BinaryOp, Intrin, UnaryOp

RNG = np.random.default_rng(7)


def _lowered(mod: IRModule) -> str:
    """The LLVM IR kiln emits for `mod`, before LLVM optimises it."""
    pool = ConstantPool.from_module(mod)
    return str(lower_module(mod, pool, LoweringOptions(prefix=PREFIX)).module)


def _run(mod: IRModule, name: str, *arrays: np.ndarray) -> tuple[list[np.ndarray], str]:
    """Run `name` compiled and interpreted on copies of `arrays`; both results must agree.
    Returns the compiled results and the LLVM IR kiln emitted."""
    m = jit(mod)
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


@pytest.mark.parametrize("lanes", [8, 7, 16, 2])
def test_register_tile_becomes_vector_code(lanes: int) -> None:
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    w = RNG.standard_normal((5, lanes)).astype(np.float32)
    y = np.zeros((3, lanes), np.float32)
    (_, _, got), text = _run(_tile(lanes), "tile", x, w, y)
    assert f"<{lanes} x float>" in text
    want = np.abs(np.einsum("kr,kv->rv", x.astype(np.float64), w.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_min_max_keep_nan_semantics_in_vector_form() -> None:
    ib = IRBuilder()
    with ib.prim_func("mm"):
        a = ib.arg("A", (8,), "float32")
        b = ib.arg("B", (8,), "float32")
        lo = ib.arg("LO", (8,), "float32")
        hi = ib.arg("HI", (8,), "float32")
        with ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(lo, [v], BinaryOp("min", a[v], b[v]))
            ib.store(hi, [v], BinaryOp("max", a[v], b[v] * 2.0 - 1.0))
    a = np.array([1, np.nan, 3, -4, np.inf, 0, -0.0, 5], np.float32)
    b = np.array([2, 1, np.nan, -5, 1, -0.0, 0, np.nan], np.float32)
    (_, _, lo, hi), text = _run(ib.get(), "mm", a, b, np.zeros(8, np.float32),
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
    m = jit(ib.get())
    y = np.zeros(8, np.float32)
    m["exp"](x, y)
    assert _scalar_loop(_lowered(ib.get()))
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)
