"""The GEMV and the GEMM of 4-bit weights at accuracy_level 4 (A quantized to int8 per
block: kiln.kernels.gemm.nbits_int8 for one row, kiln.kernels.gemm.nbits_int8_gemm for
more) against onnxruntime's MatMulNBits with accuracy_level=4 (its CompInt8 kernels
quantize A the same way, so the integer sums are equal and only the float32 sums of the
blocks differ in order: rtol 1e-5 against outputs of about 10).

One model over symbolic rows holds three nodes (both paths in one kernel, one compile a
target): blocks of 16 and 128 with packed uint8 zero points, blocks of 32 with the
default zero point; K = 136 (no multiple of any block: the last block padded), N = 40 (a
partial panel); rows M = 1 (the GEMV), 2, 7 and 33 (the GEMM: one short row tile, a
clamped row tile, several chunks with a partial last one). Every block of A holds a value
that MLAS' multiplier `127 / max|a|` and `1 / (max|a| / 127)` round to different int8
codes (_near_halves), so A must be quantized as MLAS does, not only about as. Targets:
the host's LLVM (VNNI zmm on AVX512-VNNI hosts), its C build, AVX2 without VNNI
(`dot4_u8s8_sat16`: vpmaddubsw, exact for 4-bit codes) and AVX-512BW without VNNI.
Float zero points (which onnxruntime keeps in float32) are checked at import.
"""

from __future__ import annotations

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


def _near_halves(rng: np.random.Generator, rows: tuple[int, ...], block: int
                 ) -> np.ndarray:
    """Random A whose every block holds a value that `round(a * (127 / max|a|))` (MLAS)
    and `round(a * (1 / (max|a| / 127)))` round to different integers: each block's peak
    is one where the two multipliers differ, and its second value lies between the two
    multipliers' half-way points."""
    a = rng.standard_normal((*rows, K)).astype(np.float32)
    for row in a.reshape(-1, K):
        for start in range(0, K, block):
            peak, x = _straddle(rng)
            part = row[start:start + block]
            part *= np.float32(0.9) * peak / np.abs(part).max()
            part[0], part[1] = peak, -x
    return a


def _straddle(rng: np.random.Generator) -> tuple[np.float32, np.float32]:
    """A block peak and a value below it that the two multipliers round apart."""
    while True:
        peak = np.float32(rng.uniform(2.0, 3.0))
        mlas, other = np.float32(127) / peak, np.float32(1) / (peak / np.float32(127))
        half = np.float32((rng.integers(10, 100) + 0.5) / mlas)
        for x in half + np.arange(-8, 9, dtype=np.float32) * np.spacing(half):
            if np.rint(x * mlas) != np.rint(x * other):
                return peak, np.float32(x)


def _feeds(cases: dict[str, tuple[int, str]], rows: tuple[int, ...], seed: int
           ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"a_{n}": _near_halves(rng, rows, block) for n, (block, _) in cases.items()}


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
