"""Concat along a symbolic axis: the inputs' start offsets are size expressions
(`b`, `2*b`), not numbers (legalization used to take int() of them)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from support.graphs import GraphBuilder
from support.reference import ort_session


def _concat_model(axis: int) -> onnx.ModelProto:
    b = GraphBuilder()
    b.input("x", ["b", "s"])
    b.input("y", ["b", "s"])
    b.output("o")
    b.node("Concat", ["x", "y", "x"], ["o"], axis=axis)
    return b.model(name="concat", ir_version=None, check=False)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_along_symbolic_axis_matches_onnxruntime(target: str, axis: int) -> None:
    model = _concat_model(axis)
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    session = ort_session(model)
    rng = np.random.default_rng(3)
    for b, s in ((1, 1), (2, 5), (3, 7)):
        x = rng.standard_normal((b, s)).astype(np.float32)
        y = rng.standard_normal((b, s)).astype(np.float32)
        want = session.run(None, {"x": x, "y": y})[0]
        np.testing.assert_array_equal(np.asarray(ex["main"](x, y)), want)
