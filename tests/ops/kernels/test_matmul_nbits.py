"""The 4-/8-bit weight kernels (`matmul_nbits` -> `matmul_nbits_packed`, kiln.kernels.gemm
.nbits) against onnxruntime's MatMulNBits.

One model holds every case as a branch (one compile a target): 4 bits in blocks of 16
with packed uint8 zero points, 8 bits in blocks of 128 with the default zero point and a
bias (fused into the kernel's store), and 4 bits in blocks of 32 with float zero points on
one static row (the GEMV alone); K = 136 (no multiple of either block: the last
block padded), N = 40 (a partial panel on every target). Each kernel costs about 2 s of
LLVM a target, so the other forms (blocks of 32 and 64, float zero points, onnxruntime's
own quantizer's output) are tests/frontend/test_contrib_llm_ops.py's, on llvm and c,
which run on these kernels too. A's rows are symbolic (`batch`, `seq`), so the kernel's
M = 1 branch (the GEMV) and its M > 1 branch (the GEMM on dequantized blocks) both run:
M = 1, 3, 17 and 80 (past one chunk of row tiles). accuracy_level is unset, so
onnxruntime dequantizes B and multiplies in float32 as kiln does: only the order of the
sums differs (rtol and atol 1e-4 over K = 136).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import IRError
from kiln.frontend import from_onnx
from kiln.ir.types import TensorType
from kiln.ops.quant_nbits import pack_nbits
from kiln.ops.registry import get_op
from support.graphs import GraphBuilder
from support.nbits import MS, hand_packed
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

K, N = 136, 40
#: name -> (bits, block, zero points: "packed" uint8, "float" or "none", bias)
CASES = {
    "b4k16_packed_zp": (4, 16, "packed", False),
    "b8k128_default_zp_bias": (8, 128, "none", True),
}
STATIC_ROW = "b4k32_float_zp_one_row"
ROWS = ((1, 1), (1, 3), (1, 17), (3, 1), (2, 40))  # (batch, seq): M = 1, 3, 17, 3, 80


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    b = GraphBuilder(seed=61)
    for name, case in CASES.items():
        bits, block, zp, bias = case
        hand_packed(b, name, bits, K, N, block, zp=zp, bias=bias)
    # a static row: the kernel is the GEMV alone
    hand_packed(b, STATIC_ROW, 4, K, N, 32, zp="float", rows=(1, 1))
    return b.model(opset={"": 17, MS: 1}, check=False)


@pytest.fixture(scope="module", params=NATIVE_TARGETS)
def compiled(request: pytest.FixtureRequest, model: onnx.ModelProto) -> kiln.Executable:
    return kiln.compile(from_onnx(model), native_target(request.param))


def test_kernels_match_onnxruntime(model: onnx.ModelProto, compiled: kiln.Executable) -> None:
    script = compiled.ir.script()
    assert script.count('"kiln.gemm_kernel": "matmul_nbits_packed"') == len(CASES) + 1
    rng = np.random.default_rng(5)
    for batch, seq in ROWS:
        feeds: dict[str, Any] = {f"a_{name}": rng.standard_normal((batch, seq, K)).astype(
            np.float32) for name in CASES}
        feeds[f"a_{STATIC_ROW}"] = rng.standard_normal((1, 1, K)).astype(np.float32)
        want = onnxruntime_outputs(model, feeds)
        got = compiled["main"](*feeds.values())
        for name, g, w in zip([*CASES, STATIC_ROW], got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} at {batch}x{seq}")


def test_weights_stay_packed() -> None:
    """The packed operands hold the codes' bytes (a quarter of float32's at 4 bits),
    columns past N zero."""
    rng = np.random.default_rng(1)
    b = rng.integers(0, 256, (5, 3, 16), dtype=np.uint8)
    scales = rng.uniform(size=(5, 3)).astype(np.float32)
    bp, sp = pack_nbits(b, scales, None, 4)
    assert bp.dtype == np.uint8 and bp.shape == (2, 3, 16, 4) and sp.shape == (2, 3, 4)
    assert (bp[0, :, :, 1] == b[1]).all() and (bp[1, :, :, 0] == b[4]).all()
    assert not bp[1, :, :, 1:].any() and not sp[1, :, 1:].any()


A3 = TensorType((3, 40), "float32")


@pytest.mark.parametrize(("op", "types", "attrs", "why"), [
    ("matmul_nbits", [A3, TensorType((5, 3, 8), "uint8"), TensorType((5, 3), "float32")],
     {"bits": 3}, r"bits 3; it takes \(4, 8\)"),
    ("matmul_nbits", [A3, TensorType((5, 3, 8), "uint8"), TensorType((5, 3), "float32")],
     {"block": 24}, "power of two"),
    ("matmul_nbits", [A3, TensorType((5, 2, 8), "uint8"), TensorType((5, 3), "float32")],
     {}, r"b must be uint8 \[5, 3, 8\]"),
    ("matmul_nbits", [TensorType((3, 41), "float32"), TensorType((5, 3, 8), "uint8"),
                      TensorType((5, 3), "float32")], {}, r"A must be float32 \[\.\.\., 40\]"),
    ("matmul_nbits_packed", [A3, TensorType((1, 3, 8, 8), "uint8"),
                             TensorType((1, 3, 4), "float32")], {},
     r"scales must be float32 \[1, 3, 8\]"),
    ("matmul_nbits_packed", [A3, TensorType((1, 3, 8, 8), "uint8"),
                             TensorType((1, 3, 8), "float32")], {"tile": (4, 16)},
     "does not match the panels' width 8"),
])
def test_malformed_calls_are_refused(op: str, types: list[TensorType], attrs: dict,
                                     why: str) -> None:
    with pytest.raises(IRError, match=why):
        get_op(op).infer_type(types, {"k": 40, "n": 5, "bits": 4, "block": 16, **attrs})
