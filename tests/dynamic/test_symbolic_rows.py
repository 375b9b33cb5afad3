"""Row kernels and reshapes with symbolic extents, through the native entry: softmax
over a symbolic row length (attention scores `[b, h, s, s]`), reshapes that split and
merge heads around a symbolic `s`, at several sizes against onnxruntime (llvm and c)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from support.graphs import GraphBuilder
from support.reference import ort_session


def _model() -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Softmax", ["x"], ["p"], axis=-1)
    b.node("Reshape", ["y", "split"], ["q"])
    b.node("Transpose", ["q"], ["r"], perm=[0, 2, 1, 3])
    b.node("Mul", ["r", "r"], ["r2"])
    b.node("Transpose", ["r2"], ["t"], perm=[0, 2, 1, 3])
    b.node("Reshape", ["t", "merge"], ["u"])
    b.input("x", ["b", "h", "s", "s"])
    b.input("y", ["b", "s", 64])
    b.output("p", ["b", "h", "s", "s"])
    b.output("u", ["b", "s", 64])
    b.consts({"split": np.array([0, 0, 4, 16], np.int64),
              "merge": np.array([0, 0, -1], np.int64)})
    return b.model(name="rows", ir_version=None)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_symbolic_rows_and_heads_at_several_sizes(target: str) -> None:
    model = _model()
    exe = kiln.compile(from_onnx(model), target)
    assert any(fn.attrs.get("kiln.row_kernel") == "softmax"
               for fn in exe.ir.prim_funcs().values()), \
        "softmax over a symbolic row length takes the hand-built row kernel"
    session = ort_session(model)
    rng = np.random.default_rng(0)
    for b, h, s in ((1, 2, 1), (2, 3, 7), (1, 2, 37), (3, 1, 16)):
        feed = {"x": rng.standard_normal((b, h, s, s)).astype(np.float32) * 4,
                "y": rng.standard_normal((b, s, 64)).astype(np.float32)}
        p, u = exe["main"](*feed.values())
        want_p, want_u = session.run(None, feed)
        np.testing.assert_allclose(p, want_p, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(u, want_u, rtol=1e-6)
