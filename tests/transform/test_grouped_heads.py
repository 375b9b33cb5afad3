"""Grouped-query attention's head expansion read in place (kiln.transform.grouped_heads,
run by MergeCopies): the Llama export's `Unsqueeze -> Expand -> Reshape` of the key and
value caches feeds the scores' product through a transpose and a scale, and the values'
product directly; after the pass no expansion is left, and the attention matches
onnxruntime over symbolic batch, query and cache lengths on llvm and c."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.transform.merge_copies import MergeCopies
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

GROUPS, REP, DIM = 2, 3, 4
HEADS = GROUPS * REP


def _expanded(gb: GraphBuilder, x: str) -> str:
    """`repeat_kv`: [b, g, t, d] -> [b, g * r, t, d] as torch exports it."""
    x5 = gb.op("Unsqueeze", x, gb.const(np.array([2], np.int64)))
    wide = gb.op("Expand", x5, gb.const(np.array([1, GROUPS, REP, 1, DIM], np.int64)))
    return gb.op("Reshape", wide, gb.const(np.array([0, HEADS, -1, DIM], np.int64)))


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    gb = GraphBuilder()
    q = gb.input("q", ("batch", HEADS, "seq", DIM))
    k = gb.input("k", ("batch", GROUPS, "total", DIM))
    v = gb.input("v", ("batch", GROUPS, "total", DIM))
    kt = gb.op("Mul", gb.op("Transpose", _expanded(gb, k), perm=(0, 1, 3, 2)),
               gb.const(np.array(0.5, np.float32)))
    gb.node("MatMul", [q, kt], ["scores"])
    probs = gb.op("Softmax", "scores", axis=-1)
    gb.node("MatMul", [probs, _expanded(gb, v)], ["out"])
    gb.output("scores", typed=False)
    gb.output("out", typed=False)
    return gb.model(check=False)


def test_no_expansion_is_left(model: onnx.ModelProto) -> None:
    main = MergeCopies()(from_onnx(model))["main"]
    assert isinstance(main, g.Function)
    ops = [b.value.op for b in main.bindings if isinstance(b.value, g.Call)]
    assert "broadcast_to" not in ops and ops.count("matmul") == 2


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_grouped_attention_matches_onnxruntime(model: onnx.ModelProto, kind: str) -> None:
    compiled = kiln.compile(from_onnx(model), Target(kind)).jit()
    rng = np.random.default_rng(61)
    for batch, seq, total in ((1, 1, 5), (2, 3, 7)):
        feeds = {"q": rng.normal(size=(batch, HEADS, seq, DIM)),
                 "k": rng.normal(size=(batch, GROUPS, total, DIM)),
                 "v": rng.normal(size=(batch, GROUPS, total, DIM))}
        feeds = {n: x.astype(np.float32) for n, x in feeds.items()}
        got = compiled["main"](*feeds.values())
        for name, k, w in zip(("scores", "out"), got, onnxruntime_outputs(model, feeds)):
            np.testing.assert_allclose(np.asarray(k), w, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} at {batch}x{seq}x{total}")
