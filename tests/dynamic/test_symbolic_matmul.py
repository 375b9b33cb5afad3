"""Attention's batched products with a symbolic `seq` on the GEMM micro-kernel: `Q @ K^T`
(seq is N: a partial last panel) and `P @ V` (seq is K: a symbolic depth), with the
batch dims symbolic and broadcast, at sizes around the tile edges, against
onnxruntime (llvm and c)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.numerics import rel_l2
from support.reference import ort_session

HEAD = 24  # not a multiple of the vector width


def _model() -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])
    b.node("MatMul", ["q", "kt"], ["scores"])
    b.node("Mul", ["scores", "scale"], ["scaled"])
    b.node("MatMul", ["scaled", "v"], ["ctx"])
    b.node("MatMul", ["q", "shared"], ["cross"])
    dims = ["b", "h", "s", HEAD]
    for name in "qkv":
        b.input(name, dims)
    b.input("shared", [1, "h", HEAD, "s"])
    b.output("ctx", dims)
    b.output("cross", ["b", "h", "s", "s"])
    b.const(np.array(0.125, np.float32), name="scale")
    return b.model(name="attention", ir_version=None)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_attention_products_with_a_symbolic_seq(target: str) -> None:

    model = _model()
    exe = kiln.compile(from_onnx(model), target)
    tiled = [f for f in exe.ir.prim_funcs().values()
             if f.attrs.get("kiln.gemm_kernel") == "matmul_tiled"]
    assert len(tiled) == 3, "every product takes the micro-kernel"
    session = ort_session(model)
    rng = np.random.default_rng(1)
    for b, h, s in ((1, 1, 1), (2, 3, 7), (1, 2, 33), (1, 1, 200)):
        feed = {name: rng.standard_normal((b, h, s, HEAD)).astype(np.float32)
                for name in ("q", "k", "v")}
        feed["shared"] = rng.standard_normal((1, h, HEAD, s)).astype(np.float32)
        got = exe["main"](*feed.values())
        for g, want in zip(got, session.run(None, feed)):
            assert g.shape == want.shape
            assert rel_l2(g, want) < 1e-5, (b, h, s)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_packed_products_with_a_symbolic_row_count(target: str) -> None:
    """`x @ W` with W a constant and x's rows symbolic (batch*seq): full row tiles, then
    the rows left one at a time (kiln.kernels.gemm.loop_nest), for every row count from
    1 past two tiles of any ISA's height, with a bias and an activation fused."""
    b = GraphBuilder()
    rng = np.random.default_rng(2)
    b.node("MatMul", ["x", "w"], ["p"])
    b.node("Add", ["p", "bias"], ["s"])
    b.node("Tanh", ["s"], ["y"])
    b.input("x", ["batch", "seq", 40])
    b.output("y", ["batch", "seq", 72])
    b.const(rng.standard_normal((40, 72)).astype(np.float32), name="w")
    b.const(rng.standard_normal(72).astype(np.float32), name="bias")
    model = b.model(name="dense", ir_version=None)
    exe = kiln.compile(from_onnx(model), target)
    assert any(f.attrs.get("kiln.gemm_kernel") == "matmul_packed"
               for f in exe.ir.prim_funcs().values())
    session = ort_session(model)
    for batch, seq in [(1, m) for m in range(1, 30)] + [(3, 5), (2, 16)]:
        feed = {"x": rng.standard_normal((batch, seq, 40)).astype(np.float32)}
        got = exe["main"](*feed.values())
        want = session.run(None, feed)[0]
        assert got.shape == want.shape
        assert rel_l2(got, want) < 1e-5, (batch, seq)


#: AVX-512 (16 float lanes) and AVX2 (8): the narrow tile's bound differs.
NARROW_TARGETS = ("llvm -mcpu=znver4", "llvm -mcpu=znver4 -mattr=-avx512f", "c")


@pytest.mark.parametrize("target", NARROW_TARGETS)
def test_scores_over_a_short_symbolic_seq_take_the_narrow_tile(target: str) -> None:
    """`Q @ K^T` over a symbolic seq: a run-time choice between a one-vector-wide tile
    (seq at most a vector's lanes) and the wide one (kiln.kernels.gemm.families
    .narrow_columns_tile), checked on both sides of the bound, at an empty sequence and
    an empty batch."""
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host does not run {target}")
    b = GraphBuilder()
    b.node("MatMul", ["q", "kt"], ["scores"])
    b.node("Div", ["scores", "scale"], ["y"])
    b.input("q", ["b", 2, "s", HEAD])
    b.input("kt", ["b", 2, HEAD, "s"])
    b.output("y", ["b", 2, "s", "s"])
    b.const(np.array(4.0, np.float32), name="scale")
    model = b.model(name="scores", ir_version=None)
    exe = kiln.compile(from_onnx(model), target)
    tiled = [f for f in exe.ir.prim_funcs().values()
             if f.attrs.get("kiln.gemm_kernel") == "matmul_tiled"]
    assert tiled
    if target.startswith("llvm"):  # B packed at run time at two widths, chosen at run time
        for f in tiled:
            widths = {int(s.buffer.shape[-1]) for s in iter_stmts(f.body)
                      if isinstance(s, Allocate) and s.buffer.name == "b_packed"}
            assert len(widths) == 2, widths
    session = ort_session(model)
    rng = np.random.default_rng(3)
    for batch, s in ((1, 1), (2, 7), (1, 8), (1, 9), (3, 16), (1, 17), (1, 0), (0, 5)):
        feed = {"q": rng.standard_normal((batch, 2, s, HEAD)).astype(np.float32),
                "kt": rng.standard_normal((batch, 2, HEAD, s)).astype(np.float32)}
        got = exe["main"](*feed.values())
        want = session.run(None, feed)[0]
        assert got.shape == want.shape, (batch, s)
        if want.size:
            assert rel_l2(got, want) < 1e-5, (batch, s)
