"""Recurrent language models (Gather -> 2-layer LSTM or GRU -> MatMul), exported and run
in a fresh process, on llvm and c, against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.processes import outputs_in_fresh_process
from support.reference import ort_session

SEQ, BATCH, VOCAB, EMB, HID = 16, 2, 50, 32, 64


GATES = {"LSTM": 4, "GRU": 3}


def _lm(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    g = GATES[op]

    b = GraphBuilder()
    for name, shape in (("emb", (VOCAB, EMB)), ("W1", (1, g * HID, EMB)),
                        ("R1", (1, g * HID, HID)), ("B1", (1, 2 * g * HID)),
                        ("W2", (1, g * HID, HID)), ("R2", (1, g * HID, HID)),
                        ("B2", (1, 2 * g * HID)), ("proj", (HID, VOCAB))):
        b.const(rng.normal(0, 0.3, shape).astype(np.float32), name=name)
    b.const(np.array([1], np.int64), name="ax")
    b.node("Gather", ["emb", "ids"], ["e"])
    b.node(op, ["e", "W1", "R1", "B1"], ["y1"], hidden_size=HID)
    b.node("Squeeze", ["y1", "ax"], ["s1"])
    b.node(op, ["s1", "W2", "R2", "B2"], ["y2"], hidden_size=HID)
    b.node("Squeeze", ["y2", "ax"], ["s2"])
    b.node("MatMul", ["s2", "proj"], ["logits"])
    b.input("ids", [SEQ, BATCH], onnx.TensorProto.INT64)
    b.output("logits", [SEQ, BATCH, VOCAB])
    return b.model(opset=14, name="lm")


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
