"""The `fma` intrinsic (a * b + c rounded once) on the interpreter, llvm and c, and in
kiln.script text. The inputs make the fused and the unfused result differ:
(1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 in float32, so
fma(a, a, -(1 + 2^-11)) is 2^-24 while a * a - (1 + 2^-11) is 0."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import IRModule, evaluate
from kiln.ir.structural import assert_structural_equal
from kiln.ir.tensor import Buffer, Const, For, Intrin, PrimFunc, Store, Var
from kiln.script import from_source, print_module

N = 4


def fma_module(dtype: str) -> IRModule:
    a, b, c = (Buffer(n, (N,), dtype) for n in "abc")
    out = Buffer("out", (N,), dtype)
    i = Var("i", "int64")
    body = For(i, Const(0, "int64"), Const(N, "int64"), "serial",
               Store(out, Intrin("fma", (a[i], b[i], c[i])), (i,)))
    return IRModule({"fma_kernel": PrimFunc((a, b, c, out), body)})


def operands(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    eps = 2.0 ** -12 if dtype == "float32" else 2.0 ** -27
    a = np.array([1 + eps, 2.0, -1.5, 0.0], dtype)
    c = np.array([-(1 + 2 * eps), 0.5, 3.0, -2.0], dtype)
    return a, a.copy(), c


def expected(dtype: str) -> np.ndarray:
    eps = 2.0 ** -12 if dtype == "float32" else 2.0 ** -27
    return np.array([eps * eps, 4.5, 5.25, -2.0], dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_fused_on_native_backends(target: str, dtype: str) -> None:
    ex = kiln.compile(fma_module(dtype), target)
    out = np.zeros(N, dtype)
    ex["fma_kernel"](*operands(dtype), out)
    np.testing.assert_array_equal(out, expected(dtype))
    assert out[0] != 0  # rounded once: the unfused result would be 0


def test_interpreter_float32() -> None:
    out = np.zeros(N, np.float32)
    evaluate(fma_module("float32"), "fma_kernel", *operands("float32"), out)
    np.testing.assert_array_equal(out, expected("float32"))


def test_script_round_trip() -> None:
    mod = fma_module("float32")
    text = print_module(mod)
    assert "T.fma(" in text
    assert_structural_equal(from_source(text), mod)
