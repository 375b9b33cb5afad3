"""Expand, Tile, Range, Where and CumSum with symbolic dimensions, in the patterns
exporters write (issue 23): one compile per model, three sizes, compared with
onnxruntime on llvm and c."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from symbolic_check import Feeds, check_vs_onnxruntime, const, f32, onnx_model

import kiln

node = helper.make_node


def _i64(name: str, shape: list[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT64, shape)


def _expand() -> tuple[onnx.ModelProto, Feeds]:
    # The target shape comes from a Shape subgraph: [batch, 4, s] from y's batch and x's s.
    nodes = [node("Shape", ["y"], ["y_shape"]), node("Gather", ["y_shape", "first"], ["batch"]),
             node("Shape", ["x"], ["x_shape"]), node("Slice", ["x_shape", "last", "end"], ["s"]),
             node("Concat", ["batch", "four", "s"], ["target"], axis=0),
             node("Expand", ["x", "target"], ["o"])]
    inits = [const("first", [0]), const("four", [4]), const("last", [-1]),
             const("end", [2**63 - 1])]
    model = onnx_model(nodes, [f32("x", [1, 1, "s"]), f32("y", ["b", 2])], inits)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((1, 1, s)).astype(np.float32),
                "y": rng.standard_normal((b, 2)).astype(np.float32)}
    return model, feeds


def _tile() -> tuple[onnx.ModelProto, Feeds]:
    model = onnx_model([node("Tile", ["x", "repeats"], ["o"])], [f32("x", ["b", "s"])],
                       [const("repeats", [2, 3])])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((b, s)).astype(np.float32)}
    return model, feeds


def _tile_by_batch() -> tuple[onnx.ModelProto, Feeds]:
    # Whisper's position ids: [1, s] tiled by [batch, 1] (and a static count on top).
    nodes = [node("Shape", ["y"], ["y_shape"]), node("Gather", ["y_shape", "first"], ["batch"]),
             node("Concat", ["batch", "two"], ["repeats"], axis=0),
             node("Tile", ["x", "repeats"], ["o"])]
    model = onnx_model(nodes, [f32("x", [1, "s"]), f32("y", ["b", 2])],
                       [const("first", [0]), const("two", [2])])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"x": rng.standard_normal((1, s)).astype(np.float32),
                "y": rng.standard_normal((b, 2)).astype(np.float32)}
    return model, feeds


def _range_after_cache() -> tuple[onnx.ModelProto, Feeds]:
    # GPT-2 with past key/values: position ids Range(past, past + seq, 1).
    nodes = [node("Shape", ["past"], ["past_shape"]),
             node("Gather", ["past_shape", "two"], ["past_len"]),
             node("Shape", ["ids"], ["ids_shape"]), node("Gather", ["ids_shape", "one"], ["seq"]),
             node("Add", ["past_len", "seq"], ["total"]),
             node("Range", ["past_len", "total", "one"], ["o"])]
    inits = [const("one", np.int64(1)), const("two", np.int64(2))]
    model = onnx_model(nodes, [_i64("ids", ["b", "s"]), f32("past", ["b", 2, "p", 4])], inits,
                       out_type=TensorProto.INT64)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"ids": rng.integers(0, 9, (b, s)).astype(np.int64),
                "past": rng.standard_normal((b, 2, s + 2, 4)).astype(np.float32)}
    return model, feeds


def _where_mask() -> tuple[onnx.ModelProto, Feeds]:
    # An attention mask [b, s] broadcast against scores [b, s, s].
    nodes = [node("Equal", ["mask", "zero"], ["pad"]),
             node("Unsqueeze", ["pad", "axis1"], ["pad3"]),
             node("Where", ["pad3", "masked", "scores"], ["o"])]
    inits = [const("zero", np.int64(0)), const("axis1", [1]), const("masked", np.float32(-1e4))]
    model = onnx_model(nodes, [_i64("mask", ["b", "s"]), f32("scores", ["b", "s", "s"])], inits)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"mask": rng.integers(0, 2, (b, s)).astype(np.int64),
                "scores": rng.standard_normal((b, s, s)).astype(np.float32)}
    return model, feeds


def _cumsum_positions() -> tuple[onnx.ModelProto, Feeds]:
    # RoBERTa's position ids from the padding mask: cumsum(mask, -1) * mask, in int64,
    # and a reverse exclusive float cumsum along the symbolic batch axis.
    nodes = [node("Not", ["pad"], ["keep"]),
             node("Cast", ["keep"], ["keep_i"], to=TensorProto.INT64),
             node("CumSum", ["keep_i", "last"], ["count"]),
             node("Mul", ["count", "keep_i"], ["o0"]),
             node("CumSum", ["x", "first"], ["o1"], reverse=1, exclusive=1)]
    inits = [const("last", np.int64(-1)), const("first", np.int32(0))]
    pad = helper.make_tensor_value_info("pad", TensorProto.BOOL, ["b", "s"])
    model = onnx_model(nodes, [pad, f32("x", ["b", "s"])], inits, n_outputs=2)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"pad": rng.integers(0, 2, (b, s)).astype(bool),
                "x": rng.standard_normal((b, s)).astype(np.float32)}
    return model, feeds


CASES: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "expand": _expand, "tile": _tile, "tile_by_batch": _tile_by_batch,
    "range_after_cache": _range_after_cache,
    "where_mask": _where_mask, "cumsum_positions": _cumsum_positions}


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_shape_op_matches_onnxruntime(case: str, target: str) -> None:
    model, feeds = CASES[case]()
    check_vs_onnxruntime(model, feeds, target)


def test_range_with_a_length_no_input_has_is_refused_by_name() -> None:
    # Range(1, seq, 2) has length seq//2: no input holds it, so kiln cannot shape it.
    nodes = [node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "one"], ["seq"]),
             node("Range", ["one", "seq", "two"], ["o"])]
    model = onnx_model(nodes, [f32("x", ["b", "s"])],
                       [const("one", np.int64(1)), const("two", np.int64(2))],
                       out_type=TensorProto.INT64)
    with pytest.raises(kiln.errors.FrontendError, match=r"Range.*s//2"):
        kiln.frontend.from_onnx(model)
