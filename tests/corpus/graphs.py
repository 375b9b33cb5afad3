"""Multi-function modules: a graph `main` calling kernels through CallTensor."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule, TensorType, TupleType
from kiln.ir import graph as g
from kiln.ir.tensor import Intrin, max_

from ._build import f32, loop_nest
from ._case import CorpusCase

_rng = np.random.default_rng(1234)
W1 = (_rng.standard_normal((8, 16)) * 0.5).astype(np.float32)
B1 = (_rng.standard_normal(16) * 0.1).astype(np.float32)
W2 = (_rng.standard_normal((16, 4)) * 0.5).astype(np.float32)
B2 = (_rng.standard_normal(4) * 0.1).astype(np.float32)
GAMMA = _rng.uniform(0.5, 1.5, 6).astype(np.float32)


def _dense(ib: IRBuilder, name: str, m: int, k: int, n: int) -> None:
    with ib.prim_func(name):
        X = ib.arg("X", (m, k), "float32")
        W = ib.arg("W", (k, n), "float32")
        B = ib.arg("B", (n,), "float32")
        Y = ib.arg("Y", (m, n), "float32")
        with loop_nest(ib, (m, n)) as (i, j):
            ib.store(Y, [i, j], B[j])
            with ib.for_range(k, name="r") as r:
                ib.store(Y, [i, j], Y[i, j] + X[i, r] * W[r, j])


def _mlp() -> IRModule:
    ib = IRBuilder()
    _dense(ib, "dense1", 2, 8, 16)
    with ib.prim_func("relu"):
        X = ib.arg("X", (2, 16), "float32")
        Y = ib.arg("Y", (2, 16), "float32")
        with loop_nest(ib, (2, 16)) as (i, j):
            ib.store(Y, [i, j], max_(X[i, j], 0.0))
    _dense(ib, "dense2", 2, 16, 4)
    with ib.function("main"):
        x = ib.param("x", (2, 8), "float32")
        w1 = ib.emit(g.Constant(W1, "w1"), "w1")
        h = ib.emit(g.CallTensor("dense1", (x, w1, g.Constant(B1, "b1")),
                                 TensorType((2, 16), "float32")), "h")
        r = ib.emit(g.CallTensor("relu", (h,), TensorType((2, 16), "float32")), "r")
        o = ib.emit(g.CallTensor("dense2", (r, g.Constant(W2, "w2"), g.Constant(B2, "b2")),
                                 TensorType((2, 4), "float32")), "logits")
        ib.ret(g.Tuple((o, r)))
    return ib.get()


def _mlp_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.maximum(x @ W1 + B1, 0)
    return (hidden @ W2 + B2).astype(np.float32), hidden.astype(np.float32)


GRAPH_MLP = CorpusCase(
    "graph_mlp", _mlp,
    reference={
        "dense1": lambda x, w, b, y: x @ w + b,
        "relu": lambda x, y: np.maximum(x, 0),
        "dense2": lambda x, w, b, y: x @ w + b,
        "main": _mlp_reference,
    },
    tags=frozenset({"graph", "constants"}),
)


def _normalize_graph() -> IRModule:
    R, N = 4, 6
    ib = IRBuilder()
    with ib.prim_func("moments"):
        # Two outputs: a CallTensor with a tuple type.
        X = ib.arg("X", (R, N), "float32")
        M = ib.arg("mean", (R,), "float32")
        V = ib.arg("var", (R,), "float32")
        with ib.for_range(R, name="i") as i:
            ib.store(M, [i], f32(0.0))
            with ib.for_range(N, name="j") as j:
                ib.store(M, [i], M[i] + X[i, j])
            ib.store(M, [i], M[i] / float(N))
            ib.store(V, [i], f32(0.0))
            with ib.for_range(N, name="j") as j:
                ib.store(V, [i], V[i] + (X[i, j] - M[i]) * (X[i, j] - M[i]))
            ib.store(V, [i], V[i] / float(N))
    with ib.prim_func("normalize"):
        X = ib.arg("X", (R, N), "float32")
        M = ib.arg("mean", (R,), "float32")
        V = ib.arg("var", (R,), "float32")
        Y = ib.arg("Y", (R, N), "float32")
        with loop_nest(ib, (R, N)) as (i, j):
            ib.store(Y, [i, j], (X[i, j] - M[i]) * Intrin("rsqrt", (V[i] + 1e-5,)))
    with ib.prim_func("scale"):
        X = ib.arg("X", (R, N), "float32")
        G = ib.arg("G", (N,), "float32")
        Y = ib.arg("Y", (R, N), "float32")
        with loop_nest(ib, (R, N)) as (i, j):
            ib.store(Y, [i, j], X[i, j] * G[j])
    row = TensorType((R,), "float32")
    mat = TensorType((R, N), "float32")
    with ib.function("main"):
        x = ib.param("x", mat)
        mv = ib.emit(g.CallTensor("moments", (x,), TupleType((row, row))), "mv")
        mean = ib.emit(g.TupleGetItem(mv, 0), "mean")
        var = ib.emit(g.TupleGetItem(mv, 1), "var")
        y = ib.emit(g.CallTensor("normalize", (x, mean, var), mat), "y")
        z = ib.emit(g.CallTensor("scale", (y, g.Constant(GAMMA, "gamma")), mat), "z")
        ib.ret(g.Tuple((z, mean)))
    return ib.get()


def _normalize_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1)
    var = x64.var(axis=1)
    z = (x64 - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * GAMMA
    return z.astype(np.float32), mean.astype(np.float32)


def _moments(x: np.ndarray, m: np.ndarray, v: np.ndarray) -> tuple[Any, Any]:
    x64 = x.astype(np.float64)
    return x64.mean(axis=1), x64.var(axis=1)


def _normalize_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    if name == "normalize":
        x = rng.standard_normal((4, 6)).astype(np.float32)
        return [x, rng.standard_normal(4).astype(np.float32),
                rng.uniform(0.1, 2.0, 4).astype(np.float32), np.zeros((4, 6), np.float32)]
    return None


GRAPH_NORMALIZE = CorpusCase(
    "graph_normalize", _normalize_graph, _normalize_inputs,
    reference={
        "moments": _moments,
        "normalize": lambda x, m, v, y: (x - m[:, None]) / np.sqrt(
            v[:, None].astype(np.float64) + 1e-5),
        "scale": lambda x, gm, y: x * gm,
        "main": _normalize_reference,
    },
    rtol=1e-5, atol=1e-5, tags=frozenset({"graph", "constants"}),
)

CASES = [GRAPH_MLP, GRAPH_NORMALIZE]
