"""The one parallel-work threshold (kiln.kernels.parallel_work): a time.

A kernel goes parallel when its estimated one-thread time reaches PARALLEL_MIN_NS,
so the same multiply-add count is parallel on a narrow-vector target and serial on a
wide one; the `parallelize` pass follows the same rule, and the library's pool gets
the same figure as its default KILN_SERIAL_NS. Checked on the lowered IR (LLVM
targets of other CPUs need no such CPU) and with PoolStats on this host.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import UsageError
from kiln.frontend import from_onnx
from kiln.ir.module import IRModule
from kiln.ir.tensor import Allocate, For, PrimFunc
from kiln.ir.visitor import iter_stmts
from kiln.kernels.parallel_work import (
    PARALLEL_MIN_NS,
    UNITS,
    min_parallel_work,
    work_ns,
)
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform import get_pipeline
from support.graphs import GraphBuilder
from support.numerics import assert_close
from support.reference import onnxruntime_outputs

AVX512 = "llvm -mcpu=znver5"
AVX2 = "llvm -mcpu=haswell"
# Products of 8 rows by a constant matrix (the gemm family), M x K x N multiply-adds:
# 2k (tiny), 197k (above AVX2's 5 us, below AVX-512's), 524k (big on both).
M = 8
SIZES = {"tiny": (16, 16), "middle": (256, 96), "big": (512, 128)}


def dense_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    feeds, weights = {}, []
    for name, (k, n) in SIZES.items():
        x = b.input(f"x_{name}", [M, k])
        weights.append((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
        b.output(b.op("Gemm", x, b.const(weights[-1], f"w_{name}"), transB=1), [M, n])
        feeds[x] = rng.standard_normal((M, k)).astype(np.float32)
    return b.model(), feeds, weights


MODEL, FEEDS, WEIGHTS = dense_model()


def lowered(target: str) -> IRModule:
    tgt = Target(target)
    with tgt:
        mod = get_pipeline("default", "graph", target=tgt)(from_onnx(MODEL))
        out: IRModule = get_pipeline("default", "tensor", target=tgt)(mod)
        return out


def parallel_by_size(mod: IRModule) -> dict[str, bool]:
    """Whether the kernel of each product (found by its output's shape) has a parallel
    loop."""
    found = {}
    for fn in mod.functions.values():
        if not isinstance(fn, PrimFunc):
            continue
        for name, (_, n) in SIZES.items():
            if fn.params[-1].shape == (M, n):
                found[name] = any(isinstance(s, For) and s.kind == "parallel"
                                  for s in iter_stmts(fn.body))
    return found


def test_threshold_is_a_time_on_every_isa() -> None:
    wide, narrow = isa_for(Target(AVX512)), isa_for(Target(AVX2))
    for unit in UNITS:
        for isa in (wide, narrow):
            assert work_ns(min_parallel_work(unit, isa), unit, isa) == pytest.approx(
                PARALLEL_MIN_NS, rel=1e-3)
        # twice the lanes do the same work in half the time: twice as much pays;
        # streaming from cache is as fast on both
        ratio = 1 if unit == "stream" else 2
        assert min_parallel_work(unit, wide) == ratio * min_parallel_work(unit, narrow)
    with pytest.raises(UsageError, match="unit of work"):
        min_parallel_work("flop", wide)


@pytest.mark.parametrize("target, middle", [(AVX2, True), (AVX512, False)])
def test_kernels_split_by_estimated_time(target: str, middle: bool) -> None:
    assert parallel_by_size(lowered(target)) == {"tiny": False, "middle": middle,
                                                  "big": True}


def test_parallelize_follows_the_target() -> None:
    from kiln.transform.parallelize import Parallelize

    with Target(AVX2):
        avx2 = Parallelize().least_work()
    with Target(AVX512):
        avx512 = Parallelize().least_work()
    assert avx512 == 2 * avx2 == 2 * min_parallel_work("node", isa_for(Target(AVX2)))
    assert Parallelize(min_work=0).least_work() == 0  # an explicit count still wins


def test_pool_gets_the_big_kernel_only() -> None:
    """On this host: one call hands the pool the big product's loop (and the middle
    one's below AVX-512), the tiny one runs inline; results match numpy."""
    host = Target.from_host()
    expect = {"tiny": False, "middle": isa_for(host).vector_bits < 512, "big": True}
    ex = kiln.compile(MODEL, host)
    lib = ex.jit()
    lib.set_num_threads(2)
    try:
        before = lib.pool_stats()
        outs = lib["main"](*FEEDS.values())
        after = lib.pool_stats()  # handed to the pool: run by its threads, or alone where
        handed = after.loops + after.alone - before.loops - before.alone  # they share a core
        assert after.probes == 0  # no probe before a library's 64th loop (docs/abi.md)
    finally:
        lib.set_num_threads(None)
    assert parallel_by_size(ex.ir) == expect
    assert handed == sum(expect.values())
    for x, w, out in zip(FEEDS.values(), WEIGHTS, outs):
        np.testing.assert_allclose(np.asarray(out), x @ w.T, rtol=1e-4, atol=1e-4)


def test_padded_row_convolution_pads_per_band() -> None:
    """A padded row-tiled convolution runs as one parallel loop over bands of output
    rows, each padding its own input rows (docs/performance.md): 8 bands of heights
    within one (19 rows: 2 or 3 each), also for a stride-2 layer of 20 output rows;
    results match onnxruntime."""
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(5)
    b = GraphBuilder(5)
    feeds = {}
    for i, (h, w, s) in enumerate(((19, 24, 1), (40, 36, 2))):
        x = b.input(f"x{i}", [1, 4, h, w])
        b.output(b.op("Conv", x, b.weight(6, 4, 3, 3), kernel_shape=[3, 3], strides=[s, s],
                      pads=[1, 1, 1, 1]), None)
        feeds[x] = rng.standard_normal((1, 4, h, w)).astype(np.float32)
    model = b.model(infer_outputs=True)
    for band_loop in _padded_per_band(model, feeds, Target.from_host(), "conv2d_rows"):
        assert band_loop.extent.value == 8  # type: ignore[attr-defined]


def _padded_per_band(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: Target,
                     kernel: str) -> list[For]:
    """The parallel loops of the model's two `kernel` convolutions, each checked to
    allocate its band's padded rows inside; the outputs on two threads checked against
    onnxruntime's."""
    ex = kiln.compile(model, target)
    kernels = [fn for fn in ex.ir.functions.values()
               if isinstance(fn, PrimFunc) and fn.attrs.get("kiln.conv_kernel") == kernel]
    assert len(kernels) == 2
    loops = []
    for fn in kernels:
        (band_loop,) = [s for s in iter_stmts(fn.body) if isinstance(s, For)
                        and s.kind == "parallel"]
        assert any(isinstance(s, Allocate) and s.buffer.name == "xband"
                   for s in iter_stmts(band_loop.body))
        loops.append(band_loop)
    expected = onnxruntime_outputs(model, feeds)
    lib = ex.jit()
    lib.set_num_threads(2)
    try:
        outs = lib["main"](*feeds.values())
    finally:
        lib.set_num_threads(None)
    assert_close([np.asarray(o) for o in outs], expected, 1e-5)
    return loops


@pytest.mark.parametrize("target", ["host", "c"])
def test_padded_blocked_convolution_pads_per_band(monkeypatch: pytest.MonkeyPatch,
                                                  target: str) -> None:
    """A padded NCHW blocked convolution (of an input from `BANDED_TILES_BYTES` on, here
    lowered to any size) runs as one parallel loop over bands of consecutive tiles, each
    padding the input rows its tiles read into a buffer of its own
    (kiln.kernels.conv.bands.banded_tiles): a 3x3 layer of 64 channels on 11x10 (110
    positions, tiles wrapping rows, a partial last band) and a 3x3/2 one with asymmetric
    pads; results match onnxruntime on two threads (llvm and c)."""
    pytest.importorskip("onnxruntime")
    from kiln.kernels.conv import blocked
    monkeypatch.setattr(blocked, "BANDED_TILES_BYTES", 0)
    rng = np.random.default_rng(6)
    b = GraphBuilder(6)
    feeds = {}
    for i, (c, h, w, s, pads) in enumerate(((64, 11, 10, 1, [1, 1, 1, 1]),
                                            (48, 15, 13, 2, [0, 1, 2, 1]))):
        x = b.input(f"x{i}", [1, c, h, w])
        b.output(b.op("Conv", x, b.weight(20, c, 3, 3), kernel_shape=[3, 3], strides=[s, s],
                      pads=pads), None)
        feeds[x] = rng.standard_normal((1, c, h, w)).astype(np.float32)
    model = b.model(infer_outputs=True)
    _padded_per_band(model, feeds, Target.from_host() if target == "host" else Target(target),
                     "conv2d_blocked")
