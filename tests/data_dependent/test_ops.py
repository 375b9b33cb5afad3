"""NonZero, Compress and TopK with a run-time k against onnxruntime on llvm and c,
with empty results among the inputs; values computed downstream of a data-dependent
size (ReduceSum over NonZero, Gather with its indices); bad run-time values."""

from __future__ import annotations

import numpy as np
import pytest
from dd_check import check, model
from onnx import TensorProto, helper

import kiln
from kiln.errors import CallError

TARGETS = ["llvm", "c"]
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name: str, ty: int, shape: list[int | str]) -> object:
    return helper.make_tensor_value_info(name, ty, shape)


def _sparse(rng: np.random.Generator, shape: tuple[int, ...], keep: float) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x * (rng.random(shape) < keep)


@pytest.mark.parametrize("target", TARGETS)
def test_nonzero_and_what_follows(target: str) -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
             helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["nz"], ["f"], to=F),
             helper.make_node("Mul", ["f", "f"], ["sq"])]
    m = model(nodes, [_vi("x", F, [3, 5])], [("nz", I64), ("s", I64), ("t", I64), ("sq", F)])
    rng = np.random.default_rng(1)
    feeds = [{"x": _sparse(rng, (3, 5), 0.4)}, {"x": np.zeros((3, 5), np.float32)},
             {"x": np.ones((3, 5), np.float32)}]
    check(m, feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_nonzero_of_symbolic_input_then_gather(target: str) -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Gather", ["x", "nz"], ["g"], axis=0)]
    m = model(nodes, [_vi("x", F, ["n"])], [("g", F)])
    rng = np.random.default_rng(2)
    feeds = [{"x": _sparse(rng, (n,), 0.5)} for n in (1, 7, 30)]
    feeds.append({"x": np.zeros(4, np.float32)})
    check(m, feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_compress(target: str) -> None:
    nodes = [helper.make_node("Compress", ["x", "c"], ["flat"]),
             helper.make_node("Compress", ["x", "c"], ["rows"], axis=0),
             helper.make_node("Compress", ["x", "c3"], ["cols"], axis=-1)]
    m = model(nodes, [_vi("x", F, [4, 3]), _vi("c", B, [5]), _vi("c3", B, [2])],
              [("flat", F), ("rows", F), ("cols", F)])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    feeds = [{"x": x, "c": np.array([1, 0, 1, 1, 0], bool), "c3": np.array([0, 1], bool)},
             {"x": x, "c": np.zeros(5, bool), "c3": np.zeros(2, bool)},
             {"x": x, "c": np.array([0, 0, 0, 1, 1], bool), "c3": np.ones(2, bool)}]
    check(m, feeds, target)


def _topk_model() -> object:
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceSum", ["v"], ["s"], axes=[1], keepdims=0)]
    return model(nodes, [_vi("x", F, [2, 6]), _vi("k", I64, [1])],
                 [("v", F), ("i", I64)], opset=11)


@pytest.mark.parametrize("target", TARGETS)
def test_topk_with_run_time_k(target: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    feeds = [{"x": x, "k": np.array([k], np.int64)} for k in (0, 1, 4, 6)]
    check(_topk_model(), feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_topk_k_out_of_range_is_an_error(target: str) -> None:
    exe = kiln.compile(kiln.frontend.from_onnx(_topk_model()), target)
    x = np.zeros((2, 6), np.float32)
    for k in (7, -1):
        with pytest.raises(CallError, match=r"topk: k is out of range \[0, n\]"):
            exe["main"](x, np.array([k], np.int64))


def test_out_is_checked_against_the_bound_and_trimmed() -> None:
    m = model([helper.make_node("NonZero", ["x"], ["nz"])], [_vi("x", F, [6])], [("nz", I64)])
    exe = kiln.compile(kiln.frontend.from_onnx(m), "llvm")
    x = np.array([0, 2, 0, 3, 0, 0], np.float32)
    out = np.full((1, 6), -7, np.int64)
    got = exe["main"](x, out=out)
    np.testing.assert_array_equal(got, [[1, 3]])
    assert np.shares_memory(got, out)
    with pytest.raises(CallError, match=r"expected shape \[1, 6\], got \[1, 2\]"):
        exe["main"](x, out=np.zeros((1, 2), np.int64))
    sig = exe["main"].signature
    assert sig["results"][0]["shape"] == [1, 6]
    assert sig["runtime_dims"] == [{"name": "nonzero_nz", "bound": 6, "places": [
        {"result": 0, "axis": 1, "actual": "nonzero_nz"}]}]
    assert "      data-dependent nonzero_nz <= 6 (sizes result 0 axis 1)" in exe.inspect()


@pytest.mark.parametrize("target", TARGETS)
def test_nonzero_of_bool_and_int_inputs(target: str) -> None:
    nodes = [helper.make_node("NonZero", ["b"], ["nb"]), helper.make_node("NonZero", ["i"], ["ni"])]
    m = model(nodes, [_vi("b", B, [2, 3, 2]), _vi("i", TensorProto.INT32, [5])],
              [("nb", I64), ("ni", I64)])
    x = np.arange(12).reshape(2, 3, 2) % 3
    check(m, [{"b": x.astype(bool), "i": np.array([0, -3, 0, 0, 7], np.int32)},
              {"b": np.zeros((2, 3, 2), bool), "i": np.zeros(5, np.int32)}], target)
