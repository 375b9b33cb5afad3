"""The row-by-row max pooling kernel (kiln.kernels.pool.max_rows) against onnxruntime,
bit for bit, on llvm, llvm with AVX-512 off and c.

Cases: float32 with ceil_mode and asymmetric pads (a last window past the end pads),
dilation with stride 2 (window columns in both phases), a non-square window with
stride 3 x 1, int8 (the stem's 3x3/2 pad 1) and uint8 (2x2/2 with ceil_mode), each
channel's rows staged before the horizontal steps; then a plane too large to stage and
a uint8 pool with short phase rows, one row at a time (the staged byte pools are wide
enough that their phase rows are not short on AVX-512's 64-byte vectors either). Then
the parallel loop over (image, channel), chosen by the one work threshold
(kiln.kernels.parallel_work), bit for bit on two threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

pytest.importorskip("onnxruntime")

ELEM = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
# (input shape, dtype, MaxPool attributes)
CASES: list[tuple[tuple[int, ...], str, dict[str, Any]]] = [
    ((1, 3, 17, 19), "float32", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1],
                                     ceil_mode=1)),
    ((2, 2, 13, 21), "float32", dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2],
                                     pads=[2, 2, 2, 2])),
    ((1, 4, 14, 9), "float32", dict(kernel_shape=[3, 2], strides=[3, 1], pads=[0, 1, 1, 0])),
    ((1, 5, 23, 72), "int8", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 3, 11, 75), "uint8", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    # rows staged one at a time: a plane past half the L1, and a byte pool's short phases
    ((1, 1, 100, 100), "float32", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 3, 15, 15), "uint8", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
]


def build_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = GraphBuilder(seed=26)
    rng = np.random.default_rng(26)
    feeds = {}
    for i, (shape, dtype, attrs) in enumerate(CASES):
        x = b.input(f"x{i}", list(shape), ELEM[dtype])
        if dtype == "float32":
            feeds[x] = rng.standard_normal(shape).astype(np.float32)
        else:
            info = np.iinfo(dtype)
            feeds[x] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        b.output(b.op("MaxPool", x, **attrs), elem=ELEM[dtype])
    return b.model(opset=17, name="max_pool", check=False), feeds


MODEL, FEEDS = build_model()


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return onnxruntime_outputs(MODEL, FEEDS)


@pytest.mark.parametrize("target", NATIVE_TARGETS)
def test_matches_onnxruntime_exactly(target: str, reference: list[np.ndarray]) -> None:
    exe = kiln.compile(from_onnx(MODEL), native_target(target))
    pools = [f for f in exe.ir.functions.values() if f.attrs.get("kiln.pool_kernel")]
    assert len(pools) == len(CASES)
    one_row = {shape for shape, _, _ in CASES[-2:]}
    for f in pools:  # the staged rows on the stack, no padded copy of the input
        allocs = {s.buffer.name: s.buffer for s in iter_stmts(f.body)
                  if isinstance(s, Allocate)}
        assert allocs["maxrow"].scope == "local" and "xpad" not in allocs
        # the buffer the horizontal steps read (kiln.kernels.pool.max_rows.staged_rows)
        staged = allocs.get("maxphase", allocs["maxrow"]).shape[0]
        x, out = f.params[0].shape, f.params[-1].shape
        assert staged == (1 if tuple(x) in one_row else out[2]), (x, staged)
    got = exe(*FEEDS.values())
    for case, g, want in zip(CASES, got, reference, strict=True):
        assert np.asarray(g).dtype == want.dtype, case
        np.testing.assert_array_equal(np.asarray(g), want, err_msg=str(case))


def test_parallel_by_the_work_threshold() -> None:
    """A pool's (image, channel) loop goes to the thread pool when its work reaches the one
    threshold of kiln.kernels.parallel_work, and `parallelize` splits nothing else:
    the cnn's first 2x2/2 pool (16 x 64 x 64) is parallel, its third (64 x 16 x 16, about
    1 us) serial on AVX2 and AVX-512; two threads give the same values bit for bit."""
    from kiln.ir.tensor import For
    from kiln.kernels.parallel_work import worth_parallel
    from kiln.kernels.pool.max_rows import MAX_ELEMENTS
    from kiln.target import Target
    from kiln.target.isa import isa_for

    b = GraphBuilder(seed=27)
    shapes = [(1, 16, 64, 64), (1, 64, 16, 16)]
    for i, shape in enumerate(shapes):
        b.output(b.op("MaxPool", b.input(f"x{i}", list(shape)), kernel_shape=[2, 2],
                      strides=[2, 2]))
    model = b.model(opset=17, name="max_pool_split", check=False)
    rng = np.random.default_rng(27)
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    exe = kiln.compile(from_onnx(model), "llvm")
    pools = sorted((f for f in exe.ir.functions.values() if f.attrs.get("kiln.pool_kernel")),
                   key=lambda f: f.params[0].shape[1])
    # the (image, channel) loop: kiln.kernels.tiles.parallel_tiles's `tile`
    kinds = [[s.kind for s in iter_stmts(f.body) if isinstance(s, For) and s.var.name == "tile"]
             for f in pools]
    isa = isa_for(Target("llvm"))  # the ISA the pools were built for
    for shape, loop in zip(shapes, kinds, strict=True):
        n, c, h, w = shape
        work = n * c * (h // 2) * (2 * w + 2 * (w // 2)) * MAX_ELEMENTS
        assert loop == ["parallel" if worth_parallel(work, "element", isa) else "serial"], shape
    assert kinds[0] == ["parallel"]  # the small one depends on the host's vector width
    kiln.runtime.set_num_threads(2)
    try:
        got = exe(*feeds.values())
    finally:
        kiln.runtime.set_num_threads(None)
    for g, want in zip(got, onnxruntime_outputs(model, feeds), strict=True):
        np.testing.assert_array_equal(np.asarray(g), want)
