"""The model the bring-your-own-codegen tests compile (no backend imported here)."""

from __future__ import annotations

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.types import TensorType

W = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
B = np.array([0.5, -0.25, 0.125], dtype=np.float32)


H = TensorType((2, 3), "float32")


def op(name: str, *args: g.Expr, ty: TensorType = H) -> g.Call:
    # Operator calls built directly: the backend, not kiln.ops, gives them meaning.
    return g.Call(name, args, {}, ty)


def mlp_module() -> IRModule:
    """main(x: f32[2,4]) -> (tanh(relu(x @ W + B)), x @ W)."""
    ib = IRBuilder()
    with ib.function("main", attrs={"output_names": ("y", "h")}):
        x = ib.param("x", (2, 4), "float32")
        h = ib.emit(op("matmul", x, g.Constant(W, "w")), "h")
        hb = ib.emit(op("add", h, g.Constant(B, "b")), "hb")
        ib.emit(op("multiply", h, h), "unused")
        r = ib.emit(op("relu", hb), "r")
        y = ib.emit(op("tanh", r), "y")
        ib.ret(g.Tuple((y, h)))
    return ib.get()


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = x @ W
    return np.tanh(np.maximum(h + B, 0)), h


X = np.array([[1.0, -2.0, 0.5, 3.0], [0.25, 0.0, -1.5, 2.0]], dtype=np.float32)
