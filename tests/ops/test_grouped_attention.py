"""Grouped-query attention with dynamic axes on the blocked kernel (`block-attention`
over kiln.transform.attention_heads) against onnxruntime.

The attention of transformers' Llama-style decoders as torch exports it with its cache:
the key/value heads expanded to the query heads (`repeat_kv`: Unsqueeze, Expand,
Reshape), `Q @ K^T` scaled, the decoder's 4-D mask (computed from the inputs: a graph
input here) added, Softmax, `@ V`, with the batch, query rows and keys symbolic. After
`merge-copies` reads the cache in place (kiln.transform.grouped_heads) the products
run over `[b, groups, rep, ...]`; `attention_tiled` takes the chain over those
operands, the group's keys and values read for each of its query heads, at every size:
a decode step's one query row and a prompt's rows, a mask that hides keys included.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.transform import get_pass
from support.graphs import GraphBuilder, value_info
from support.numerics import assert_close
from support.reference import onnxruntime_outputs

pytest.importorskip("onnxruntime")

HEADS, GROUPS, D, DV = 4, 2, 16, 24
LOWEST = float(np.finfo(np.float32).min)


def _model() -> onnx.ModelProto:
    b = GraphBuilder()
    axis = b.const(np.array([2], np.int64))
    reps = b.const(np.array([1, 1, HEADS // GROUPS, 1, 1], np.int64))
    heads = {}
    for x, width in (("k", D), ("v", DV)):
        wide = b.op("Expand", b.op("Unsqueeze", x, axis), reps)
        heads[x] = b.op("Reshape", wide, b.const(np.array([0, HEADS, -1, width], np.int64)))
    scores = b.op("MatMul", "q", b.op("Transpose", heads["k"], perm=[0, 1, 3, 2]))
    scaled = b.op("Mul", scores, b.const(np.array(D ** -0.5, np.float32)))
    probs = b.op("Softmax", b.op("Add", scaled, "mask"), axis=-1)
    b.node("MatMul", [probs, heads["v"]], ["y"])
    inputs = [("q", ["b", HEADS, "m", D]), ("k", ["b", GROUPS, "n", D]),
              ("v", ["b", GROUPS, "n", DV]), ("mask", ["b", 1, "m", "n"])]
    return b.model([value_info(*x) for x in inputs], [value_info("y", ["b", HEADS, "m", DV])])


MODEL = _model()


def _feeds(batch: int, m: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(m * n)
    mask = np.where(np.arange(n) > np.arange(m)[:, None] + (n - m), LOWEST, 0)
    mask = np.broadcast_to(mask, (batch, 1, m, n)).astype(np.float32).copy()
    mask[-1, :, :, : n // 3] = LOWEST  # the last sequence's first keys padded
    return {"q": rng.standard_normal((batch, HEADS, m, D), np.float32),
            "k": rng.standard_normal((batch, GROUPS, n, D), np.float32),
            "v": rng.standard_normal((batch, GROUPS, n, DV), np.float32), "mask": mask}


def test_grouped_heads_take_the_blocked_kernel_at_every_size() -> None:
    mod = from_onnx(MODEL)
    with Target("llvm -mcpu=znver4"):
        for name in ("fold-constants", "merge-copies", "block-matmuls", "block-attention"):
            mod = get_pass(name)(mod)
    calls = [x.value for x in mod["main"].bindings if isinstance(x.value, g.Call)]
    fused = [c for c in calls if c.op == "attention_tiled"]
    assert len(fused) == 1 and "softmax" not in [c.op for c in calls]
    # the group's one key/value head broadcast over its query heads: no copy per head
    q, k, v, bias = (x.type.shape for x in fused[0].args)
    assert (q[1:3], k[1:3], v[1:3], bias[1:3]) == ((GROUPS, 2), (GROUPS, 1), (GROUPS, 1),
                                                   (1, 1))
    executable = kiln.compile(from_onnx(MODEL), "llvm")
    for batch, m, n in ((1, 1, 9), (2, 13, 21)):
        feeds = _feeds(batch, m, n)
        got = executable(*feeds.values())
        assert_close([np.asarray(got)], onnxruntime_outputs(MODEL, feeds), 1e-5, [(m, n)])
