"""Models with symbolic dimensions through kiln's compile pipeline, as far as it goes.

The graph pipeline (fold-constants ... legalize-ops) runs on the symbolic module and
the legalized module, its kernels taking their dimensions as trailing scalars, still
computes what onnxruntime does at several sizes (run by the interpreter); the native
build for symbolic sizes and the build with the sizes pinned both match onnxruntime
(tests/dynamic/test_native_dynamic.py runs the symbolic build at many sizes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.module import IRModule
from kiln.transform.pipeline import default_graph_pipeline

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from dynamic_models import cnn, encoder, feeds

MODELS = {
    "encoder": (lambda: encoder(layers=1, width=32, heads=2, ffn=64),
                [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 7}]),
    "cnn": (lambda: cnn("batch"), [{"batch": 1}, {"batch": 3}]),
}


def _onnxruntime(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feed)[0])


def _legalized(mod: IRModule) -> IRModule:
    for p in default_graph_pipeline().passes:
        if p.name == "lower-graph-to-tensor":
            break
        mod = p(mod)
    return mod


def _rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


@pytest.mark.parametrize("name", MODELS)
def test_the_legalized_symbolic_module_matches_onnxruntime(name: str) -> None:
    build, sizes = MODELS[name]
    model = build()
    mod = _legalized(from_onnx(model))
    assert not [f for f in mod.graph_funcs()["main"].bindings
                if isinstance(f.value, kiln.ir.graph.Call)], "every operator legalized"
    for size in sizes:
        feed = feeds(model, size)
        actual = np.asarray(kiln.evaluate(mod, "main", *feed.values()))
        assert _rel_l2(actual, _onnxruntime(model, feed)) < 1e-4, size


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("name", MODELS)
def test_the_symbolic_and_the_pinned_build_agree_with_onnxruntime(name: str,
                                                                 target: str) -> None:
    build, sizes = MODELS[name]
    model = build()
    pinned = sizes[-1]
    feed = feeds(model, pinned)
    expected = _onnxruntime(model, feed)
    for mod in (from_onnx(model), from_onnx(model, shape_dict=pinned)):
        fn = kiln.compile(mod, target)["main"]
        assert _rel_l2(np.asarray(fn(*feed.values())), expected) < 1e-4
