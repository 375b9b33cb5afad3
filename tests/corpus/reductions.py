"""Reduction corpus cases: sum, max, mean, argmax, prefix sum."""

from __future__ import annotations

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import Cast, const, max_

from ._build import f32
from ._case import CorpusCase


def _reduce_sum() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("row_sum"):
        X = ib.arg("X", (6, 10), "float32")
        Y = ib.arg("Y", (6,), "float32")
        with ib.for_range(6, name="i") as i:
            ib.store(Y, [i], f32(0.0))
            with ib.for_range(10, name="k") as k:
                ib.store(Y, [i], Y[i] + X[i, k])
    with ib.prim_func("total"):
        # A 0-d output buffer.
        X = ib.arg("X", (6, 10), "float32")
        S = ib.arg("S", (), "float32")
        ib.store(S, [], f32(0.0))
        with ib.for_range(6, name="i") as i, ib.for_range(10, name="k") as k:
            ib.store(S, [], S[()] + X[i, k])
    return ib.get()


REDUCE_SUM = CorpusCase(
    "reduce_sum", _reduce_sum,
    reference={
        "row_sum": lambda x, y: x.sum(axis=1),
        "total": lambda x, s: np.array(x.sum(dtype=np.float64), dtype=np.float32),
    },
)


def _reduce_max() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("col_max"):
        X = ib.arg("X", (7, 5), "float32")
        Y = ib.arg("Y", (5,), "float32")
        with ib.for_range(5, name="j") as j:
            ib.store(Y, [j], f32(float("-inf")))
            with ib.for_range(7, name="i") as i:
                ib.store(Y, [j], max_(Y[j], X[i, j]))
    return ib.get()


REDUCE_MAX = CorpusCase("reduce_max", _reduce_max,
                        reference={"col_max": lambda x, y: x.max(axis=0)})


def _reduce_mean() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("mean_axis0"):
        X = ib.arg("X", (8, 3), "float32")
        Y = ib.arg("Y", (3,), "float32")
        with ib.for_range(3, name="j") as j, ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], f32(0.0))
            with ib.for_range(8, name="i") as i:
                ib.store(acc, [0], acc[0] + X[i, j])
            ib.store(Y, [j], acc[0] / 8.0)
    return ib.get()


REDUCE_MEAN = CorpusCase("reduce_mean", _reduce_mean,
                         reference={"mean_axis0": lambda x, y: x.mean(axis=0)})


def _argmax() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("argmax"):
        X = ib.arg("X", (5, 9), "float32")
        Y = ib.arg("Y", (5,), "int64")
        with (ib.for_range(5, name="i") as i,
              ib.allocate("best", (1,), "float32", "local") as best,
              ib.allocate("arg", (1,), "int64", "local") as arg):
            ib.store(best, [0], X[i, 0])
            ib.store(arg, [0], const(0))
            # Strictly greater: the first maximum wins, as in numpy.
            with ib.for_range(1, 9, name="k") as k, ib.if_(X[i, k] > best[0]):
                ib.store(best, [0], X[i, k])
                ib.store(arg, [0], k)
            ib.store(Y, [i], arg[0])
    return ib.get()


ARGMAX = CorpusCase("argmax", _argmax, reference={"argmax": lambda x, y: x.argmax(axis=1)})


def _cumsum() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("cumsum"):
        X = ib.arg("X", (3, 12), "int32")
        Y = ib.arg("Y", (3, 12), "int32")
        with ib.for_range(3, name="i") as i, ib.allocate("run", (1,), "int32", "local") as run:
            ib.store(run, [0], const(0, "int32"))
            with ib.for_range(12, name="j") as j:
                ib.store(run, [0], run[0] + X[i, j])
                ib.store(Y, [i, j], run[0])
    with ib.prim_func("cummean"):
        X = ib.arg("X", (12,), "float32")
        Y = ib.arg("Y", (12,), "float32")
        run = ib.declare_allocate("run", (1,), "float32", "local")
        ib.store(run, [0], f32(0.0))
        with ib.for_range(12, name="j") as j:
            ib.store(run, [0], run[0] + X[j])
            ib.store(Y, [j], run[0] / Cast("float32", j + 1))
    return ib.get()


CUMSUM = CorpusCase(
    "cumsum", _cumsum,
    reference={
        "cumsum": lambda x, y: np.cumsum(x, axis=1, dtype=np.int32),
        "cummean": lambda x, y: np.cumsum(x, dtype=np.float32) / np.arange(1, 13),
    },
)

CASES = [REDUCE_SUM, REDUCE_MAX, REDUCE_MEAN, ARGMAX, CUMSUM]
