"""GatherND, ScatterND and Slice with symbolic dimensions (issue 23: GPT-2 exported with
dynamic axes failed with `gather_nd does not support symbolic dimensions`), and the
position-ids + causal-mask subgraph of HF GPT-2: one compile, three sizes, compared
with onnxruntime on llvm and c."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from symbolic_check import Feeds, check_vs_onnxruntime, const, f32, onnx_model

import kiln

INT_MAX = 2**63 - 1  # what exporters write for "to the end"


def _gather_nd() -> tuple[onnx.ModelProto, Feeds]:
    # batch_dims=1, one index per batch row picks a seq position (negative: from the end).
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", 1])
    model = onnx_model([helper.make_node("GatherND", ["x", "i"], ["o"], batch_dims=1)],
                       [f32("x", ["b", "s", 4]), i])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((b, s, 4)).astype(np.float32),
                "i": rng.integers(-s, s, size=(b, 1)).astype(np.int64)}
    return model, feeds


def _scatter_nd() -> tuple[onnx.ModelProto, Feeds]:
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", 2])
    model = onnx_model([helper.make_node("ScatterND", ["x", "i", "u"], ["o"])],
                       [f32("x", ["b", "s", 4]), i, f32("u", ["b", 4])])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        # Distinct (row, position) targets: ONNX leaves duplicates unordered.
        rows = rng.permutation(b)
        return {"x": rng.standard_normal((b, s, 4)).astype(np.float32),
                "i": np.stack([rows, rng.integers(-s, s, size=b)], 1).astype(np.int64),
                "u": rng.standard_normal((b, 4)).astype(np.float32)}
    return model, feeds


# (starts, ends, axes, steps) as exporters write them, along the symbolic axes b and s.
SLICES = [
    ([1, 0], [INT_MAX, -1], [1, 2], [1, 1]),   # x[:, 1:, :-1]
    ([-1], [-INT_MAX], [1], [-1]),             # x[:, ::-1]
    ([-1, 0], [-INT_MAX, INT_MAX], [0, 1], [-1, 2]),
    ([4], [0], [1], [-2]),                     # clamped start, exclusive end
    ([-2], [-5], [1], [-1]),                   # both from the end
    ([2], [1], [1], [1]),                      # empty
]


def _slices() -> tuple[onnx.ModelProto, Feeds]:
    nodes, inits = [], []
    for k, (starts, ends, axes, steps) in enumerate(SLICES):
        names = [f"{p}{k}" for p in ("st", "en", "ax", "sp")]
        inits += [const(n, np.array(v, np.int64))
                  for n, v in zip(names, (starts, ends, axes, steps), strict=True)]
        nodes.append(helper.make_node("Slice", ["x", *names], [f"o{k}"]))
    model = onnx_model(nodes, [f32("x", ["b", "s", 3])], inits, n_outputs=len(SLICES))

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((b, s, 3)).astype(np.float32)}
    return model, feeds


def _gpt2_positions_and_mask() -> tuple[onnx.ModelProto, Feeds]:
    """HF GPT-2's input side with batch and seq symbolic: position ids from
    Shape -> Gather(seq) -> Range -> Unsqueeze, token + position embeddings, and the
    causal mask `bias[:, :, k - q:k, :k]` of a constant [1, 1, 64, 64] buffer applied
    to the scores with Where."""
    rng = np.random.default_rng(2)
    vocab, width, positions = 50, 8, 64
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "axis0"], ["pos_ids"]),
        helper.make_node("Gather", ["wte", "ids"], ["tok"]),
        helper.make_node("Gather", ["wpe", "pos_ids"], ["pe"]),
        helper.make_node("Add", ["tok", "pe"], ["hidden"]),
        helper.make_node("Sub", ["seq", "seq"], ["start"]),  # key length - query length
        helper.make_node("Unsqueeze", ["start", "axis0"], ["start1"]),
        helper.make_node("Unsqueeze", ["seq", "axis0"], ["end1"]),
        helper.make_node("Slice", ["bias", "start1", "end1", "axis2"], ["rows"]),
        helper.make_node("Slice", ["rows", "zero1", "end1", "axis3"], ["mask"]),
        helper.make_node("Transpose", ["hidden"], ["hidden_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["hidden", "hidden_t"], ["scores"]),
        helper.make_node("Unsqueeze", ["scores", "axis1"], ["scores4"]),
        helper.make_node("Where", ["mask", "scores4", "masked"], ["o"]),
    ]
    inits = [const("one", np.int64(1)), const("zero", np.int64(0)),
             *(const(f"axis{k}", np.array([k], np.int64)) for k in range(4)),
             const("zero1", np.array([0], np.int64)),
             const("wte", rng.standard_normal((vocab, width)).astype(np.float32)),
             const("wpe", rng.standard_normal((positions, width)).astype(np.float32)),
             const("bias", np.tril(np.ones((positions, positions), bool))[None, None]),
             const("masked", np.float32(-1e4))]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    model = onnx_model(nodes, [ids], inits)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"ids": rng.integers(0, vocab, (b, s)).astype(np.int64)}
    return model, feeds


CASES: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "gather_nd": _gather_nd, "scatter_nd": _scatter_nd, "slice": _slices,
    "gpt2_positions_and_mask": _gpt2_positions_and_mask}


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_indexing_matches_onnxruntime(case: str, target: str) -> None:
    model, feeds = CASES[case]()
    check_vs_onnxruntime(model, feeds, target)


def test_gather_nd_symbolic_index_depth_is_refused() -> None:
    i = helper.make_tensor_value_info("i", TensorProto.INT64, ["b", "k"])
    model = onnx_model([helper.make_node("GatherND", ["x", "i"], ["o"])],
                       [f32("x", ["b", 4]), i])
    with pytest.raises(kiln.errors.KilnError, match="last dimension of indices"):
        kiln.frontend.from_onnx(model)


def test_negative_step_start_before_the_first_element_follows_onnx() -> None:
    # ONNX clamps a negative-step start to [0, n - 1] (Python's slices would give nothing):
    # x[-5:-10:-1] of 3 elements is [x[0]], in the static and the symbolic build alike.
    params = [const(n, np.array([v], np.int64))
              for n, v in (("st", -5), ("en", -10), ("ax", 1), ("sp", -1))]
    for shape in ([2, 3], ["b", "s"]):
        model = onnx_model([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["o"])],
                           [f32("x", shape)], params)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        got = kiln.compile(kiln.frontend.from_onnx(model), "llvm")["main"](x)
        np.testing.assert_array_equal(np.asarray(got), x[:, :1])
