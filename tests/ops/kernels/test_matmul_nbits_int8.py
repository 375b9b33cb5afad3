"""The GEMV and the GEMM of 4-bit weights at accuracy_level 4 (A quantized to int8 per
block: kiln.kernels.gemm.nbits_int8 for one row, kiln.kernels.gemm.nbits_int8_gemm for
more) against onnxruntime's MatMulNBits with accuracy_level=4 (its CompInt8 kernels
quantize A the same way, so the integer sums are equal and only the float32 sums of the
blocks differ in order: rtol 1e-5 against outputs of about 10).

One model over symbolic rows holds three nodes (both paths in one kernel, one compile a
target): blocks of 16 and 128 with packed uint8 zero points, blocks of 32 with the
default zero point; K = 136 (no multiple of any block: the last block padded), N = 40 (a
partial panel); rows M = 1 (the GEMV), 2, 7 and 33 (the GEMM: one short row tile, a
clamped row tile, several chunks with a partial last one). Targets: the host's LLVM (VNNI
zmm on AVX512-VNNI hosts), its C build, AVX2 without VNNI (`dot4_u8s8_sat16`: vpmaddubsw,
exact for 4-bit codes) and AVX-512BW without VNNI. Float zero points (which onnxruntime
keeps in float32) are checked at import.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.nbits import MS, hand_packed
from support.reference import onnxruntime_outputs

K, N = 136, 40
#: name -> (block, zero points)
CASES = {"k16_zp": (16, "packed"), "k32_default_zp": (32, "none"), "k128_zp": (128, "packed")}
AVX2 = "llvm -mcpu=znver4 -mattr=-avx512f"
AVX512BW = "llvm -mcpu=skylake-avx512"
#: What each int8 GEMV kernel allocates: A's int8 words.
INT8_GEMV = "a_words = T.allocate"
#: What each int8 GEMM kernel allocates: the int8 words of A's rows.
INT8_GEMM = "a_rows_words = T.allocate"
#: Rows of A each target runs: the GEMV's one, then the GEMM's.
ROWS = (1, 2, 7, 33)


def _level4(model: onnx.ModelProto) -> onnx.ModelProto:
    for node in model.graph.node:
        node.attribute.append(onnx.helper.make_attribute("accuracy_level", 4))
    return model


def _model(rows: tuple[int | str, ...], cases: dict[str, tuple[int, str]]) -> onnx.ModelProto:
    b = GraphBuilder(seed=61)
    for name, (block, zp) in cases.items():
        hand_packed(b, name, 4, K, N, block, zp=zp, rows=rows)
    return _level4(b.model(opset={"": 17, MS: 1}, check=False))


@pytest.fixture(scope="module")
def any_rows() -> onnx.ModelProto:
    return _model((1, "seq"), CASES)


def _target(name: str) -> Target:
    host = Target.from_host()
    if name == "c":
        return Target({**host.export(), "kind": "c"})
    target = host if name == "llvm" else Target(name)
    if not isa_for(target).features <= isa_for(host).features:
        pytest.skip(f"this host does not run {name}")
    return target


def _feeds(names: Any, rows: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"a_{n}": rng.standard_normal((*rows, K)).astype(np.float32) for n in names}


@pytest.mark.parametrize("name", ["llvm", "c", AVX2, AVX512BW])
def test_int8_gemv_and_gemm_match_onnxruntime(any_rows: onnx.ModelProto, name: str) -> None:
    target = _target(name)
    if isa_for(target).int8_dot is None:
        pytest.skip(f"{name} has no integer dot product: the float GEMV runs")
    compiled = kiln.compile(from_onnx(any_rows), target)
    script = compiled.ir.script()
    assert script.count(INT8_GEMV) == len(CASES)
    assert script.count(INT8_GEMM) == len(CASES)
    for m in ROWS:
        feeds = _feeds(CASES, (1, m), m)
        want = onnxruntime_outputs(any_rows, feeds)
        got = compiled["main"](*feeds.values())
        for case, g, w in zip(CASES, got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-4,
                                       err_msg=f"{case} on {name}, M = {m}")


@pytest.mark.parametrize(("zp", "int8"), [("none", True), ("packed", True), ("float", False)])
def test_float_zero_points_keep_float32(zp: str, int8: bool) -> None:
    """onnxruntime quantizes A only with packed uint8 zero points or none: a node with
    float ones is imported without its accuracy level (the float GEMV)."""
    b = GraphBuilder(seed=1)
    hand_packed(b, "x", 4, K, N, 32, zp=zp, rows=(1, 1))
    module = from_onnx(_level4(b.model(opset={"": 17, MS: 1}, check=False)))
    assert ("accuracy_level=4" in module.script()) == int8
