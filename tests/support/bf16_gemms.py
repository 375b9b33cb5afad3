"""Models of MatMul/Gemm cases by constant weights and their float references, for the
`precision=bf16` and `precision=f16` GEMM tests (tests/ops/kernels/test_gemm_bf16.py,
test_gemm_amx.py, test_gemm_f16.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kiln.errors import TargetError
from kiln.ops.gemm_bf16 import bf16_round
from kiln.target import Target
from support.graphs import GraphBuilder

#: (name, A's shape, K, N, Gemm with transB, bias and ReLU instead of MatMul)
Case = tuple[str, tuple[Any, ...], int, int, bool]
#: A case's weight `[K, N]` and bias (None for MatMul), by case name.
Weights = dict[str, tuple[np.ndarray, np.ndarray | None]]
#: Remainders of M, N and K, Gemm's transB and bias with ReLU, and M = 1.
REMAINDER_CASES: list[Case] = [
    ("remainders", (7, 45), 45, 70, False),
    ("gemm_transb_bias", (5, 100), 100, 19, True),
    ("one_row", (1, 64), 64, 96, False),
]
#: Rows of a symbolic M with a second row dim (a Case without its last field).
SYMBOLIC_ROWS = ("symbolic_rows", ("M", 3, 33), 33, 50)


def gemm_model(cases: Sequence[Case], rng: np.random.Generator) -> tuple[Any, Weights]:
    """One model holding each case as a branch (input `x_{name}`, output `y_{name}`),
    and each case's weight and bias."""
    b = GraphBuilder()
    weights: Weights = {}
    for name, shape, k, n, gemm in cases:
        x = b.input(f"x_{name}", shape)
        w = rng.standard_normal((n, k) if gemm else (k, n)).astype(np.float32)
        out = f"y_{name}"
        if gemm:
            bias = rng.standard_normal(n).astype(np.float32)
            y = b.op("Gemm", x, b.const(w, "w"), b.const(bias, "bias"), transB=1)
            b.node("Relu", [y], [out])
            weights[name] = (w.T, bias)
        else:
            b.node("MatMul", [x, b.const(w, "w")], [out])
            weights[name] = (w, None)
        b.output(out, (*shape[:-1], n))
    return b.model(), weights


def gemm_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                   rounded: bool) -> np.ndarray:
    """The case's output in float64: of the float32 operands, or (`rounded`) of the
    operands rounded to bfloat16 as the kernels round them."""
    if rounded:
        x, w = bf16_round(x).astype(np.float64), bf16_round(w).astype(np.float64)
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    return np.maximum(y + bias, 0) if bias is not None else y


def precision_host(precision: str) -> Target:
    """`host -precision=PRECISION`, or skip the test where this host cannot run it."""
    try:
        return Target(f"host -precision={precision}")
    except TargetError as err:
        pytest.skip(f"this host cannot run precision={precision}: {err}")
