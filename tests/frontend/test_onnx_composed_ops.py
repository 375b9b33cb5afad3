"""ONNX operators kiln imports as compositions (kiln/frontend/onnx/converters/sampling.py,
kiln/frontend/onnx/converters/composed.py) against onnxruntime on random data larger
than the node suite's, compiled for llvm (one module per batch, through
node_suite.run_compiled)."""

from __future__ import annotations

import itertools
from typing import Any

import node_suite as ns
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import ort_session


def _case(name: str, node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int,
          consts: dict[str, np.ndarray] | None = None, domain: str = "") -> ns.Case:
    """A node-suite Case whose expected outputs are onnxruntime's."""
    b = GraphBuilder()
    b.add(node)
    b.inputs_for(feeds)
    for o in node.output:
        b.output(o, typed=False)
    b.consts(consts or {})
    imports = {domain: opset, **({"": 21} if domain else {})}
    model = b.model(opset=imports, name=name, ir_version=10, check=False)
    want = ort_session(model).run(None, feeds)
    return ns.Case(name, model, feeds, tuple(want), frozenset([node.op_type]), opset)


def _grid_sample_cases() -> list[ns.Case]:
    rng = np.random.default_rng(0)
    cases = []
    for mode, padding, align in itertools.product(("linear", "nearest", "cubic"),
                                                  ("zeros", "border", "reflection"), (0, 1)):
        node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode,
                                padding_mode=padding, align_corners=align)
        # coordinates beyond [-1, 1] exercise the padding modes (reflection several times)
        feeds = {"x": rng.normal(size=(2, 3, 5, 7)).astype(np.float32),
                 "grid": rng.uniform(-2.6, 2.6, (2, 4, 6, 2)).astype(np.float32)}
        cases.append(_case(f"grid_sample_{mode}_{padding}_{align}", node, feeds, 22))
    for mode in ("linear", "nearest"):
        node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode,
                                padding_mode="border")
        feeds = {"x": rng.normal(size=(1, 2, 3, 4, 5)).astype(np.float32),
                 "grid": rng.uniform(-1.3, 1.3, (1, 2, 3, 4, 3)).astype(np.float32)}
        cases.append(_case(f"grid_sample_3d_{mode}", node, feeds, 22))
    # DeformConv: 2 groups, 2 offset groups, strides, dilations, pads, mask and bias;
    # offsets up to 2.5 pixels push taps outside X
    node = helper.make_node("DeformConv", ["x", "w", "off", "b", "m"], ["y"],
                            kernel_shape=[3, 2], group=2, offset_group=2, strides=[2, 1],
                            dilations=[1, 2], pads=[1, 0, 1, 1])
    out_h, out_w = (7 + 2 - 3) // 2 + 1, (6 + 1 - 3) // 1 + 1
    feeds = {"x": rng.normal(size=(2, 4, 7, 6)).astype(np.float32),
             "w": rng.normal(size=(6, 2, 3, 2)).astype(np.float32),
             "off": rng.uniform(-2.5, 2.5, (2, 2 * 2 * 6, out_h, out_w)).astype(np.float32),
             "b": rng.normal(size=6).astype(np.float32),
             "m": rng.uniform(0, 1, (2, 2 * 6, out_h, out_w)).astype(np.float32)}
    cases.append(_case("deform_conv", node, feeds, 22))
    return cases


def _other_cases() -> list[ns.Case]:
    rng = np.random.default_rng(1)
    cases = []
    for mode, writes in (("linear", [0, 3]), ("circular", [5, 2])):
        node = helper.make_node("TensorScatter", ["cache", "update", "w"], ["out"], mode=mode)
        feeds = {"cache": rng.normal(size=(2, 3, 6, 4)).astype(np.float32),
                 "update": rng.normal(size=(2, 3, 3, 4)).astype(np.float32),
                 "w": np.array(writes, np.int64)}
        cases.append(_case(f"tensor_scatter_{mode}", node, feeds, 24))
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[2, 1],
                            pads=[1, 0, 0, 2], dilations=[1, 2])
    # image 7x6, block 3x2: positions ((7+1-3)//2+1) x ((6+2-3)//1+1) = 3 x 6
    feeds = {"x": rng.normal(size=(2, 2 * 6, 18)).astype(np.float32)}
    cases.append(_case("col2im", node, feeds, 18, {"image": np.array([7, 6], np.int64),
                                                   "block": np.array([3, 2], np.int64)}))
    cases.append(_max_unpool_case(rng))
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.25)
    cases.append(_case("binarizer", node, {"x": rng.normal(size=(3, 5)).astype(np.float32)},
                       1, domain="ai.onnx.ml"))
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    cases.append(_case("array_feature_extractor", node,
                       {"x": rng.normal(size=(2, 3, 5)).astype(np.float32),
                        "i": np.array([4, 0, 4], np.int64)}, 1, domain="ai.onnx.ml"))
    node = helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["y"])
    cases.append(_case("mel_weight_matrix", node, {}, 17, {
        "bins": np.array(12, np.int64), "dft": np.array(128, np.int64),
        "rate": np.array(16000, np.int64), "low": np.array(30.0, np.float32),
        "high": np.array(7600.0, np.float32)}))
    for n in (3, 4):
        cases.append(_case(f"det_{n}", helper.make_node("Det", ["x"], ["y"]),
                           {"x": rng.normal(size=(2, 3, n, n)).astype(np.float32)}, 22))
    pool = {"pool_int64s": [1, 4, 7, 2, 3, 1, 4, 4, 2, 7, 7], "ngram_counts": [0, 3],
            "ngram_indexes": [2, 0, 5, 1, 3, 6, 4]}  # 3 unigrams, 4 bigrams
    for mode, lengths in (("TF", (1, 2)), ("IDF", (1, 2)), ("TFIDF", (2, 2))):
        node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode=mode,
                                min_gram_length=lengths[0], max_gram_length=lengths[1],
                                max_skip_count=2, weights=[0.5, 1.5, 2.0, 0.25, 3.0, 1.0, 4.0],
                                **pool)
        cases.append(_case(f"tfidf_{mode}", node,
                           {"x": rng.choice([1, 2, 4, 7, 9], (3, 9)).astype(np.int64)}, 9))
    for name, shape, attrs in (
            ("2d", (2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1],
                                  "pads": [1, 0, 1, 1], "dilations": [1, 2]}),
            ("2d_storage_order_ceil", (1, 2, 6, 5), {"kernel_shape": [2, 2], "strides": [2, 2],
                                                     "storage_order": 1, "ceil_mode": 1}),
            ("1d", (2, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
            ("3d", (1, 2, 4, 5, 3), {"kernel_shape": [2, 2, 2], "pads": [0, 1, 0, 1, 0, 1]})):
        node = helper.make_node("MaxPool", ["x"], ["v", "i"], **attrs)
        # few distinct values: ties inside windows check the first-maximum rule
        feeds = {"x": rng.integers(0, 4, shape).astype(np.float32)}
        cases.append(_case(f"max_pool_indices_{name}", node, feeds, 22))
    for aggregate in (0, 1):  # AVERAGE, SUM
        node = helper.make_node(
            "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=3,
            aggregate_function=aggregate, tree_roots=[0, 2],
            nodes_featureids=[0, 2, 1, 0], nodes_truenodeids=[1, 1, 3, 4],
            nodes_trueleafs=[0, 1, 1, 1], nodes_falsenodeids=[0, 2, 3, 5],
            nodes_falseleafs=[1, 1, 0, 1], nodes_missing_value_tracks_true=[0, 1, 0, 0],
            nodes_modes=numpy_helper.from_array(np.array([0, 3, 6, 5], np.uint8)),
            nodes_splits=numpy_helper.from_array(np.array([0.1, -0.3, 0, 2], np.float32)),
            membership_values=numpy_helper.from_array(np.array([1, 3, np.nan], np.float32)),
            leaf_targetids=[0, 1, 2, 0, 1, 2],
            leaf_weights=numpy_helper.from_array(rng.normal(size=6).astype(np.float32)))
        x = rng.choice(np.array([-1, 0, 1, 2, 3, np.nan], np.float32), (10, 3))
        cases.append(_case(f"tree_ensemble_{aggregate}", node, {"x": x}, 5,
                           domain="ai.onnx.ml"))
    return cases


def _max_unpool_case(rng: Any) -> ns.Case:
    """MaxUnpool of onnxruntime's MaxPool values and indices, to a larger output_shape."""
    pool = helper.make_node("MaxPool", ["x"], ["v", "i"], kernel_shape=[2, 2], strides=[2, 2])
    b = GraphBuilder()
    b.add(pool)
    b.input("x", [2, 3, 6, 4])
    b.output("v", typed=False)
    b.output("i", typed=False)
    model = b.model(opset=22, name="p", ir_version=10, check=False)
    v, i = ort_session(model).run(
        None, {"x": rng.normal(size=(2, 3, 6, 4)).astype(np.float32)})
    node = helper.make_node("MaxUnpool", ["v", "i", "shape"], ["y"], kernel_shape=[2, 2],
                            strides=[2, 2])
    return _case("max_unpool", node, {"v": v, "i": i}, 22,
                 {"shape": np.array([2, 3, 7, 5], np.int64)})


@pytest.mark.parametrize("make", [_grid_sample_cases, _other_cases])
def test_composed_ops_match_onnxruntime_compiled(make: Any) -> None:
    cases = make()
    outcomes = ns.run_compiled(cases, "llvm", batch=len(cases))
    bad = [f"{o.name}: {o.reason}" for o in outcomes if o.status != "pass"]
    assert len(outcomes) == len(cases) and not bad, "\n".join(bad)


def _model(node: onnx.NodeProto, inputs: dict[str, list[Any]], opset: int,
           consts: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(node)
    for k, s in inputs.items():
        b.input(k, s)
    for o in node.output:
        b.output(o, typed=False)
    b.consts(consts or {})
    return b.model(opset=opset, ir_version=None, check=False)


@pytest.mark.parametrize("model, message", [
    (_model(helper.make_node("GridSample", ["x", "g"], ["y"], name="gs"),
            {"x": [1, 2, 4, 4], "g": [1, 3, 3, 3]}, 22),
     r"node 'gs' \(GridSample\): GridSample: grid \(1, 3, 3, 3\) does not fit X"),
    (_model(helper.make_node("GridSample", ["x", "g"], ["y"], name="gs", mode="area"),
            {"x": [1, 2, 4, 4], "g": [1, 3, 3, 2]}, 22),
     r"GridSample: mode 'area'.*known: linear, bilinear, nearest, cubic, bicubic"),
    (_model(helper.make_node("GridSample", ["x", "g"], ["y"], name="gs"),
            {"x": ["n", 2, 4, 4], "g": ["n", 3, 3, 2]}, 22),
     r"GridSample needs static shapes"),
    (_model(helper.make_node("Col2Im", ["x", "im", "b"], ["y"], name="c2i"),
            {"x": [1, 5, 4]}, 18, {"im": np.array([3, 3]), "b": np.array([2, 2])}),
     r"node 'c2i' \(Col2Im\): Col2Im: input dimension 1 \(5\) is not a multiple of the "
     r"block size 4"),
    (_model(helper.make_node("Col2Im", ["x", "im", "b"], ["y"], name="c2i"),
            {"x": [1, 4, 5]}, 18, {"im": np.array([3, 3]), "b": np.array([2, 2])}),
     r"Col2Im: input has 5 block positions, the attributes give 4"),
    (_model(helper.make_node("TensorScatter", ["c", "u"], ["y"], name="ts", axis=0),
            {"c": [2, 4, 3], "u": [2, 1, 3]}, 24),
     r"node 'ts' \(TensorScatter\): TensorScatter: axis 0 must name a non-batch axis"),
    (_model(helper.make_node("TensorScatter", ["c", "u"], ["y"], name="ts"),
            {"c": [2, 4, 3], "u": [2, 5, 3]}, 24),
     r"TensorScatter: update \(2, 5, 3\) does not fit cache \(2, 4, 3\)"),
    (_model(helper.make_node("Det", ["x"], ["y"], name="det"), {"x": [5, 5]}, 22),
     r"node 'det' \(Det\): Det: kiln computes determinants of matrices up to 4x4"),
])
def test_bad_composed_op_nodes_are_frontend_errors(model: onnx.ModelProto, message: str
                                                   ) -> None:
    with pytest.raises(FrontendError, match=message):
        from_onnx(model, check=False)  # kiln's own checks (onnx's checker catches most too)
