"""Five model families, compiled for `llvm` and `c`, against onnxruntime.

Each model is imported with `from_onnx`, compiled once per target, and run
through `jit()` and through `export_library` + `load_module`; the outputs must
match onnxruntime's with a relative L2 error below 1e-4. One library is also
loaded back in a fresh Python process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.runtime import load_module
from support import small_models as builders
from support.graphs import GraphBuilder
from support.reference import ort_session

TARGETS = ("llvm", "c")
MAX_REL_L2 = 1e-4


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.fixture(scope="module", params=list(builders.MODELS))
def model_case(request: pytest.FixtureRequest) -> tuple[str, object, dict, np.ndarray]:
    model = builders.MODELS[request.param]()
    feeds = builders.example_inputs(model)
    session = ort_session(model)
    (want,) = session.run(None, feeds)
    return request.param, model, feeds, want


@pytest.mark.parametrize("target", TARGETS)
def test_model_matches_onnxruntime(model_case, target: str, tmp_path) -> None:
    name, model, feeds, want = model_case
    mod = from_onnx(model)
    assert [p.name for p in mod["main"].params] == list(feeds)
    ex = kiln.compile(mod, target)
    args = list(feeds.values())

    jitted = ex.jit()["main"](*args)
    assert jitted.shape == want.shape
    assert rel_l2(jitted, want) < MAX_REL_L2, f"{name} on {target} through jit()"

    path = tmp_path / f"{name}_{target}.so"
    ex.export_library(path)
    loaded = load_module(path)["main"](*args)
    assert rel_l2(loaded, want) < MAX_REL_L2, f"{name} on {target} via export_library"
    np.testing.assert_array_equal(loaded, jitted)


# ResNet-18's first two stages (identity and projection shortcuts, batch norms on both):
# the whole network is a MODELS case above; these tests need its kinds of layers only.
SMALL_RESNET = (8, 16)


def test_exported_model_runs_in_a_fresh_process(tmp_path) -> None:
    model = builders.resnet18(widths=SMALL_RESNET)
    feeds = builders.example_inputs(model)
    session = ort_session(model)
    (want,) = session.run(None, feeds)
    path = tmp_path / "resnet.so"
    kiln.compile(from_onnx(model), "llvm").export_library(path)
    np.save(tmp_path / "image.npy", feeds["image"])
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["onnx"] = None          # the deploy side needs no onnx
        import numpy as np
        from kiln.runtime import load_module
        lib = load_module({str(path)!r})
        y = lib["main"](np.load({str(tmp_path / "image.npy")!r}))
        print(json.dumps(y.tolist()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=300)
    got = np.array(json.loads(proc.stdout), dtype=np.float32)
    assert rel_l2(got, want) < MAX_REL_L2


def test_models_import_without_leftover_shape_ops() -> None:
    # the transformer's Shape -> Gather -> Concat -> Reshape subgraphs fold away
    mod = from_onnx(builders.transformer())
    ops = {b.value.op for b in mod["main"].bindings if hasattr(b.value, "op")}
    assert "reshape" in ops
    assert not ops & {"shape", "gather", "concat"}


def test_shipped_models_are_what_make_models_builds() -> None:
    import importlib.util
    from pathlib import Path

    models_dir = Path(__file__).parents[2] / "models"
    spec = importlib.util.spec_from_file_location("make_models", models_dir / "make_models.py")
    assert spec is not None and spec.loader is not None
    make_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_models)
    total = 0
    for file_name, build in make_models.MODELS.items():
        path = models_dir / file_name
        assert path.read_bytes() == build().SerializeToString(), f"regenerate {path}"
        total += path.stat().st_size
    assert total < 2 * 1024 * 1024


@pytest.mark.parametrize("file_name", ["mlp.onnx", "tiny_cnn.onnx"])
def test_shipped_models_match_onnxruntime(file_name: str) -> None:
    from pathlib import Path

    path = Path(__file__).parents[2] / "models" / file_name
    session = ort_session(path)
    feeds = {i.name: np.random.default_rng(5).normal(0, 1, i.shape).astype(np.float32)
             for i in session.get_inputs()}
    (want,) = session.run(None, feeds)
    got = kiln.compile(from_onnx(path), "llvm")["main"](*feeds.values())
    assert rel_l2(got, want) < MAX_REL_L2


def test_batchnorm_folding_in_the_graph_pipeline() -> None:
    from kiln.transform import Sequential
    from kiln.transform.fold_batchnorm import FoldBatchNorm
    from kiln.transform.fold_constants import FoldConstants
    from kiln.transform.pipeline import default_graph_pipeline

    model = builders.resnet18(widths=SMALL_RESNET)
    feeds = builders.example_inputs(model)
    (want,) = ort_session(model).run(None, feeds)
    mod = from_onnx(model)
    folded = FoldConstants()(FoldBatchNorm()(mod))
    ops = [b.value.op for b in folded["main"].bindings]
    assert "multiply" not in ops   # every BatchNormalization merged into its conv
    pipeline = Sequential([FoldBatchNorm(), FoldConstants(), default_graph_pipeline()])
    got = kiln.compile(mod, "llvm", graph_pipeline=pipeline)["main"](*feeds.values())
    assert rel_l2(got, want) < MAX_REL_L2


def test_compiled_functions_keep_the_onnx_input_and_output_names() -> None:
    b = GraphBuilder()
    b.node("Relu", ["input.1"], ["out:0"])
    b.node("Neg", ["input.1"], ["second"])
    b.input("input.1", [3])
    b.output("out:0", [3])
    b.output("second", [3])
    model = b.model(opset=13, ir_version=None)
    lib = kiln.compile(from_onnx(model), "llvm").jit()
    sig = lib.metadata["functions"]["main"]
    assert [p["name"] for p in sig["params"]] == ["input.1"]
    assert [r["name"] for r in sig["results"]] == ["out:0", "second"]
    x = np.array([-1, 2, -3], np.float32)
    relu, neg = lib["main"](**{"input.1": x})
    np.testing.assert_array_equal(relu, [0, 2, 0])
    np.testing.assert_array_equal(neg, -x)
