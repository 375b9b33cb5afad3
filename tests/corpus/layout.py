"""Data movement: transpose, concat, gather."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import select

from ._build import loop_nest
from ._case import CorpusCase


def _transpose() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("transpose2d"):
        X = ib.arg("X", (5, 7), "float32")
        Y = ib.arg("Y", (7, 5), "float32")
        with loop_nest(ib, (7, 5)) as (i, j):
            ib.store(Y, [i, j], X[j, i])
    with ib.prim_func("nchw_to_nhwc"):
        X = ib.arg("X", (1, 2, 3, 4), "int16")
        Y = ib.arg("Y", (1, 3, 4, 2), "int16")
        with loop_nest(ib, (1, 3, 4, 2), names="nhwc") as (n, h, w, c):
            ib.store(Y, [n, h, w, c], X[n, c, h, w])
    return ib.get()


TRANSPOSE = CorpusCase(
    "transpose", _transpose,
    reference={
        "transpose2d": lambda x, y: x.T,
        "nchw_to_nhwc": lambda x, y: x.transpose(0, 2, 3, 1),
    },
)


def _concat() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("concat_axis1"):
        A = ib.arg("A", (2, 3), "float32")
        B = ib.arg("B", (2, 5), "float32")
        C = ib.arg("C", (2, 8), "float32")
        with ib.for_range(2, name="i") as i:
            with ib.for_range(3, name="j") as j:
                ib.store(C, [i, j], A[i, j])
            with ib.for_range(5, name="j") as j:
                ib.store(C, [i, j + 3], B[i, j])
    with ib.prim_func("concat_axis0"):
        A = ib.arg("A", (2, 4), "uint8")
        B = ib.arg("B", (3, 4), "uint8")
        C = ib.arg("C", (5, 4), "uint8")
        with loop_nest(ib, (5, 4)) as (i, j):
            with ib.if_(i < 2):
                ib.store(C, [i, j], A[i, j])
            with ib.else_():
                ib.store(C, [i, j], B[i - 2, j])
    return ib.get()


CONCAT = CorpusCase(
    "concat", _concat,
    reference={
        "concat_axis1": lambda a, b, c: np.concatenate([a, b], axis=1),
        "concat_axis0": lambda a, b, c: np.concatenate([a, b], axis=0),
    },
)


def _gather() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("gather_rows"):
        D = ib.arg("data", (10, 4), "float32")
        I = ib.arg("indices", (6,), "int64")
        Y = ib.arg("Y", (6, 4), "float32")
        # Negative indices count from the end, as in ONNX Gather.
        with (ib.for_range(6, name="i") as i,
              ib.let("row", select(I[i] < 0, I[i] + 10, I[i])) as row,
              ib.for_range(4, name="j") as j):
            ib.store(Y, [i, j], D[row, j])
    return ib.get()


def _gather_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    data = rng.standard_normal((10, 4)).astype(np.float32)
    indices = rng.integers(-10, 10, 6).astype(np.int64)
    return [data, indices, np.zeros((6, 4), np.float32)]


GATHER = CorpusCase("gather", _gather, _gather_inputs,
                    reference={"gather_rows": lambda d, i, y: np.take(d, i, axis=0)})

CASES = [TRANSPOSE, CONCAT, GATHER]
