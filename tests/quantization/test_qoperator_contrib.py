"""onnxruntime's com.microsoft QLinearSoftmax and QLinearWhere (the QOperator form of
Softmax and Where) against onnxruntime: equal integers; what kiln cannot run exactly
is refused naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import ort_session

U8 = TensorProto.UINT8
MS = "com.microsoft"


def softmax_model(dtype: int = U8, axis: int = -1, opset: int = 13) -> GraphBuilder:
    b = GraphBuilder()
    np_type = np.uint8 if dtype == U8 else np.int8
    b.consts({"sx": np.float32(0.173), "zx": np.asarray(97, np_type),
              "sy": np.float32(1 / 256), "zy": np.asarray(0, np_type)})
    b.node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, axis=axis,
           opset=opset)
    b.input("x", [2, 3, 37], dtype)
    b.output("y", [2, 3, 37], dtype)
    return b


def where_model() -> GraphBuilder:
    b = GraphBuilder()
    b.consts({"sx": np.float32(0.05), "zx": np.asarray(120, np.uint8),
              "sy": np.float32(0.0731), "zy": np.asarray(3, np.uint8),
              "sz": np.float32(0.05), "zz": np.asarray(120, np.uint8)})
    b.node("QLinearWhere", ["c", "x", "sx", "zx", "y", "sy", "zy", "sz", "zz"], ["out"],
           domain=MS)
    b.input("c", [4, 33], TensorProto.BOOL)
    b.input("x", [4, 33], U8)
    b.input("y", [1, 33], U8)
    b.output("out", [4, 33], U8)
    return b


def _model(b: GraphBuilder):  # type: ignore[no-untyped-def]
    return b.model(opset={"": 17, MS: 1}, check=False)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_qlinear_softmax_and_where_equal_onnxruntime(target: str) -> None:
    rng = np.random.default_rng(11)
    for b, feeds in (
            (softmax_model(), {"x": rng.integers(0, 256, (2, 3, 37), dtype=np.uint8)}),
            (softmax_model(axis=2, opset=11),
             {"x": rng.integers(0, 256, (2, 3, 37), dtype=np.uint8)}),
            (where_model(), {"c": rng.random((4, 33)) < 0.5,
                             "x": rng.integers(0, 256, (4, 33), dtype=np.uint8),
                             "y": rng.integers(0, 256, (1, 33), dtype=np.uint8)})):
        model = _model(b)
        want = ort_session(model).run(None, feeds)[0]
        fn = kiln.compile(from_onnx(model), target)["main"]
        np.testing.assert_array_equal(np.asarray(fn(*feeds.values())), want)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"dtype": TensorProto.INT8}, "uint8 table only"),
    ({"axis": 1}, "last axis"),
    ({"axis": 1, "opset": 11}, "last axis"),
])
def test_qlinear_softmax_kiln_cannot_match_is_refused(kwargs: dict, why: str) -> None:
    with pytest.raises(FrontendError, match=why) as err:
        from_onnx(_model(softmax_model(**kwargs)))
    assert "QLinearSoftmax" in str(err.value)
