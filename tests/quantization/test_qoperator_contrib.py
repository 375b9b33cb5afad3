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


I8 = TensorProto.INT8
#: QLinearSoftmax nodes of one model: (input, dtype, shape, attributes, x_scale, y_scale,
#: y_zero_point). Int8 and uint8; the last axis, another axis at opset 13 (onnxruntime
#: transposes it last) and at opset 11 (the trailing dims as one row); rows of 600 (the
#: former integer table's sum overflowed there); 1 / y_scale not an integer.
SOFTMAXES = [
    ("a", I8, [4, 256], {"axis": -1, "opset": 13}, 0.173, 1 / 256, -128),
    ("b", I8, [2, 3, 37], {"axis": 1, "opset": 13}, 0.0397, 1 / 255, -128),
    ("c", U8, [2, 3, 37], {"axis": 1, "opset": 11}, 0.0213, 1 / 256, 0),
    ("d", U8, [3, 600], {"axis": -1, "opset": 13}, 0.119, 1 / 128, 151),
    ("e", I8, [5, 9], {"axis": -1, "opset": 13}, 0.162, 0.01, 5),
]


def softmax_model(dtype: int = U8, y_scale: float = 1 / 256,
                  shape: tuple[int | str, ...] = (2, 37)) -> GraphBuilder:
    """One QLinearSoftmax over the last axis."""
    b = GraphBuilder()
    np_type = np.uint8 if dtype == U8 else np.int8
    b.consts({"sx": np.float32(0.173), "zx": np.asarray(97, np_type),
              "sy": np.float32(y_scale), "zy": np.asarray(0, np_type)})
    b.node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, axis=-1,
           opset=13)
    b.input("x", list(shape), dtype)
    b.output("y", list(shape), dtype)
    return b


def softmaxes_model() -> GraphBuilder:
    b = GraphBuilder()
    for name, dtype, shape, attrs, sx, sy, zy in SOFTMAXES:
        np_type = np.uint8 if dtype == U8 else np.int8
        b.consts({f"{name}_sx": np.float32(sx), f"{name}_zx": np.asarray(3, np_type),
                  f"{name}_sy": np.float32(sy), f"{name}_zy": np.asarray(zy, np_type)})
        b.node("QLinearSoftmax", [name, f"{name}_sx", f"{name}_zx", f"{name}_sy",
                                  f"{name}_zy"], [f"{name}_y"], domain=MS, **attrs)
        b.input(name, shape, dtype)
        b.output(f"{name}_y", shape, dtype)
    return b


def softmax_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random bytes, with every int8 value in a row, constant rows (their sums round at
    each step) and rows of one maximum (the output saturates)."""
    feeds = {}
    for name, dtype, shape, _, _, _, _ in SOFTMAXES:
        np_type = np.uint8 if dtype == U8 else np.int8
        info = np.iinfo(np_type)
        x = rng.integers(info.min, info.max + 1, shape).astype(np_type)
        rows = x.reshape(-1, shape[-1])
        rows[0] = info.max - 2
        rows[1] = info.min
        rows[1, -1] = info.max
        feeds[name] = x
    feeds["a"][2] = np.arange(-128, 128, dtype=np.int8)
    return feeds


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
            (softmaxes_model(), softmax_feeds(rng)),
            (where_model(), {"c": rng.random((4, 33)) < 0.5,
                             "x": rng.integers(0, 256, (4, 33), dtype=np.uint8),
                             "y": rng.integers(0, 256, (1, 33), dtype=np.uint8)})):
        model = _model(b)
        want = ort_session(model).run(None, feeds)
        fn = kiln.compile(from_onnx(model), target)["main"]
        got = fn(*feeds.values())
        for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want):
            np.testing.assert_array_equal(np.asarray(g), w)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"y_scale": 1e-9}, "outside what kiln reproduces"),
    ({"dtype": I8, "shape": ("n", "m")}, "rows of static length"),
])
def test_qlinear_softmax_kiln_cannot_match_is_refused(kwargs: dict, why: str) -> None:
    with pytest.raises(FrontendError, match=why) as err:
        from_onnx(_model(softmax_model(**kwargs)))
    assert "QLinearSoftmax" in str(err.value)
