"""A small ONNX model with a symbolic batch axis and two outputs (float and int64)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_model(path: Path) -> Path:
    """MatMul + Relu over x[batch, 8], and Shape(x); saved at `path`."""
    import onnx
    from onnx import TensorProto

    from support.graphs import GraphBuilder

    b = GraphBuilder()
    b.const(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), name="W")
    b.node("MatMul", ["x", "W"], ["h"])
    b.node("Relu", ["h"], ["y"])
    b.node("Shape", ["x"], ["s"])
    b.input("x", ["batch", 8])
    b.output("y", ["batch", 4])
    b.output("s", [2], TensorProto.INT64)
    onnx.save(b.model(name="tiny", ir_version=None), str(path))
    return path
