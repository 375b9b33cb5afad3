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
