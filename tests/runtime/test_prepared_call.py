"""Prepared calls (`PackedFunction.prepare`): checked once, then each run computes the
function on what the arrays hold at that moment, with the call's own errors up front.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln.errors import CallError, UsageError
from kiln.runtime import Module, PreparedCall, load_artifacts
from support import handmade_lib as hm

F32 = np.float32


def test_each_run_reads_the_inputs_as_they_are_then(hand_lib: Module,
                                                     forbid_packing: Callable[[], None]) -> None:
    x = np.arange(4, dtype=F32)
    out = np.full(4, np.nan, F32)
    run = hand_lib["main"].prepare(x, out=out)
    assert isinstance(run, PreparedCall)
    forbid_packing()
    for step in range(3):
        x[:] = np.linspace(-1, 1, 4, dtype=F32) * step
        assert run() is out
        np.testing.assert_array_equal(out, hm.reference("main", x))


def test_results_are_allocated_once(hand_lib: Module) -> None:
    x = np.arange(3, dtype=np.int64)
    run = hand_lib["split"].prepare(x)
    first = run()
    x += 10
    second = run()
    assert isinstance(second, tuple) and all(a is b for a, b in zip(first, second))
    want = hm.reference("split", x)
    np.testing.assert_array_equal(second[0], want[0])
    np.testing.assert_array_equal(second[1], want[1])
    y = hand_lib["main"].prepare(np.ones(4, F32))()
    np.testing.assert_array_equal(y, hm.reference("main", np.ones(4, F32)))


def test_tensor_functions_with_scalars(hand_lib: Module) -> None:
    x = np.arange(6, dtype=F32).reshape(2, 3)
    y = np.zeros((2, 3), F32)
    run = hand_lib["scale_add"].prepare(x, y, alpha=2.5, k=3)
    assert run() is None
    np.testing.assert_allclose(y, hm.reference("scale_add", x, 2.5, 3), rtol=1e-6)
    x *= -1
    run()
    np.testing.assert_allclose(y, hm.reference("scale_add", x, 2.5, 3), rtol=1e-6)


def _call_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(CallError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(("name", "args", "kwargs"), [
    ("main", (np.ones(5, F32),), {}),                                  # wrong shape
    ("main", (np.ones(4, np.float64),), {}),                           # wrong dtype
    ("main", (np.ones(4, F32),), {"out": np.ones(3, F32)}),            # wrong out=
    ("main", (np.ones(4, F32), np.ones(4, F32)), {}),                  # too many
    ("add_one", (np.ones(4, F32), np.ones(4, F32)), {"out": np.ones(4, F32)}),
])
def test_bad_arguments_get_the_calls_own_error(hand_lib: Module, name: str,
                                               args: tuple[Any, ...],
                                               kwargs: dict[str, Any]) -> None:
    fn = hand_lib[name]
    assert _call_error(fn.prepare, *args, **kwargs) == _call_error(fn, *args, **kwargs)


def test_written_buffers_are_checked_once(hand_lib: Module) -> None:
    x = np.ones(4, F32)
    read_only = np.zeros(4, F32)
    read_only.flags.writeable = False
    assert "read-only" in _call_error(hand_lib["main"].prepare, x, out=read_only)
    assert "overlap" in _call_error(hand_lib["main"].prepare, x, out=x)


@pytest.mark.parametrize("x", [np.arange(8, dtype=F32)[::2], [1.0, 2.0, 3.0, 4.0]])
def test_only_contiguous_numpy_tensors(hand_lib: Module, x: Any) -> None:
    fn = hand_lib["main"]
    if isinstance(x, np.ndarray):
        with pytest.raises(UsageError, match="C-contiguous numpy arrays, got a strided"):
            fn.prepare(x)
    else:  # not a tensor at all: the call's own message
        assert _call_error(fn.prepare, x) == _call_error(fn, x)


def test_a_closed_library_refuses_its_prepared_calls() -> None:
    lib = load_artifacts(hm.artifacts(), metadata=hm.library_metadata("kiln_"), prefix="kiln_")
    run = lib["main"].prepare(np.ones(4, F32))
    run()
    lib.close()
    with pytest.raises(CallError, match="closed"):
        run()


def test_the_prepared_call_holds_its_arrays(hand_lib: Module) -> None:
    """Arrays given only to prepare() live as long as the prepared call: their memory is
    not handed to later arrays while the compiled code still reads and writes it."""
    import gc

    run = hand_lib["main"].prepare(np.arange(4, dtype=F32), out=np.full(4, np.nan, F32))
    gc.collect()
    litter = [np.full(4, 7.0, F32) for _ in range(1000)]  # would reuse freed buffers
    got = run()
    np.testing.assert_array_equal(got, hm.reference("main", np.arange(4, dtype=F32)))
    assert all((a == 7.0).all() for a in litter)
