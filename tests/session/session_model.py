"""A small ONNX model with a symbolic batch axis and two outputs (float and int64)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_model(path: Path) -> Path:
    """MatMul + Relu over x[batch, 8], and Shape(x); saved at `path`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         helper.make_node("Shape", ["x"], ["s"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln-tests")
    onnx.save(model, str(path))
    return path
