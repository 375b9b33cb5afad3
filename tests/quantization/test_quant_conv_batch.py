"""The dot-form convolution over a pinned batch and its positions tile's width
(kiln/kernels/int8/conv_dot.py, kiln/kernels/int8/dot.py): a batch whose input, im2col
words and output outgrow the L2 runs the kernel of a chunk of samples (the largest
divisor of the batch that fits) on each chunk's slice, the chunks in parallel from
`MIN_PARALLEL_CHUNKS` of them (each thread whole chunks, serial tiles); on VNNI a
positions tile holds at least the profile's `int8_min_accumulators` (28 x 28 and 14 x 14
outputs take two vectors, not one) and at most its `int8_position_vectors`. Outputs
equal onnxruntime's on the host's VNNI, on AVX-512BW without VNNI (`vpmaddwd` pairs), on
AVX2 and on the c backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from quantized_models import qlinear_conv_model
from test_dot_gemm import host_runs

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import For, PrimFunc
from kiln.ir.visitor import iter_stmts
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_dot import MIN_PARALLEL_CHUNKS
from kiln.ops.quant_conv_words import CONV_DOT
from kiln.target import Target
from kiln.target.isa import isa_for
from support.reference import ort_session

TARGETS = ["llvm -mcpu=znver4", "llvm -mcpu=skylake-avx512",
           "llvm -mcpu=znver4 -mattr=-avx512f", "c -mcpu=znver4"]
# 8 x 16 x 80 x 80, 3x3/2 to 32 channels: about 380 KB a sample (input, 36 groups of
# im2col words over 40 x 40 positions, output), so 2 samples at a time in a 1 MB L2
# (AVX-512, and znver4 without it), 1 in 512 KB (haswell): 4 or 8 chunks, run in
# parallel; 1x1 to 8 channels at 14 x 14 (one sample): a positions tile, the last of its
# column tiles partial (196 = 6 x 32 + 4)
BATCHED = ((8, 16, 80, 80), 32, 3, 2, 1)
NARROW = ((1, 64, 14, 14), 8, 1, 1, 0)


def _chunks(model: onnx.ModelProto, target: str) -> list[tuple[int, str]]:
    """The kernel's loop over chunks of samples (the outermost `n` around the tiles; none
    where the kernel takes the batch whole) as [(extent, kind)]: serial around parallel
    tiles, or parallel around tiles whose loops are all serial."""
    ex = kiln.compile(from_onnx(model), target)
    (fn,) = [f for name, f in ex.ir.functions.items()
             if isinstance(f, PrimFunc) and name.startswith(CONV_DOT)]
    out = []
    for s in iter_stmts(fn.body):
        if not (isinstance(s, For) and s.var.name == "n"):
            continue
        inner = any(isinstance(t, For) and t.kind == "parallel" for t in iter_stmts(s.body))
        if (s.kind, inner) in (("serial", True), ("parallel", False)):
            out.append((s.extent.value, s.kind))  # type: ignore[attr-defined]
    return out[:1]


@pytest.fixture(scope="module")
def models() -> list[tuple[onnx.ModelProto, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(59)
    out = []
    for shape, oc, k, stride, pad in (BATCHED, NARROW):
        model = qlinear_conv_model(shape, oc, k, stride, pad, False, rng)
        x = rng.integers(0, 256, shape).astype(np.uint8)
        out.append((model, x, ort_session(model).run(None, {"x": x})[0]))
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_batched_and_narrow_convolutions_equal_onnxruntime(
        target: str, models: list[tuple[onnx.ModelProto, np.ndarray, np.ndarray]]) -> None:
    if not host_runs(target):
        pytest.skip(f"this host lacks {target}'s features")
    for model, x, want in models:
        lib = kiln.compile(from_onnx(model), target).jit()
        lib.set_num_threads(2)
        np.testing.assert_array_equal(lib["main"](x), want, err_msg=target)


def test_a_batch_beyond_the_l2_runs_in_chunks_that_fit(
        models: list[tuple[onnx.ModelProto, np.ndarray, np.ndarray]]) -> None:
    model = models[0][0]
    # 1 MB of L2: 4 chunks of 2 samples; 512 KB: 8 of 1 (the loop's extent: chunks),
    # each in parallel (MIN_PARALLEL_CHUNKS)
    assert MIN_PARALLEL_CHUNKS == 4
    assert isa_for(Target("llvm -mcpu=znver4")).l2_bytes == 1024 * 1024
    assert _chunks(model, "llvm -mcpu=znver4") == [(4, "parallel")]
    assert isa_for(Target("llvm -mcpu=haswell")).l2_bytes == 512 * 1024
    assert _chunks(model, "llvm -mcpu=haswell") == [(8, "parallel")]
    rng = np.random.default_rng(0)
    # fewer chunks: one after the other, each one's tiles split over the threads
    four = qlinear_conv_model((4, *BATCHED[0][1:]), *BATCHED[1:], False, rng)
    assert _chunks(four, "llvm -mcpu=znver4") == [(2, "serial")]
    # one sample fits: the kernel takes it whole (pinned batch-1 kernels unchanged)
    single = qlinear_conv_model((1, *BATCHED[0][1:]), *BATCHED[1:], False, rng)
    assert _chunks(single, "llvm -mcpu=znver4") == []


def test_vnni_positions_tiles_hold_enough_accumulators() -> None:
    """VNNI on zmm: a tile of one vector would leave its 8 accumulators waiting on
    `vpdpbusd`'s latency, and the last column tile computes only the vectors its positions
    fill (no padding to pay), so the widest tile (3 vectors) is taken unless a narrower
    one divides the positions (56 x 56 = 98 x 32); the int16 pairs (`vpmaddwd`, an add:
    no such chain) and AVX2 keep the least padding."""
    vnni = isa_for(Target("llvm -mcpu=znver4"))
    assert vnni.profile.int8_min_accumulators == 16
    # (and no wider than 3 vectors, whose 8 rows store words of 4 channels; 56 x 56 took
    # 4 vectors of 6 rows before; 12 x 12 = 144 fills 3 whole ones)
    assert dot.position_tile_cols(vnni) == 48 < dot.tile_cols(vnni)
    for positions, want in ((784, 48), (196, 48), (56 * 56, 32), (144, 48), (49, 48),
                            (12, 12)):
        nr = dot.tile_cols_for(vnni, positions)
        assert nr == want, positions
        if positions > 16:
            assert dot.tile_rows(vnni, nr) * nr // 16 >= 16
    with Target("llvm -mcpu=skylake-avx512"):
        pairs = dot.target_isa(isa_for(None))
    assert pairs is not None and pairs.int8_dot == dot.PAIRS16
    assert dot.tile_cols_for(pairs, 784) == 16
    avx2 = dot.target_isa(isa_for(Target("llvm -mcpu=znver4 -mattr=-avx512f")))
    assert avx2 is not None and avx2.vector_bits == 256
    assert dot.tile_cols_for(avx2, 196) == 8
