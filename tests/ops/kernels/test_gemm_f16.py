"""The float16-weight GEMM (`host -precision=f16`: kiln.ops.gemm_f16, kiln.kernels.gemm.f16)
against numpy, and the code it runs.

Tolerance: the kernel rounds only the weights (float16 keeps 11 significant bits, a
relative error up to 2^-11 each), so against float32 weights a whole output's relative
L2 error comes out near 2e-4 on random data; 1e-3 leaves margin for it and catches any
wrong panel or column (errors near 1). Against the product of the float16 weights in
float64 the kernel must agree to float32 summation error, which pins the rounding of the
weights (numpy's: to nearest, ties to even) and that A is not rounded at all.

One model holds every case as a branch (one compile): remainders of M, N and K, Gemm's
transB and bias with ReLU, M = 1, and rows of a symbolic M with a second row dim. Any
x86-64 CPU with F16C (every AVX2 one) runs it; the AVX2 build is checked for the
conversion instruction without running it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.artifact import inspect_artifact
from kiln.frontend import from_onnx
from kiln.ops.gemm import unpack_b
from kiln.ops.gemm_f16 import pack_b_f16
from kiln.target import Target
from support.bf16_gemms import (
    REMAINDER_CASES,
    SYMBOLIC_ROWS,
    Weights,
    gemm_model,
    precision_host,
)
from support.numerics import rel_l2

RNG = np.random.default_rng(16)
TOL = 1e-3        # against float32 weights (see the module docstring)
TIGHT = 1e-6      # against the product of the float16 weights
CASES, SYMBOLIC = REMAINDER_CASES, SYMBOLIC_ROWS


@pytest.fixture(scope="module")
def built() -> tuple[Any, Weights]:
    model, weights = gemm_model([*CASES, (*SYMBOLIC, False)], RNG)
    return kiln.compile(from_onnx(model), precision_host("f16")), weights


def _reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
               rounded: bool) -> np.ndarray:
    w64 = (w.astype(np.float16) if rounded else w).astype(np.float64)
    y = x.astype(np.float64) @ w64
    return np.maximum(y + bias, 0) if bias is not None else y


@pytest.mark.parametrize("rows", [1, 5])
def test_f16_gemm_matches_float32(built: Any, rows: int) -> None:
    ex, weights = built
    shapes = {name: shape for name, shape, *_ in CASES}
    shapes[SYMBOLIC[0]] = (rows, *SYMBOLIC[1][1:])
    feeds = {name: RNG.standard_normal(shape).astype(np.float32)
             for name, shape in shapes.items()}
    outs = ex["main"](*feeds.values())
    for (name, x), got in zip(feeds.items(), outs):
        w, bias = weights[name]
        got = np.asarray(got)
        assert rel_l2(got, _reference(x, w, bias, False)) <= TOL, name
        assert rel_l2(got, _reference(x, w, bias, True)) <= TIGHT, name


def test_f16_weights_are_packed_at_compile_time(built: Any) -> None:
    ex, _ = built
    text = ex.ir.script()
    assert text.count("matmul_packed_f16") >= len(CASES) + 1
    assert "matmul_packed(" not in text and "matmul_gemv" not in text
    assert "vcvtph2ps" in ex.jit().inspect_source("asm")


def test_pack_keeps_numpy_rounding() -> None:
    w = RNG.standard_normal((45, 70)).astype(np.float32)
    w[0, 0], w[1, 1] = np.nan, 1.0 + 2.0 ** -11  # a NaN stays NaN; a tie rounds to even
    packed = pack_b_f16(w, 16)
    assert packed.shape == (5, 45, 16) and packed.dtype == np.float16
    back = unpack_b(packed, 70)
    assert np.isnan(back[0, 0]) and back[1, 1] == 1.0
    np.testing.assert_array_equal(back[2:], w[2:].astype(np.float16))


def test_avx2_build_widens_with_f16c() -> None:
    """An AVX2 target (no AVX-512) builds the same kernel on 8-lane vectors; compiled
    only (the object file), so any host checks it."""
    model, _ = gemm_model([("avx2", ("M", 40), 40, 24, False)], RNG)
    ex = kiln.compile(from_onnx(model), Target("llvm -mcpu=znver3 -precision=f16"))
    assert "matmul_packed_f16" in ex.ir.script()
    asm = "".join(inspect_artifact(a, "asm") or "" for a in ex.artifacts
                  if a.file_name.endswith(".o"))
    assert "vcvtph2ps" in asm and "zmm" not in asm
