"""Concatenations as output views (kiln.transform.concat_views): the kernels computing
a concat's inputs write into its output, against onnxruntime on llvm and c."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_CONCAT_AXIS
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

X = np.random.default_rng(5).normal(size=(1, 3, 4, 4)).astype(np.float32)


def _model() -> onnx.ModelProto:
    gb = GraphBuilder()
    x = gb.input("x", X.shape)
    a, b = gb.op("Relu", x), gb.op("Sigmoid", x)
    # channels at batch 1, both inputs computed here: views; `a` is read again after.
    # (Each concat is read twice: no elementwise consumer fuses it into its kernel.)
    def twice(concat: str, name: str) -> None:
        gb.node("Add", [gb.op("Neg", concat), gb.op("Exp", concat)], [name])

    twice(gb.op("Concat", a, b, axis=1), "views")
    gb.node("Add", [a, x], ["after"])
    # along H (not contiguous runs), with a graph input, with `b` already in a view
    twice(gb.op("Concat", gb.op("Exp", x), gb.op("Abs", x), axis=2), "rows")
    twice(gb.op("Concat", x, b, axis=1), "param")
    # the concat is the result: views of the output buffer
    gb.node("Concat", [gb.op("Tanh", x), gb.op("Softsign", x)], ["result"], axis=1)
    for name in ("views", "after", "rows", "param", "result"):
        gb.output(name, typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_concat_inputs_are_views_of_its_output(kind: str) -> None:
    model = _model()
    ex = kiln.compile(from_onnx(model), Target(kind))
    main = ex.ir["main"]
    assert isinstance(main, t.PrimFunc)
    concats = [s for s in iter_stmts(main.body) if isinstance(s, t.CallFunc)
               and ATTR_CONCAT_AXIS in ex.ir[s.func].attrs]
    assert len(concats) == 2  # along H, and with the graph input
    views = {d.buffer.name: (d.source.name, d.byte_offset) for d in iter_stmts(main.body)
             if isinstance(d, t.DeclBuffer) and d.source.name != "workspace"}
    piece = X.nbytes
    assert sorted(off for src, off in views.values() if src == "result") == [0, piece]
    assert sorted(off for src, off in views.values() if src not in ("result", "x")) == [0, piece]
    got = ex.jit()["main"](X)
    want = onnxruntime_outputs(model, {"x": X})
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-6)
