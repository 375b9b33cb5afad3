"""Models with symbolic dimensions through kiln's compile pipeline, as far as it goes.

The graph pipeline (fold-constants ... legalize-ops) runs on the symbolic module and
the legalized module, its kernels taking their dimensions as trailing scalars, still
computes what onnxruntime does at several sizes (run by the interpreter); the native
build for symbolic sizes and the build with the sizes pinned both match onnxruntime
(tests/dynamic/test_native_dynamic.py runs the symbolic build at many sizes).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.module import IRModule
from kiln.transform.pipeline import default_graph_pipeline
from support.dynamic_models import cnn, encoder, feeds, reference
from support.numerics import rel_l2

MODELS = {
    "encoder": (lambda: encoder(layers=1, width=32, heads=2, ffn=64),
                [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 7}]),
    "cnn": (lambda: cnn("batch"), [{"batch": 1}, {"batch": 3}]),
}


def _legalized(mod: IRModule) -> IRModule:
    for p in default_graph_pipeline().passes:
        if p.name == "lower-graph-to-tensor":
            break
        mod = p(mod)
    return mod


@pytest.mark.parametrize("name", MODELS)
def test_the_legalized_symbolic_module_matchesreference(name: str) -> None:
    build, sizes = MODELS[name]
    model = build()
    mod = _legalized(from_onnx(model))
    assert not [f for f in mod.graph_funcs()["main"].bindings
                if isinstance(f.value, kiln.ir.graph.Call)], "every operator legalized"
    for size in sizes:
        feed = feeds(model, size)
        actual = np.asarray(kiln.evaluate(mod, "main", *feed.values()))
        assert rel_l2(actual, reference(model, feed)) < 1e-4, size


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("name", MODELS)
def test_the_symbolic_and_the_pinned_build_agree_withreference(name: str,
                                                                 target: str) -> None:
    build, sizes = MODELS[name]
    model = build()
    pinned = sizes[-1]
    feed = feeds(model, pinned)
    expected = reference(model, feed)
    for mod in (from_onnx(model), from_onnx(model, shape_dict=pinned)):
        fn = kiln.compile(mod, target)["main"]
        assert rel_l2(np.asarray(fn(*feed.values())), expected) < 1e-4
