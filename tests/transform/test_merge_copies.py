"""MergeCopies (kiln.transform.merge_copies): chains of reshapes and transposes become one
copy, a transposed matmul B is read in place; results against onnxruntime on llvm and c."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.transform.merge_copies import MergeCopies
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

RNG = np.random.default_rng(25)


def _ops(model: onnx.ModelProto) -> list[tuple[str, dict]]:
    """The graph ops of `model` after merge-copies, with their attributes."""
    main = MergeCopies()(from_onnx(model))["main"]
    assert isinstance(main, g.Function)
    return [(b.value.op, dict(b.value.attrs)) for b in main.bindings
            if isinstance(b.value, g.Call)]


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], kind: str,
           lib: Any = None) -> Any:
    """The library of `model` (`lib`, else compiled) after checking its outputs."""
    lib = lib if lib is not None else kiln.compile(from_onnx(model), Target(kind)).jit()
    got = lib["main"](*feeds.values())
    got = got if isinstance(got, (list, tuple)) else [got]
    for k, w in zip(got, onnxruntime_outputs(model, feeds), strict=True):
        np.testing.assert_allclose(k, w, rtol=1e-5, atol=1e-5)
    return lib


def _shuffle(channels: int, groups: int, h: int, w: int) -> onnx.ModelProto:
    """ShuffleNet's channel shuffle between two ReLUs; a second shuffle's view is also
    read by an Add, so that chain is not merged past it; a third shuffles a 1x1
    convolution's ReLU (folded into its weight: kiln.transform.channel_shuffles)."""
    gb = GraphBuilder()
    inp = gb.input("x", (1, channels, h, w))
    x = gb.op("Relu", inp)
    view = (1, groups, channels // groups, h, w)

    def shuffle(t: str) -> str:
        s = gb.op("Reshape", t, gb.const(np.array(view, np.int64)))
        s = gb.op("Transpose", s, perm=(0, 2, 1, 3, 4))
        return gb.op("Reshape", s, gb.const(np.array((1, channels, h, w), np.int64)))

    gb.node("Relu", [shuffle(x)], ["shuffled"])
    bias = gb.const(RNG.normal(size=channels).astype(np.float32))
    conv = gb.op("Conv", inp, gb.weight(channels, channels, 1, 1), bias)
    gb.node("Identity", [shuffle(gb.op("Relu", conv))], ["folded"])
    v = gb.op("Reshape", gb.op("Exp", x), gb.const(np.array(view, np.int64)))
    t = gb.op("Transpose", v, perm=(0, 2, 1, 3, 4))
    gb.node("Add", [gb.op("Transpose", v, perm=(0, 2, 1, 3, 4)), t], ["shared"])
    gb.output("shuffled", typed=False)
    gb.output("shared", typed=False)
    gb.output("folded", typed=False)
    return gb.model(check=False)


def test_channel_shuffle_is_one_copy() -> None:
    ops = [op for op, _ in _ops(_shuffle(6, 3, 2, 5))]
    # the convolution's shuffle is its weight's row order, no copy
    assert ops.count("reshape_transpose") == 1 and ops.count("conv2d") == 1
    # the shared view stays a reshape read by two transposes
    assert ops.count("reshape") == 1 and ops.count("transpose") == 2


# c once: the copies are the same tensor expressions on either backend
@pytest.mark.parametrize(("kind", "channels", "groups", "h", "w"),
                         [("llvm", 6, 3, 2, 5), ("c", 6, 3, 2, 5), ("llvm", 12, 4, 1, 1),
                          ("llvm", 10, 2, 3, 9)])
def test_channel_shuffle_matches_onnxruntime(kind: str, channels: int, groups: int, h: int,
                                             w: int) -> None:
    x = RNG.normal(size=(1, channels, h, w)).astype(np.float32)
    model = _shuffle(channels, groups, h, w)
    lib = _check(model, {"x": x}, kind)
    # the shuffled weight rows replay from the model's weights (Module.swap_weights)
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    for t in swapped.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(
                RNG.normal(size=tuple(t.dims)).astype(np.float32), t.name))
    lib.swap_weights(swapped)
    _check(swapped, {"x": x}, kind, lib)


def _attention(seq: int, heads: int, dim: int, k_perm: tuple[int, ...],
               scale: float | None = None) -> onnx.ModelProto:
    """Q @ K^T with both split into heads: K's transpose `k_perm` puts [heads, dim, seq]
    (then multiplied by `scale`, as torch's exporter splits attention's scale)."""
    gb = GraphBuilder()
    q, k = gb.input("q", (seq, heads * dim)), gb.input("k", (seq, heads * dim))
    split = gb.const(np.array((1, seq, heads, dim), np.int64))
    qh = gb.op("Transpose", gb.op("Reshape", q, split), perm=(0, 2, 1, 3))
    kh = gb.op("Transpose", gb.op("Reshape", k, split), perm=k_perm)
    if scale is not None:
        kh = gb.op("Mul", kh, gb.const(np.array(scale, np.float32)))
    gb.node("MatMul", [qh, kh], ["scores"])
    gb.output("scores", typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("scale", [None, 0.5])
def test_transposed_key_is_read_in_place(scale: float | None) -> None:
    ops = _ops(_attention(5, 2, 3, (0, 2, 3, 1), scale))
    (mm,) = [attrs for op, attrs in ops if op == "matmul"]
    assert mm.get("transpose_b") is True
    # each of Q and K: one reshape_transpose to [1, heads, seq, dim], no other copy
    assert sorted(op for op, _ in ops if op != "multiply") == [
        "matmul", "reshape_transpose", "reshape_transpose"]


def test_value_transpose_stays() -> None:
    """V's heads transpose keeps its rows: reading it with transpose_b would turn a copy
    of whole rows into a transpose of single elements."""
    ops = _ops(_attention(4, 2, 4, (0, 2, 1, 3)))  # [seq, dim] @ [seq, dim]: seq == dim
    (mm,) = [attrs for op, attrs in ops if op == "matmul"]
    assert "transpose_b" not in mm


@pytest.mark.parametrize("kind", ["llvm", "c"])
@pytest.mark.parametrize(("seq", "heads", "dim", "scale"), [(5, 2, 3, None), (1, 1, 8, 2.0),
                                                            (17, 3, 9, 0.25)])
def test_transposed_key_matches_onnxruntime(kind: str, seq: int, heads: int, dim: int,
                                            scale: float | None) -> None:
    feeds = {n: RNG.normal(size=(seq, heads * dim)).astype(np.float32) for n in ("q", "k")}
    _check(_attention(seq, heads, dim, (0, 2, 3, 1), scale), feeds, kind)


def test_transposes_compose_and_cancel() -> None:
    gb = GraphBuilder()
    x = gb.input("x", (2, 3, 4))
    t = gb.op("Transpose", gb.op("Transpose", x, perm=(1, 2, 0)), perm=(0, 2, 1))
    gb.node("Transpose", [gb.op("Transpose", x, perm=(2, 0, 1)), ], ["back"], perm=(1, 2, 0))
    gb.node("Relu", [t], ["moved"])
    gb.output("moved", typed=False)
    gb.output("back", typed=False)
    model = gb.model(check=False)
    ops = _ops(model)
    # (1, 2, 0) then (0, 2, 1): one transpose (1, 0, 2); the round trip: a reshape
    assert [(op, a.get("perm")) for op, a in ops if op != "relu"] == [
        ("transpose", (1, 0, 2)), ("reshape", None)]
    _check(model, {"x": RNG.normal(size=(2, 3, 4)).astype(np.float32)}, "llvm")


def _heads_over_batch(heads: int = 3, dim: int = 4) -> onnx.ModelProto:
    """An encoder's heads split and merge as torch exports them with batch and seq
    dynamic: Reshape by (0, 0, heads, dim) -> Transpose, a ReLU on the heads, then an
    identity Reshape, the Transpose back and the Reshape by (0, 0, heads*dim)."""
    gb = GraphBuilder()
    x = gb.input("x", ("batch", "seq", heads * dim))
    h = gb.op("Reshape", x, gb.const(np.array((0, 0, heads, dim), np.int64)))
    h = gb.op("Relu", gb.op("Transpose", h, perm=(0, 2, 1, 3)))
    h = gb.op("Reshape", h, gb.const(np.array((0, heads, 0, dim), np.int64)))
    h = gb.op("Transpose", h, perm=(0, 2, 1, 3))
    gb.node("Reshape", [h, gb.const(np.array((0, 0, heads * dim), np.int64))], ["merged"])
    gb.output("merged", typed=False)
    return gb.model(check=False)


def test_heads_over_a_symbolic_batch_are_one_copy_each() -> None:
    """The chains keep batch and seq as they are: one reshape_transpose each way, the
    symbolic sizes named by the input dimension they copy."""
    ops = _ops(_heads_over_batch())
    assert [op for op, _ in ops] == ["reshape_transpose", "relu", "reshape_transpose"]
    split, merge = (a for op, a in ops if op == "reshape_transpose")
    assert split["inner"] == (-2, -3, 3, 4) and split["shape"] == (-2, 3, -3, 4)
    assert merge["inner"] == (-2, 3, -4, 4) and merge["shape"] == (-2, -4, 12)


@pytest.fixture(scope="module", params=["llvm", "c"])
def heads_lib(request: pytest.FixtureRequest) -> kiln.runtime.PackedFunction:
    return kiln.compile(from_onnx(_heads_over_batch()), Target(request.param)).jit()["main"]


def test_heads_over_a_symbolic_batch_match_onnxruntime(
        heads_lib: kiln.runtime.PackedFunction) -> None:
    model = _heads_over_batch()
    for batch, seq in ((0, 5), (1, 5), (3, 7), (8, 2)):
        x = RNG.normal(size=(batch, seq, 12)).astype(np.float32)
        (want,) = onnxruntime_outputs(model, {"x": x})
        np.testing.assert_array_equal(heads_lib(x), want)


def test_unary_op_between_conv1d_views_reads_the_convolution() -> None:
    """A Conv1d is a 2-D convolution between views (kiln.frontend.onnx.converters.nn): the
    ReLU after the first one and the view into the second cancel, and the last ReLU moves
    before its view, which merges with the Transpose into one copy."""
    gb = GraphBuilder()
    y = gb.input("x", (1, 4, 6))
    for _ in range(2):
        w = RNG.standard_normal((4, 4, 3)).astype(np.float32)
        y = gb.op("Relu", gb.op("Conv", y, gb.const(w), pads=[1, 1]))
    gb.node("Transpose", [y], ["out"], perm=[0, 2, 1])
    gb.output("out", (1, 6, 4))
    ops = [op for op, _ in _ops(gb.model())]
    assert ops == ["reshape", "conv2d", "relu", "conv2d", "relu", "reshape_transpose"]
