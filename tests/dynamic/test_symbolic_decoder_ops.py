"""Decoder patterns with symbolic dimensions (issue 23): attention over a key/value cache
whose length `past + seq` no input has (the causal mask is built from Range over that
sum, the keys are the past and present concatenated), and grouped-query attention's
Expand/Reshape of key/value heads. One compile, three sizes, compared with onnxruntime
on llvm and c."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
import pytest
from onnx import helper
from symbolic_check import Feeds, check_vs_onnxruntime, const, f32, onnx_model

import kiln

node = helper.make_node


def _attention_after_cache() -> tuple[onnx.ModelProto, Feeds]:
    """Scores of new queries `q` [b, 2, s, 4] against the cache `past_k` [b, 2, p, 4]
    followed by the new keys `k`; the causal mask compares key positions
    Range(0, p + s) with query positions Range(p, p + s), as GPT-2 and Llama export it."""
    nodes = [node("Concat", ["past_k", "k"], ["keys"], axis=2),
             node("Shape", ["past_k"], ["ps"]), node("Gather", ["ps", "two"], ["p"]),
             node("Shape", ["q"], ["qs"]), node("Gather", ["qs", "two"], ["s"]),
             node("Add", ["p", "s"], ["total"]),
             node("Range", ["zero", "total", "one"], ["kv_pos"]),
             node("Range", ["p", "total", "one"], ["q_pos"]),
             node("Unsqueeze", ["q_pos", "last"], ["q_col"]),
             node("LessOrEqual", ["kv_pos", "q_col"], ["allowed"]),
             node("Transpose", ["keys"], ["keys_t"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "keys_t"], ["scores"]),
             node("Where", ["allowed", "scores", "masked"], ["masked_scores"]),
             node("Softmax", ["masked_scores"], ["o0"], axis=-1),
             node("Cast", ["kv_pos"], ["o1"], to=onnx.TensorProto.FLOAT)]
    inits = [const("zero", np.int64(0)), const("one", np.int64(1)), const("two", np.int64(2)),
             const("last", [1]), const("masked", np.float32(-1e9))]
    model = onnx_model(nodes, [f32("q", ["b", 2, "s", 4]), f32("k", ["b", 2, "s", 4]),
                               f32("past_k", ["b", 2, "p", 4])], inits, n_outputs=2)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"q": rng.standard_normal((b, 2, s, 4)).astype(np.float32),
                "k": rng.standard_normal((b, 2, s, 4)).astype(np.float32),
                "past_k": rng.standard_normal((b, 2, s + b, 4)).astype(np.float32)}
    return model, feeds


def _grouped_query_heads() -> tuple[onnx.ModelProto, Feeds]:
    """Llama's repeat_kv: [b, 2, s, 4] -> [b, 2, 3, s, 4] (Expand to a target from a
    Shape subgraph) -> [b, 6, s, 4], then the queries' scores against those keys."""
    nodes = [node("Unsqueeze", ["kv", "axis2"], ["kv5"]),
             node("Shape", ["kv"], ["kvs"]),
             node("Gather", ["kvs", "i0"], ["b"]), node("Gather", ["kvs", "i2"], ["s"]),
             node("Concat", ["b", "heads_kv", "rep", "s", "dim"], ["target5"], axis=0),
             node("Expand", ["kv5", "target5"], ["kv_rep"]),
             node("Concat", ["b", "heads", "s", "dim"], ["target4"], axis=0),
             node("Reshape", ["kv_rep", "target4"], ["keys"]),
             node("Transpose", ["keys"], ["keys_t"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "keys_t"], ["o"])]
    inits = [const("axis2", [2]), const("i0", [0]), const("i2", [2]), const("heads_kv", [2]),
             const("rep", [3]), const("dim", [4]), const("heads", [6])]
    model = onnx_model(nodes, [f32("q", ["b", 6, "s", 4]), f32("kv", ["b", 2, "s", 4])], inits)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"q": rng.standard_normal((b, 6, s, 4)).astype(np.float32),
                "kv": rng.standard_normal((b, 2, s, 4)).astype(np.float32)}
    return model, feeds


def _fill_of_twice_a_size() -> tuple[onnx.ModelProto, Feeds]:
    # ConstantOfShape [s*2, 3]: s*2 is no input's size, but the sum s + s is.
    nodes = [node("Shape", ["x"], ["sh"]), node("Mul", ["sh", "two"], ["twice"]),
             node("ConstantOfShape", ["twice"], ["o"],
                  value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.5]))]
    model = onnx_model(nodes, [f32("x", ["s", 3])], [const("two", np.int64([2, 1]))])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((s, 3)).astype(np.float32)}
    return model, feeds


CASES: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "attention_after_cache": _attention_after_cache,
    "grouped_query_heads": _grouped_query_heads,
    "fill_of_twice_a_size": _fill_of_twice_a_size}


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_decoder_pattern_matches_onnxruntime(case: str, target: str) -> None:
    model, feeds = CASES[case]()
    check_vs_onnxruntime(model, feeds, target)


def test_a_size_that_is_no_sum_of_input_sizes_is_refused_with_the_pin_hint() -> None:
    # Range(0, s*s): s*s is a product, not a sum of sizes some input has.
    nodes = [node("Shape", ["x"], ["sh"]), node("Gather", ["sh", "zero"], ["s"]),
             node("Mul", ["s", "s"], ["square"]),
             node("Range", ["zero", "square", "one"], ["o"], name="positions")]
    model = onnx_model(nodes, [f32("x", ["s", 3])],
                       [const("zero", np.int64(0)), const("one", np.int64(1))],
                       out_type=onnx.TensorProto.INT64)
    with pytest.raises(kiln.errors.FrontendError,
                       match=r"node 'positions' \(Range\): the size s\*s is no input's dimension "
                             r"\(nor a sum of them\): kiln cannot make a tensor of shape "
                             r"\[s\*s\]; pin s with shape_dict=\{\"s\": 128\} "
                             r"\(CLI: kiln compile \.\.\. --shape s=128\)"):
        kiln.frontend.from_onnx(model)
