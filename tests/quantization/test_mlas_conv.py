"""conv2d_mlas's kernel (kiln/kernels/int8/mlas_conv.py on kiln/kernels/gemm/mlas_order.py)
against onnxruntime's float Conv whose weights it cannot pre-pack (graph inputs: MLAS's
im2col and SGEMM, docs/quantization.md "Files quantized by others"), bit for bit, on
each of the kernel's paths: the input read in place (a 1x1 stride-1 layer, grouped or
not) or expanded into columns (strides, pads, dilations, groups, a batch); tiles of
whole vectors, a last tile shifted back over the tile before it, a last tile narrower
than a vector; surplus rows in the last row tile; several K blocks with a shorter last
one; column ranges whose K blocks differ (onnxruntime's threads); MLAS's M = 1 kernel
(a depthwise layer); a fused residual Add and Relu. On the host's LLVM target, the
same with AVX-512 switched off (the 16-register tiles) and the c backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import kiln
from kiln.ir import graph as g
from kiln.ir.tensor import Allocate, PrimFunc
from kiln.ir.types import TensorType
from kiln.ir.visitor import iter_stmts
from kiln.kernels.gemm.mlas_order import MlasGemm, Segment
from kiln.kernels.lowering import legalize_call, lowering_for
from kiln.ops import call as op_call
from kiln.ops.quant_mlas_conv import geometry, k_blocks
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import ort_session
from support.targets import NATIVE_TARGETS, native_target


class Case:
    """One convolution: input `[batch, c, h, w]`, `oc` filters `k` x `k`, onnxruntime's
    `threads`; `residual`: followed by `relu(conv + r)`, fused into the kernel."""

    def __init__(self, batch: int, c: int, oc: int, hw: tuple[int, int], k: int = 1,
                 stride: int = 1, pad: int = 0, dilation: int = 1, group: int = 1,
                 threads: int = 2, residual: bool = False) -> None:
        self.x = (batch, c, *hw)
        self.w = (oc, c // group, k, k)
        self.attrs: dict[str, Any] = {"strides": (stride, stride), "pads": (pad,) * 4,
                                      "dilations": (dilation, dilation), "group": group}
        self.threads, self.residual = threads, residual

    @property
    def out(self) -> tuple[int, ...]:
        return geometry(self.x, self.w, self.attrs).out


# (what it exercises): the 16-lane tiles of AVX-512 are 8 rows x 32 columns, AVX2's 6 x 16
CASES = {
    # in place; 20 rows; columns 0-80 in K blocks 128, 128, 44, columns 80-143 (a last
    # tile shifted back) in 256, 44
    "direct": Case(1, 300, 20, (11, 13)),
    # in place, the group's channels at an offset; 2 images
    "direct-groups": Case(2, 48, 36, (6, 6), group=3),
    # columns expanded: a padded, strided, dilated 3x3 over an odd image, per group and
    # image (one SGEMM each)
    "expanded": Case(2, 12, 18, (13, 11), k=3, stride=2, pad=2, dilation=2, group=3),
    # 9 columns: one tile narrower than a vector
    "narrow": Case(1, 16, 8, (3, 3), k=3, pad=1),
    # 4 threads: columns 0-96 in blocks of 512, 96-100 in one of 576 (two ranges)
    "segments": Case(1, 64, 32, (10, 10), k=3, pad=1, threads=4),
    # in place, 2 ranges of columns with equal K blocks (one loop), 4 blocks of 128
    "direct-wide": Case(1, 512, 16, (14, 14), threads=2),
    # MLAS's M = 1 kernel: a depthwise 3x3
    "depthwise": Case(1, 8, 8, (9, 10), k=3, pad=1, group=8),
    # the epilogue reads a residual along the flat positions, then Relu
    "residual": Case(1, 24, 40, (5, 11), residual=True),
}


def _inputs(rng: np.random.Generator) -> dict[str, dict[str, np.ndarray]]:
    data = {}
    for name, case in CASES.items():
        c_k = case.w[1] * case.w[2] * case.w[3]
        data[name] = {
            "x": rng.standard_normal(case.x).astype(np.float32),
            "w": (rng.standard_normal(case.w) / np.sqrt(c_k)).astype(np.float32),
            "b": rng.standard_normal(case.w[0]).astype(np.float32),
            "r": rng.standard_normal((case.x[0], case.w[0], *case.out)).astype(np.float32)}
    return data


def _onnxruntime(case: Case, data: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's result: Conv (weights as graph inputs), then Add and Relu."""
    b = GraphBuilder()
    for name in ("x", "w", "b"):
        b.input(name, list(data[name].shape))
    attrs = case.attrs
    b.node("Conv", ["x", "w", "b"], ["y"], strides=list(attrs["strides"]),
           pads=list(attrs["pads"]), dilations=list(attrs["dilations"]), group=attrs["group"])
    feeds = {k: data[k] for k in ("x", "w", "b")}
    out = "y"
    if case.residual:
        b.input("r", list(data["r"].shape))
        b.node("Add", ["y", "r"], ["s"])
        b.node("Relu", ["s"], ["z"])
        feeds["r"], out = data["r"], "z"
    b.output(out, None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = case.threads
    # its CPU fusion of Conv + Add starts the sums from the residual (MLAS's beta = 1);
    # kiln's conv2d_mlas is only ever read by a QuantizeLinear, and its fused chains add
    # to the sum as onnxruntime's separate Add does
    session = ort_session(b.model(opset=13, check=False), options,
                          disabled_optimizers=["ConvAddActivationFusion"])
    return np.asarray(session.run(None, feeds)[0])


def _kiln_function(data: dict[str, dict[str, np.ndarray]]) -> g.Function:
    """Every case's conv2d_mlas (constant weight and bias) in one function, its inputs
    (and residuals) the parameters, a tuple of the results."""
    params, bindings, results = [], [], []
    for name, case in CASES.items():
        x = g.Var(f"{name}_x", TensorType(case.x, "float32"))
        params.append(x)
        conv = op_call("conv2d_mlas", x, g.Constant(data[name]["w"]),
                       g.Constant(data[name]["b"]), **case.attrs, threads=case.threads)
        y = g.Var(f"{name}_y", conv.type)
        bindings.append(g.Binding(y, conv))
        if case.residual:
            r = g.Var(f"{name}_r", TensorType(data[name]["r"].shape, "float32"))
            params.append(r)
            s, z = g.Var(f"{name}_s", conv.type), g.Var(f"{name}_z", conv.type)
            bindings += [g.Binding(s, op_call("add", y, r)), g.Binding(z, op_call("relu", s))]
            y = z
        results.append(y)
    return g.Function(tuple(params), tuple(bindings), g.Tuple(tuple(results)))


@pytest.fixture(scope="module")
def references() -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    data = _inputs(np.random.default_rng(7))
    return data, {name: _onnxruntime(case, data[name]) for name, case in CASES.items()}


@pytest.mark.parametrize("native", NATIVE_TARGETS)
def test_kernel_equals_onnxruntime(native: str, references: Any) -> None:
    data, want = references
    exe = kiln.compile(_kiln_function(data), native_target(native))
    # the residual Add and the Relu ran in the convolution's kernel
    assert not [f for f in exe.ir.functions if f.startswith(("add", "relu", "fused_add"))]
    feeds = []
    for name, case in CASES.items():
        feeds += [data[name]["x"], *([data[name]["r"]] if case.residual else [])]
    got = exe["main"](*feeds)
    for name, out in zip(CASES, got, strict=True):
        out = np.asarray(out)
        assert out.shape == want[name].shape, name
        differ = int((out != want[name]).sum())
        assert differ == 0, f"{name} on {native}: {differ} of {out.size} differ"


def test_cases_take_the_paths_they_name() -> None:
    """The cases' shapes reach the paths they are named for (the kernel's choices,
    asserted so that a change of rule does not leave a path untested)."""
    def spans(name: str) -> tuple[tuple[int, int, int], ...]:
        case = CASES[name]
        return k_blocks(geometry(case.x, case.w, case.attrs).shape(), case.threads)

    assert spans("segments") == ((0, 32, 512), (32, 64, 512), (64, 96, 512), (96, 100, 1024))
    assert spans("direct") == ((0, 80, 128), (80, 143, 256))
    assert spans("direct-wide") == ((0, 112, 128), (112, 196, 128))
    assert not _allocates_columns("direct") and not _allocates_columns("direct-groups")
    assert _allocates_columns("expanded") and _allocates_columns("segments")


def _allocates_columns(name: str) -> bool:
    case = CASES[name]
    x = g.Var("x", TensorType(case.x, "float32"))
    w = g.Var("w", TensorType(case.w, "float32"))
    lowering = lowering_for("conv2d_mlas")
    assert lowering is not None
    func, _ = legalize_call(op_call("conv2d_mlas", x, w, **case.attrs, threads=case.threads),
                            lowering, isa_for(None))
    assert isinstance(func, PrimFunc)
    return any(isinstance(s, Allocate) and s.buffer.name == "col"
               for s in iter_stmts(func.body))


@pytest.mark.parametrize(("columns", "nr", "lanes"), [
    (((0, 63, 128),), 32, 16), (((0, 49, 256),), 32, 16), (((0, 196, 128),), 16, 8),
    (((0, 96, 512), (96, 100, 1024)), 32, 16), (((0, 9, 128),), 32, 16),
    (((0, 40, 128), (40, 72, 256), (72, 75, 128)), 16, 8)])
def test_tiles_store_each_column_once(columns: tuple[tuple[int, int, int], ...], nr: int,
                                      lanes: int) -> None:
    """The tiles of `MlasGemm.runs` store every column once, in whole vectors where the
    segment is that wide, and compute only columns of their own segment (whose K blocks
    they sum)."""
    gemm = MlasGemm(1, 8, 64, tuple(Segment(*c) for c in columns), 8, nr, lanes)
    stored: list[int] = []
    for run in gemm.runs():
        segment = next(s for s in gemm.segments if s.start <= run.first < s.stop)
        assert run.stride == segment.stride
        for j in range(run.count):
            first = run.first + j * run.width
            assert segment.start <= first and first + run.width <= segment.stop
            stored += range(first + run.skip, first + run.width)
        rounded = -(-run.width // lanes) * lanes
        assert run.width == rounded or rounded > segment.stop - segment.start
    assert sorted(stored) == list(range(columns[-1][1]))
