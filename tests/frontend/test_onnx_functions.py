"""Operators kiln imports as their ONNX function body (kiln.frontend.onnx.functions),
compiled and compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import ort_session


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]],
           outputs: list[str], opset: int) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(*nodes)
    for n, (t, s) in inputs.items():
        b.input(n, s, t)
    for o in outputs:
        b.output(o, typed=False)
    return b.model(opset=opset, ir_version=10, check=False)


def _check_against_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                               target: str = "llvm") -> None:
    want = ort_session(model).run(None, feeds)
    lib = kiln.compile(from_onnx(model), target).jit()
    got = lib["main"](*feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and g_.shape == w.shape
        np.testing.assert_allclose(g_, w, rtol=1e-4, atol=1e-5)


def test_two_attention_nodes_with_grouped_query_heads_match_onnxruntime() -> None:
    """A context-dependent body (built from the attributes and input types), twice in
    one graph: each expansion's internal values are its own."""
    f = TensorProto.FLOAT
    heads = {"q_num_heads": 4, "kv_num_heads": 2}  # 3-D inputs: [batch, seq, heads * 8]
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["a"], is_causal=1, **heads),
             helper.make_node("Attention", ["a", "k", "v"], ["b"], scale=0.5, **heads)]
    shapes = {"q": [2, 5, 32], "k": [2, 6, 16], "v": [2, 6, 16]}
    model = _model(nodes, {n: (f, s) for n, s in shapes.items()}, ["b"], 23)
    rng = np.random.default_rng(0)
    _check_against_onnxruntime(
        model, {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()})


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_softmax_cross_entropy_expands_the_nested_nll_loss_function(target: str) -> None:
    """SoftmaxCrossEntropyLoss's body calls NegativeLogLikelihoodLoss, itself a function;
    the weights input and ignore_index reach the inner body."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y", "w"], ["loss", "logp"],
                            reduction="mean", ignore_index=1)
    model = _model([node], {"x": (f, [3, 5, 2]), "y": (i64, [3, 2]), "w": (f, [5])},
                   ["loss", "logp"], 13)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(3, 5, 2)).astype(np.float32),
             "y": np.array([[0, 1], [4, 2], [3, 3]], np.int64),
             "w": rng.uniform(0.5, 1.5, 5).astype(np.float32)}
    _check_against_onnxruntime(model, feeds, target)


def test_a_body_using_an_unsupported_op_names_the_node_and_the_op() -> None:
    f = TensorProto.FLOAT
    node = helper.make_node("Bernoulli", ["p"], ["draw"], name="coin")
    model = _model([node], {"p": (f, [2, 3])}, ["draw"], 20)
    with pytest.raises(FrontendError, match=r"node 'coin' \(Bernoulli\), imported as its ONNX "
                       r"function body: its ONNX function body uses RandomUniformLike, which "
                       r"kiln does not support"):
        from_onnx(model)


def test_an_op_without_converter_or_function_is_listed_as_unsupported() -> None:
    node = helper.make_node("ImageDecoder", ["x"], ["y"])
    model = _model([node], {"x": (TensorProto.UINT8, [100])}, ["y"], 20)
    with pytest.raises(FrontendError, match=r"kiln does not support .*\n  ImageDecoder x1"):
        from_onnx(model)
