"""The model set of zoo.py at full depth and width, compiled for `llvm` and `c`.

Each model is built at a reduced resolution / sequence length (zoo.ZOO[...].test),
run by onnxruntime, imported with `from_onnx`, compiled once per target and run;
every output must match onnxruntime's with a relative L2 error below 1e-4. The
lowered IR that went to codegen must survive a DSL round trip (print, parse,
structurally equal). DenseNet-121 compiles at half its depth (`REDUCED`).
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest
import zoo

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir.visitor import MAX_NESTING, nesting_depth
from kiln.script import from_source, print_module
from support.reference import onnxruntime_outputs, ort_session

TARGETS = ("llvm", "c")
MAX_REL_L2 = 1e-4
# Full-depth builds the c backend skips, with why: the suite's 15-minute budget.
LLVM_ONLY: dict[str, dict[str, str]] = {
    "densenet121": {"c": "densenet121's ops and concatenations are covered on c by squeezenet "
                         "and shufflenet at full depth; its c build alone is ~28 s of CI"},
    "inception": {"c": "inception's convolutions, concatenations and pools are covered on c "
                       "by squeezenet and resnet50 at full depth, LRN by the node suite's c "
                       "sample (tests/frontend); its c build is ~6 s of CI"},
    "efficientnet": {"c": "efficientnet's depthwise and pointwise convolutions are covered on "
                          "c by mobilenet_v2 at full depth, Mul by gpt2 and bert, Sigmoid by "
                          "the node suite's c sample; its c build is ~6 s of CI"},
}
# Models compiled at a reduced depth, with why (their layout test keeps the full depth).
# DenseNet-121's 120 convolutions each have their own shape (the input grows by 32
# channels a layer), so each is a kernel of its own: its llvm build was 45-56 s of CI,
# the longest test of the suite. Half of each dense block keeps every pattern: four
# blocks, the transitions, and concatenations of up to 13 inputs.
REDUCED: dict[str, dict[str, object]] = {"densenet121": {"blocks": (3, 6, 12, 8)}}

# Layer counts of each published architecture (node types of the ONNX graph).
LAYOUT: dict[str, dict[str, int]] = {
    "squeezenet": {"Conv": 26, "Concat": 8, "MaxPool": 3, "Dropout": 1},
    "inception": {"Conv": 57, "Concat": 9, "LRN": 2, "MaxPool": 13},
    "mobilenet_v2": {"Conv": 52, "Clip": 35, "Add": 10, "BatchNormalization": 52},
    "shufflenet": {"Conv": 49, "Transpose": 16, "Reshape": 32, "AveragePool": 3},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Add": 16, "Squeeze": 1},
    "densenet121": {"Conv": 120, "BatchNormalization": 121, "Concat": 58, "AveragePool": 3},
    "efficientnet": {"Conv": 81, "GlobalAveragePool": 17, "Sigmoid": 65, "Add": 9},
    "gpt2": {"MatMul": 6, "Split": 1, "Where": 1, "Tanh": 1, "ReduceMean": 6},
    "bert": {"LayerNormalization": 25, "Erf": 12, "Where": 12, "Softmax": 12, "MatMul": 96},
    "vit": {"Conv": 1, "Expand": 1, "LayerNormalization": 3, "Softmax": 1},
}


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def _group(name: str) -> pytest.MarkDecorator:
    """One xdist worker runs every test of model `name` (`make test` distributes with
    --dist loadgroup): the model is built and run by onnxruntime once (`case`, `_model`),
    not once per worker its tests land on (~5 s for BERT-base at full depth)."""
    return pytest.mark.xdist_group(f"zoo-{name}")


def _params() -> list[object]:
    return [pytest.param(name, marks=_group(name)) for name in zoo.ZOO]


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    """zoo.ZOO[name] at its test size, built once per process (callers do not modify it)."""
    return zoo.ZOO[name].model("test")


@pytest.fixture(scope="module", params=_params())
def case(request: pytest.FixtureRequest) -> tuple[str, onnx.ModelProto, dict, list]:
    name = request.param
    model = _model(name)
    feeds = zoo.example_inputs(model)
    return name, model, feeds, onnxruntime_outputs(model, feeds)


def test_model_has_the_published_layout(case) -> None:
    name, model, _, want = case
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == zoo.ZOO[name].opset
    counts = Counter(node.op_type for node in model.graph.node)
    for op_type, n in LAYOUT[name].items():
        assert counts[op_type] == n, f"{name}: {counts[op_type]} {op_type} nodes, expected {n}"
    for out, vi in zip(want, model.graph.output):
        assert list(out.shape) == [d.dim_value for d in vi.type.tensor_type.shape.dim]
        assert np.isfinite(out).all(), f"{name}: output {vi.name} is not finite"
        # activations stay O(1) through the full depth (probabilities: one per class)
        scale = float(np.abs(out).mean()) * (out.shape[-1] if vi.name == "probs" else 1)
        assert 1e-2 < scale < 1e2, f"{name}: output {vi.name} has mean |x| {scale}"


@pytest.mark.parametrize("target", TARGETS)
def test_model_matches_onnxruntime(case, target: str, capfd: pytest.CaptureFixture[str]
                                   ) -> None:
    name, model, feeds, want = case
    if target in LLVM_ONLY.get(name, ()):
        pytest.skip(LLVM_ONLY[name][target])
    if name in REDUCED:
        entry = zoo.ZOO[name]
        model = entry.build(**{**entry.test, **REDUCED[name]})
        feeds = zoo.example_inputs(model)
        want = onnxruntime_outputs(model, feeds)
    capfd.readouterr()
    ex = kiln.compile(from_onnx(model), target)
    # nothing on stderr: LLVM's remarks and warnings (e.g. "loop not vectorized", which a
    # vectorize hint on a loop LLVM may not vectorize printed) and the C compiler's go
    # to file descriptor 2, where no exception reports them
    assert capfd.readouterr().err == "", f"{name} on {target}: the compile printed to stderr"
    got = ex["main"](*feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w, vi in zip(got, want, model.graph.output):
        assert g.shape == w.shape
        error = rel_l2(g, w)
        assert error < MAX_REL_L2, f"{name} on {target}: output {vi.name} rel. L2 {error:.2e}"
    # the lowered module (weights by reference) prints and parses back unchanged
    text = print_module(ex.ir, metadata="reference")
    assert_structural_equal(from_source(text, metadata=text.metadata), ex.ir)
    # Generated IR stays shallow, far from the walkers' limit (kiln.ir.visitor).
    assert max(nesting_depth(f) for f in ex.ir.prim_funcs().values()) <= MAX_NESTING // 3


def test_opsets_9_to_17_all_appear() -> None:
    assert {e.opset for e in zoo.ZOO.values()} >= set(range(9, 18))


def test_example_attention_mask_hides_positions() -> None:
    feeds = zoo.example_inputs(zoo.bert(seq=8, batch=3, layers=1, vocab=16))
    mask = feeds["attention_mask"]
    assert mask[0].all() and not mask[-1].all()
    assert (feeds["input_ids"] < 16).all()


def _symbolic(model: onnx.ModelProto, axes: dict[int, str]) -> onnx.ModelProto:
    """`model` with its inputs' dims at `axes` named (dynamic axes, as exporters write
    them) and its outputs' shapes left to inference."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        for axis, name in axes.items():
            dim = vi.type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_param = name
    for vi in out.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return out


def _at_size(model: onnx.ModelProto, axes: dict[int, str],
             size: dict[str, int]) -> onnx.ModelProto:
    """What `zoo.example_inputs` reads of `model` built at `size` (its inputs, the
    vocabulary's table), without building the rest of its weights again."""
    out = onnx.ModelProto()
    out.graph.input.extend(model.graph.input)
    for vi in out.graph.input:
        for axis, name in axes.items():
            vi.type.tensor_type.shape.dim[axis].dim_value = size[name]
    out.graph.initializer.extend(i for i in model.graph.initializer if i.name.startswith("wte"))
    return out


@pytest.mark.slow  # runs first (tests/conftest.py)
@pytest.mark.parametrize(("name", "axes", "sizes"), [
    pytest.param("resnet50", {0: "batch"}, [{"batch": 1}, {"batch": 2}],
                 marks=_group("resnet50")),
    pytest.param("bert", {0: "batch", 1: "seq"},
                 [{"batch": 1, "seq": 16}, {"batch": 2, "seq": 9}], marks=_group("bert")),
])
def test_symbolic_sizes_at_full_depth(name: str, axes: dict[int, str],
                                      sizes: list[dict[str, int]]) -> None:
    """ResNet-50 with a symbolic batch and the 12-layer BERT-base encoder with symbolic
    (batch, seq): compiled once, run at two sizes, against onnxruntime."""
    model = _symbolic(_model(name), axes)
    main = kiln.compile(from_onnx(model), "llvm")["main"]
    session = ort_session(model)
    for size in sizes:
        feeds = zoo.example_inputs(_at_size(model, axes, size))
        got = main(*feeds.values())
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, session.run(None, feeds), strict=True):
            assert g.shape == w.shape
            assert rel_l2(g, w) < MAX_REL_L2, (name, size)
