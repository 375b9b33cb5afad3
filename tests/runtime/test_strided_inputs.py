"""Strided inputs (a transpose, a slice) are copied; buffers a function writes are not."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import IRBuilder


@pytest.fixture(scope="module")
def relu() -> kiln.runtime.module.Module:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (3, 4), "float32")
        ib.ret(ib.emit(kiln.ops.call("relu", x), "y"))
    return kiln.compile(ib.get(), "llvm").jit()


def test_strided_input_is_copied(relu: kiln.runtime.module.Module) -> None:
    a = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(relu["main"](a.T), np.maximum(a.T, 0))
    b = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(relu["main"](b[:, ::2]), np.maximum(b[:, ::2], 0))


def test_written_buffer_must_be_contiguous(relu: kiln.runtime.module.Module) -> None:
    x = np.ones((3, 4), np.float32)
    with pytest.raises(kiln.CallError, match="'out0': expected a contiguous tensor"):
        relu["main"](x, out=np.empty((4, 3), np.float32).T)
    with pytest.raises(kiln.CallError, match="expected a contiguous tensor"):
        relu["relu"](x, np.empty((4, 3), np.float32).T)
    y = np.empty((3, 4), np.float32)
    relu["relu"](x.T.copy().T, y)  # strided input to a tensor function: copied too
    np.testing.assert_array_equal(y, x)
