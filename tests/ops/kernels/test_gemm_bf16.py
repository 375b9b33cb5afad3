"""The bfloat16 GEMM (`host -precision=bf16`: kiln.ops.gemm_bf16, kiln.kernels.gemm.bf16)
against float32 numpy.

Tolerance: bfloat16 keeps 8 significant bits (a relative rounding error up to 2^-9,
about 2e-3, on each of A and B), so each product is off by up to about 4e-3 relative;
on random data those errors have random signs and the relative L2 error of a whole
output comes out near 2-3e-3. 1e-2 leaves margin for it and catches any wrong pairing
or packing (which gives errors near 1). Against the same product of the bfloat16-rounded
operands in float64 the kernel must agree to float32 summation error: that pins the
rounding (to nearest, ties to even) of both A and the weights.

One model holds every case as a branch (one compile): remainders of M, N and K (K past
whole blocks of 32, N past whole panels), Gemm's transB and bias with ReLU, M = 1, and
rows of a symbolic M with a second row dim, whose packed weight is over half of L2
(two panel groups: A converted once into a buffer both read). The host must
have AVX512-BF16 (the test machine, an AMD EPYC Zen 5, has it); elsewhere the run
tests skip.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.errors import TargetError
from kiln.frontend import from_onnx
from kiln.kernels.gemm.bf16 import panel_group
from kiln.ops import gemm_bf16
from kiln.ops.gemm_bf16 import bf16_round, pack_b_bf16, unpack_b_bf16
from kiln.target import Target
from kiln.target.isa import isa_for
from support.bf16_gemms import Case, Weights, gemm_model, gemm_reference
from support.graphs import GraphBuilder
from support.numerics import rel_l2

RNG = np.random.default_rng(63)
TOL = 1e-2        # against float32 (see the module docstring)
TIGHT = 1e-5      # against the product of the rounded operands
CASES: list[Case] = [  # (name, A's shape, K, N, Gemm with transB and bias)
    ("remainders", (7, 45), 45, 70, False),
    ("gemm_transb_bias", (5, 100), 100, 19, True),
    ("one_row", (1, 64), 64, 96, False),
]
SYMBOLIC = ("symbolic_rows", ("M", 3, 33), 33, 4200)  # 2 panel groups: A converted once


def _model() -> tuple[Any, Weights]:
    """The model (a branch per case) and each case's weight `[K, N]` and bias."""
    return gemm_model([*CASES, (*SYMBOLIC, False)], RNG)


def _bf16_host() -> Target:
    try:
        return Target("host -precision=bf16")
    except TargetError as err:
        pytest.skip(f"this host cannot run precision=bf16: {err}")


@pytest.fixture(scope="module")
def built() -> tuple[Any, Any, dict[str, tuple[np.ndarray, np.ndarray | None]]]:
    target = _bf16_host()
    model, weights = _model()
    return kiln.compile(from_onnx(model), target), model, weights


def _feeds(rows: int) -> dict[str, np.ndarray]:
    shapes = {name: shape for name, shape, *_ in CASES}
    shapes[SYMBOLIC[0]] = (rows, *SYMBOLIC[1][1:])
    return {f"x_{name}": RNG.standard_normal(shape).astype(np.float32)
            for name, shape in shapes.items()}


@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_gemm_matches_float32(built: Any, rows: int) -> None:
    ex, _, weights = built
    feeds = _feeds(rows)
    outs = ex["main"](*feeds.values())
    names = [*(c[0] for c in CASES), SYMBOLIC[0]]
    for name, got in zip(names, outs):
        w, bias = weights[name]
        x = feeds[f"x_{name}"]
        got = np.asarray(got)
        assert rel_l2(got, gemm_reference(x, w, bias, False)) <= TOL, name
        assert rel_l2(got, gemm_reference(x, w, bias, True)) <= TIGHT, name


def test_bf16_weights_are_packed_at_compile_time(built: Any) -> None:
    ex, _, _ = built
    text = ex.ir.script()
    assert text.count("matmul_packed_bf16") >= len(CASES) + 1
    assert "matmul_packed(" not in text and "matmul_gemv" not in text


def test_a_past_l2_by_a_b_of_two_l2s_is_one_panel_group() -> None:
    # Whisper's second FFN product, K 2048 by N 512: 16 panels of 1024 words, 2 MB
    isa = isa_for(Target("llvm -mcpu=znver4 -precision=bf16"))
    assert panel_group(1024, 32, 16, isa, 1500) == 16  # A's words 6 MB: one group
    assert panel_group(1024, 32, 16, isa, 128) == 4    # A's in L2: half an L2 per group
    assert panel_group(1024, 32, 16, isa, None) == 4   # symbolic rows
    assert panel_group(1536, 32, 24, isa, 197) == 2    # ViT's, B 4.7 MB


def test_pack_round_trips_the_rounded_weights(monkeypatch: Any) -> None:
    # rounded in many blocks and packed in steps of one pair block of K (every bf16
    # build packs its weights with the default block)
    monkeypatch.setattr(gemm_bf16, "ROUND_BLOCK", 64)
    w = RNG.standard_normal((45, 70)).astype(np.float32)
    w[0, 0], w[1, 1] = np.nan, 1.0 + 2.0 ** -8  # a NaN stays NaN; a tie rounds to even
    packed = pack_b_bf16(w.T.copy().T, 32)  # B as a Gemm's transposed weight
    assert packed.shape == (3, 32, 32) and packed.dtype == np.int32
    assert not packed.flags.writeable  # a graph constant takes it without a copy
    # packed panel by panel from the transpose's rows: the words of B's row-major path
    np.testing.assert_array_equal(packed, pack_b_bf16(w, 32))
    back = unpack_b_bf16(packed, 45, 70)
    assert np.isnan(back[0, 0]) and back[1, 1] == 1.0
    np.testing.assert_array_equal(back[2:], bf16_round(w)[2:])
    assert np.all(np.abs(back[2:] - w[2:]) <= np.abs(w[2:]) * 2.0 ** -8)


def test_bf16_round_matches_ml_dtypes_on_every_kind_of_value() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = RNG.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    # infinities, the largest finite values (rounding up to infinity), NaNs whose
    # rounding sum wraps around, ties, denormals, zeros
    bits[:12] = [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0xFFFFFFFF, 0x7FFFFFFF,
                 0xFFFF8000, 0x3F808000, 0x3F818000, 0x00008000, 0x00000000, 0x80000000]
    x = bits.view(np.float32).reshape(100, 200)
    got = bf16_round(x)
    nan = np.isnan(x)
    want = x[~nan].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert got.shape == x.shape and np.array_equal(np.isnan(got), nan)
    assert np.all(got.view(np.uint32)[nan] == 0x7FC00000)  # the quiet NaN
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want.view(np.uint32))


def test_sapphirerapids_build_only() -> None:
    """A library for another CPU with the instructions (AMX too) builds on any host; it
    is not loaded (the loader refuses it on a host without AMX)."""
    b = GraphBuilder()
    b.node("MatMul", [b.input("x", ("M", 40)), b.const(RNG.standard_normal((40, 24))
                                                       .astype(np.float32), "w")], ["y"])
    b.output("y", ("M", 24))
    model = b.model()
    target = Target("llvm -mcpu=sapphirerapids -precision=bf16")
    ex = kiln.compile(from_onnx(model), target)  # the object file, not linked or loaded
    assert "matmul_packed_bf16" in ex.ir.script() and "kernels.o" in ex.artifacts.inspect()


def _attention() -> Any:
    """softmax(Q @ K^T) @ V over a symbolic batch of 2 heads: 37 rows and columns (no
    whole panel, no whole tile of rows), K = 24 (part of one pair block) and then 37."""
    b = GraphBuilder()
    q, k, v = (b.input(name, ("N", 2, 37, 24)) for name in "qkv")
    scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    b.node("MatMul", [b.op("Softmax", scores, axis=-1), v], ["out"])
    b.output("out", ("N", 2, 37, 24))
    return b.model()


@pytest.fixture(scope="module")
def attention() -> Any:
    return kiln.compile(from_onnx(_attention()), _bf16_host())


@pytest.mark.parametrize("batch", [1, 3])
def test_bf16_attention_products_match_float32(attention: Any, batch: int) -> None:
    """Both products of activations run on `matmul_tiled_bf16` (B converted per call)."""
    ex = attention
    f = {name: RNG.standard_normal((batch, 2, 37, 24)).astype(np.float32) for name in "qkv"}
    scores = f["q"] @ f["k"].swapaxes(-1, -2)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ f["v"]
    assert rel_l2(np.asarray(ex["main"](*f.values())), want) <= TOL
    kernels = [f.attrs.get("kiln.gemm_kernel") for f in ex.ir.functions.values()
               if hasattr(f, "attrs")]
    assert kernels.count("matmul_tiled_bf16") == 2 and "matmul_tiled" not in kernels
