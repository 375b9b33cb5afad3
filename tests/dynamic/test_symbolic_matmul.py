"""Attention's batched products with a symbolic `seq` on the GEMM micro-kernel: `Q @ K^T`
(seq is N: a partial last panel) and `P @ V` (seq is K: a symbolic depth), with the
batch dims symbolic and broadcast, at sizes around the tile edges, against
onnxruntime (llvm and c)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import from_onnx
from support.numerics import rel_l2
from support.reference import ort_session

HEAD = 24  # not a multiple of the vector width


def _model() -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
             helper.make_node("MatMul", ["scaled", "v"], ["ctx"]),
             helper.make_node("MatMul", ["q", "shared"], ["cross"])]
    dims = ["b", "h", "s", HEAD]
    graph = helper.make_graph(
        nodes, "attention",
        [vi("q", TensorProto.FLOAT, dims), vi("k", TensorProto.FLOAT, dims),
         vi("v", TensorProto.FLOAT, dims), vi("shared", TensorProto.FLOAT, [1, "h", HEAD, "s"])],
        [vi("ctx", TensorProto.FLOAT, dims), vi("cross", TensorProto.FLOAT, ["b", "h", "s", "s"])],
        [onnx.numpy_helper.from_array(np.array(0.125, np.float32), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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
