"""The fast call path of graph functions: prebuilt arguments, same results, same checks.

A graph function whose arguments are all tensors packs them from `ArgumentSlots`
built once (kiln/runtime/call_slots.py). These tests make sure that path is the
one taken, that it computes what the general path computes, that concurrent
calls each write their own slots, and that every call it declines still gets
the general path's checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import CallError
from kiln.runtime import Module, NativeFunction
from kiln.runtime import function as fc
from support import handmade_lib as hm
from support.graphs import GraphBuilder
from support.reference import ort_session

F32 = np.float32


def test_exact_calls_take_the_fast_path(hand_lib: Module,
                                        forbid_packing: Callable[[], None]) -> None:
    forbid_packing()
    x = np.arange(4, dtype=F32)
    np.testing.assert_array_equal(hand_lib["main"](x), hm.reference("main", x))
    out = np.full(4, np.nan, F32)
    assert hand_lib["main"](x, out=out) is out
    np.testing.assert_array_equal(out, hm.reference("main", x))
    a, b = hand_lib["split"](np.arange(3))
    np.testing.assert_array_equal(a, [1, 2, 3])
    np.testing.assert_array_equal(b, [0, 0.5, 1])
    outs = (np.zeros(3, np.int64), np.zeros(3, np.float64))
    assert hand_lib["split"](np.arange(3, 6), out=outs) is outs
    np.testing.assert_array_equal(outs[0], [4, 5, 6])


def test_read_only_inputs_take_the_fast_path(hand_lib: Module,
                                             forbid_packing: Callable[[], None]) -> None:
    forbid_packing()
    x = np.arange(4, dtype=F32)
    x.flags.writeable = False
    np.testing.assert_array_equal(hand_lib["main"](x), hm.reference("main", x))


@pytest.mark.parametrize("x", [
    np.arange(8, dtype=F32)[::2],                    # strided: copied
    np.arange(4, dtype=F32).astype(np.float32, order="C")[::-1],  # negative stride
])
def test_declined_calls_still_compute_the_right_result(hand_lib: Module, x: np.ndarray) -> None:
    np.testing.assert_array_equal(hand_lib["main"](x), hm.reference("main", x))


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((np.zeros(5, F32),), {}, "main: argument 0 'x': expected shape [4], got [5]"),
    ((np.zeros(4, np.float64),), {}, "main: argument 0 'x': expected dtype float32, got float64"),
    ((np.zeros(4, ">f4"),), {}, "main: argument 0 'x': numpy dtype '>f4' has non-native byte "
     "order; convert it first with array.astype(array.dtype.newbyteorder('='))"),
    ((np.zeros(4, F32),), {"out": np.frombuffer(bytes(16), F32)},
     "main: argument 1 'y': the out= array is read-only"),
    ((np.zeros(4, F32),), {"out": np.zeros(5, F32)},
     "main: argument 1 'y': expected shape [4], got [5]"),
])
def test_declined_calls_keep_every_check(hand_lib: Module, args: tuple[Any, ...],
                                         kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(CallError) as info:
        hand_lib["main"](*args, **kwargs)
    assert str(info.value) == message


def test_out_may_not_be_the_input(hand_lib: Module) -> None:
    x = np.arange(4, dtype=F32)
    with pytest.raises(CallError, match="main: argument 1 'y': overlaps argument 0 'x'"):
        hand_lib["main"](x, out=x)
    np.testing.assert_array_equal(x, np.arange(4, dtype=F32))  # untouched


def test_split_outs_overlapping_each_other_are_refused(hand_lib: Module) -> None:
    buf = np.zeros(3, np.int64)
    with pytest.raises(CallError, match="overlaps"):
        hand_lib["split"](np.arange(3), out=(buf, buf.view(np.float64)))


def test_the_overlap_sweep_finds_what_pairwise_tests_find() -> None:
    """The fast path's overlap test (one sweep over sorted byte ranges) against every
    pair tested: a written range (index >= 3) may overlap nothing, read ranges may
    overlap each other; empty ranges overlap nothing."""
    rng = np.random.default_rng(0)
    found = set()
    for _ in range(400):
        n = int(rng.integers(2, 8))
        addresses = [int(a) for a in rng.integers(0, 64, n)]
        sizes = [int(s) for s in rng.integers(0, 12, n)]
        pairwise = any(
            max(i, j) >= 3 and sizes[i] and sizes[j]
            and addresses[i] < addresses[j] + sizes[j] and addresses[j] < addresses[i] + sizes[i]
            for i in range(n) for j in range(i))
        assert fc._any_written_overlap(addresses, sizes, 3) == pairwise, (addresses, sizes)
        found.add(pairwise)
    assert found == {True, False}


def test_concurrent_calls_each_use_their_own_arguments(hand_lib: Module) -> None:
    fn = hand_lib["main"]
    errors: list[str] = []

    def worker(seed: int) -> None:
        x = np.full(4, seed, F32)
        out = np.empty(4, F32)
        expected = hm.reference("main", x)
        for i in range(300):
            got = fn(x) if i % 2 else fn(x, out=out)
            if not np.array_equal(got, expected):
                errors.append(f"thread {seed}: {got} != {expected}")
                return

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_a_call_while_slots_are_taken_builds_its_own(hand_lib: Module) -> None:
    fn = hand_lib["main"]
    pool = fn._slot_pool
    assert pool is not None
    held = pool.take()  # as if another call were in flight
    held.set_data([0, 0])
    try:
        x = np.arange(4, dtype=F32)
        np.testing.assert_array_equal(fn(x), hm.reference("main", x))
        assert held.tensors[0].data is None  # not written by the call above
    finally:
        pool.give_back(held)


@pytest.mark.parametrize(("params", "results", "fast"), [
    ([{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [2, 3]}],
     [{"name": "y", "kind": "tensor", "dtype": "float32", "shape": [2, 3]}], True),
    ([{"name": "x", "kind": "tensor", "dtype": "float32", "shape": ["n", 3]}],
     [{"name": "y", "kind": "tensor", "dtype": "float32", "shape": ["n", 3]}], True),
    ([{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [2]},
      {"name": "k", "kind": "scalar", "dtype": "int32"}],
     [{"name": "y", "kind": "tensor", "dtype": "float32", "shape": [2]}], False),
])
def test_only_all_tensor_signatures_prebuild_arguments(
        params: list[dict[str, Any]], results: list[dict[str, Any]], fast: bool) -> None:
    sig = {"name": "g", "kind": "graph", "params": params, "results": results}
    fn = NativeFunction(sig, c_func=None)
    assert (fn._slot_pool is not None) is fast


def test_data_dependent_sizes_take_the_fast_path(forbid_packing: Callable[[], None]) -> None:
    """A result sized by its data (NonZero's count) is allocated at its bound (or is the
    caller's `out=` at it) and handed back trimmed to what each call wrote; the next call
    starts from the bound again."""
    b = GraphBuilder()
    b.add(helper.make_node("NonZero", ["x"], ["nz"]))
    b.output("nz", None, TensorProto.INT64)
    m = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])], opset=17,
                ir_version=None, check=False)
    fn = kiln.compile(kiln.frontend.from_onnx(m), "llvm")["main"]
    forbid_packing()
    session = ort_session(m)
    for x in ([0, 2, 0, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1], [0, 0], [5, 0, 5]):
        x = np.array(x, F32)
        got, (want,) = fn(x), session.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        out = np.full((1, x.size), -1, np.int64)  # at the bound: the result is its start
        into = fn(x, out=out)
        np.testing.assert_array_equal(into, want)
        assert into.size == 0 or np.shares_memory(into, out)
