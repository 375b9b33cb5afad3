"""GatherND and ScatterND with symbolic dimensions (issue 23: GPT-2 exported with dynamic
axes failed with `gather_nd does not support symbolic dimensions`): one compile, three
sizes, compared exactly with onnxruntime on llvm and c."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln

SIZES = ((1, 1), (2, 3), (3, 5))


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gather_nd_model() -> onnx.ModelProto:
    # GPT-2's pattern: batch_dims=1, one index per batch row picks a seq position.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", 1])
    return _model([helper.make_node("GatherND", ["x", "i"], ["o"], batch_dims=1)], [x, i])


def _scatter_nd_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", 2])
    u = helper.make_tensor_value_info("u", TensorProto.FLOAT, ["b", 4])
    return _model([helper.make_node("ScatterND", ["x", "i", "u"], ["o"])], [x, i, u])


def _gather_nd_inputs(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((b, s, 4)).astype(np.float32),
            "i": rng.integers(-s, s, size=(b, 1)).astype(np.int64)}


def _scatter_nd_inputs(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
    # Distinct (row, position) pairs: ONNX leaves duplicate scatter targets unordered.
    rows = rng.permutation(b)
    return {"x": rng.standard_normal((b, s, 4)).astype(np.float32),
            "i": np.stack([rows, rng.integers(-s, s, size=b)], axis=1).astype(np.int64),
            "u": rng.standard_normal((b, 4)).astype(np.float32)}


CASES = {"gather_nd": (_gather_nd_model, _gather_nd_inputs),
         "scatter_nd": (_scatter_nd_model, _scatter_nd_inputs)}


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_indexing_matches_onnxruntime(target: str, case: str) -> None:
    build, make_inputs = CASES[case]
    model = build()
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(23)
    for b, s in SIZES:
        feeds = make_inputs(rng, b, s)
        want = session.run(None, feeds)[0]
        got = np.asarray(ex["main"](*feeds.values()))
        np.testing.assert_array_equal(got, want)


def test_gather_nd_symbolic_index_depth_is_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", "k"])
    model = _model([helper.make_node("GatherND", ["x", "i"], ["o"])], [x, i])
    with pytest.raises(kiln.errors.KilnError, match="last dimension of indices"):
        kiln.frontend.from_onnx(model)
