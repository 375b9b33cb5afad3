"""Recurrent language models (Gather -> 2-layer LSTM or GRU -> MatMul), exported and run
in a fresh process, on llvm and c, against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from support.processes import outputs_in_fresh_process
from support.reference import ort_session

SEQ, BATCH, VOCAB, EMB, HID = 16, 2, 50, 32, 64


GATES = {"LSTM": 4, "GRU": 3}


def _lm(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    g = GATES[op]

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    inits = [w("emb", VOCAB, EMB), w("W1", 1, g * HID, EMB), w("R1", 1, g * HID, HID),
             w("B1", 1, 2 * g * HID), w("W2", 1, g * HID, HID), w("R2", 1, g * HID, HID),
             w("B2", 1, 2 * g * HID), w("proj", HID, VOCAB),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node(op, ["e", "W1", "R1", "B1"], ["y1"], hidden_size=HID),
             helper.make_node("Squeeze", ["y1", "ax"], ["s1"]),
             helper.make_node(op, ["s1", "W2", "R2", "B2"], ["y2"], hidden_size=HID),
             helper.make_node("Squeeze", ["y2", "ax"], ["s2"]),
             helper.make_node("MatMul", ["s2", "proj"], ["logits"])]
    graph = helper.make_graph(
        nodes, "lm", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [SEQ, BATCH])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [SEQ, BATCH, VOCAB])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("op", sorted(GATES))
def test_recurrent_language_model_in_a_fresh_process(op: str, target: str,
                                                      tmp_path: Path) -> None:
    model = _lm(op)
    ids = np.random.default_rng(2).integers(0, VOCAB, (SEQ, BATCH)).astype(np.int64)
    sess = ort_session(model)
    (want,) = sess.run(None, {"ids": ids})
    ex = kiln.compile(from_onnx(model), target)
    (got,) = outputs_in_fresh_process(ex, {"ids": ids}, tmp_path, threads=1)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
