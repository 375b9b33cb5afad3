"""Grouped-query attention's head expansion read in place (kiln.transform.grouped_heads,
run by MergeCopies): the Llama export's `Unsqueeze -> Expand -> Reshape` of the key and
value caches feeds the scores' product through a transpose and a scale, and the values'
product directly; after the pass no expansion is left. The scores, plus the decoder's
4-D mask (a graph input), go through the softmax to the values' product, which
`block-attention` then takes as one `attention_tiled` over the grouped heads
(kiln.transform.attention_heads: each group's key/value head read by its query heads,
the mask viewed in their axes), and the attention matches onnxruntime over symbolic
batch, query and cache lengths on llvm and c, a decode step's one row and a prompt's
rows with keys masked. The same for torch's dynamo spelling: the expansion's shapes
from Shape/Concat, and the keys transposed through a 3-D view (`Reshape [-1, t, d] ->
Transpose(0, 2, 1) -> Reshape [b, h, d, t]`) before the scale."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.transform import get_pass
from kiln.transform.merge_copies import MergeCopies
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

GROUPS, REP, DIM = 2, 3, 4
LOWEST = float(np.finfo(np.float32).min)
HEADS = GROUPS * REP


def _expanded(gb: GraphBuilder, x: str) -> str:
    """`repeat_kv`: [b, g, t, d] -> [b, g * r, t, d] as torch exports it."""
    x5 = gb.op("Unsqueeze", x, gb.const(np.array([2], np.int64)))
    wide = gb.op("Expand", x5, gb.const(np.array([1, GROUPS, REP, 1, DIM], np.int64)))
    return gb.op("Reshape", wide, gb.const(np.array([0, HEADS, -1, DIM], np.int64)))


def _dims(gb: GraphBuilder, x: str, *parts: int | tuple[int, int]) -> str:
    """A shape tensor: an int a constant dimension, (start, end) that slice of x's shape."""
    return gb.op("Concat", *(gb.op("Shape", x, start=p[0], end=p[1]) if isinstance(p, tuple)
                             else gb.const(np.array([p], np.int64)) for p in parts), axis=0)


def _dynamo_keys_t(gb: GraphBuilder, k: str) -> str:
    """torch dynamo's `repeat_kv(k).transpose(-2, -1)`: [b, g, t, d] -> [b, g * r, d, t]."""
    b, t = (0, 1), (2, 3)
    wide = gb.op("Expand", gb.op("Unsqueeze", k, gb.const(np.array([2], np.int64))),
                 _dims(gb, k, b, GROUPS, REP, t, DIM))
    heads = gb.op("Reshape", wide, _dims(gb, k, b, HEADS, t, DIM), allowzero=1)
    flat = gb.op("Reshape", heads, _dims(gb, k, -1, t, DIM))
    return gb.op("Reshape", gb.op("Transpose", flat, perm=(0, 2, 1)),
                 _dims(gb, k, b, HEADS, DIM, t))


@functools.cache
def _model(exporter: str) -> onnx.ModelProto:
    """Scores and values of a GQA layer as `exporter` ("torchscript", "dynamo") spells
    them."""
    gb = GraphBuilder()
    q = gb.input("q", ("batch", HEADS, "seq", DIM))
    k = gb.input("k", ("batch", GROUPS, "total", DIM))
    v = gb.input("v", ("batch", GROUPS, "total", DIM))
    kt = gb.op("Transpose", _expanded(gb, k), perm=(0, 1, 3, 2)) \
        if exporter == "torchscript" else _dynamo_keys_t(gb, k)
    kt = gb.op("Mul", kt, gb.const(np.array(0.5, np.float32)))
    mask = gb.input("mask", ("batch", 1, "seq", "total"))
    probs = gb.op("Softmax", gb.op("Add", gb.op("MatMul", q, kt), mask), axis=-1)
    gb.node("MatMul", [probs, _expanded(gb, v)], ["out"])
    gb.output("out", typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_no_expansion_is_left(exporter: str) -> None:
    main = MergeCopies()(from_onnx(_model(exporter)))["main"]
    assert isinstance(main, g.Function)
    ops = [b.value.op for b in main.bindings if isinstance(b.value, g.Call)]
    assert "broadcast_to" not in ops and ops.count("matmul") == 2
    assert "transpose" not in ops  # the keys' K^T read as transpose_b


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_grouped_heads_take_the_blocked_attention(exporter: str) -> None:
    mod = from_onnx(_model(exporter))
    with Target("llvm -mcpu=znver4"):
        for name in ("merge-copies", "block-matmuls", "block-attention"):
            mod = get_pass(name)(mod)
    calls = [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    assert "softmax" not in [c.op for c in calls]
    fused = [c for c in calls if c.op == "attention_tiled"]
    # each group's one key/value head broadcast over its query heads, as is the mask
    assert [[x.type.shape[1:3] for x in c.args] for c in fused] == [
        [(GROUPS, REP), (GROUPS, 1), (GROUPS, 1), (1, 1)]]


# The dynamo spelling rewrites to the same ops as the TorchScript one: llvm only.
@pytest.mark.parametrize("exporter, kind", [("torchscript", "llvm"), ("torchscript", "c"),
                                            ("dynamo", "llvm")])
def test_grouped_attention_matches_onnxruntime(exporter: str, kind: str) -> None:
    model = _model(exporter)
    compiled = kiln.compile(from_onnx(model), Target(kind)).jit()
    rng = np.random.default_rng(61)
    for batch, seq, total in ((1, 1, 5), (2, 11, 13)):
        # the decoder's causal mask (float32's lowest past each row's position), the
        # last sequence's first keys padded
        after = np.arange(total) > np.arange(seq)[:, None] + (total - seq)
        mask = np.broadcast_to(np.where(after, LOWEST, 0), (batch, 1, seq, total)).copy()
        mask[-1, :, :, :2] = LOWEST
        feeds = {"q": rng.normal(size=(batch, HEADS, seq, DIM)),
                 "k": rng.normal(size=(batch, GROUPS, total, DIM)),
                 "v": rng.normal(size=(batch, GROUPS, total, DIM)), "mask": mask}
        feeds = {n: x.astype(np.float32) for n, x in feeds.items()}
        got = compiled["main"](*feeds.values())
        np.testing.assert_allclose(np.asarray(got), onnxruntime_outputs(model, feeds)[0],
                                   rtol=1e-5, atol=1e-5, err_msg=f"{batch}x{seq}x{total}")
