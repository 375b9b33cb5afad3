"""Program structure: control flow, scalar parameters, loop kinds, calls, externs, memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule, TensorType
from kiln.ir import graph as g
from kiln.ir.tensor import CallExtern, Cast, ExternDependency, Intrin, Var, const

from ._build import f32, loop_nest
from ._case import CorpusCase

# --------------------------------------------------------------------------- control flow


def _control_flow() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("piecewise"):
        X = ib.arg("X", (12,), "float32")
        Y = ib.arg("Y", (12,), "float32")
        with ib.for_range(12, name="i") as i, ib.let("v", X[i]) as v:
            with ib.if_(v > 1.0):
                ib.store(Y, [i], v * 2.0)
            with ib.else_():
                with ib.if_(v < -1.0):
                    ib.store(Y, [i], -v)
                with ib.else_():
                    ib.store(Y, [i], v * v)
    with ib.prim_func("triangle"):
        # Inner loop bounds depend on the outer loop variable.
        Y = ib.arg("Y", (6, 6), "int32")
        with loop_nest(ib, (6, 6)) as (i, j):
            ib.store(Y, [i, j], const(0, "int32"))
        with ib.for_range(6, name="i") as i, ib.for_range(i, 6, name="j") as j:
            ib.store(Y, [i, j], Cast("int32", i * 10 + j))
    with ib.prim_func("while_sum"):
        # A While whose condition reads buffers its body updates (a graph Loop's shape).
        X = ib.arg("X", (12,), "float32")
        Y = ib.arg("Y", (2,), "float32")
        with ib.allocate("k", (1,), "int64", "local") as k:
            ib.store(k, [0], const(0, "int64"))
            ib.store(Y, [0], const(0.0, "float32"))
            with ib.while_((k[0] < 12) & (Y[0] < 3.0)):
                ib.store(Y, [0], Y[0] + X[k[0]])
                ib.store(k, [0], k[0] + 1)
            ib.store(Y, [1], Cast("float32", k[0]))
    return ib.get()


def _piecewise(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(x > 1, x * 2, np.where(x < -1, -x, x * x))


def _triangle(y: np.ndarray) -> np.ndarray:
    i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    return np.where(j >= i, i * 10 + j, 0)


def _while_sum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    total, k = np.float32(0), 0
    while k < 12 and total < 3:
        total, k = np.float32(total + x[k]), k + 1
    return np.array([total, k], np.float32)


def _control_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    if name == "while_sum":
        return [rng.uniform(0, 1, 12).astype(np.float32), np.zeros(2, np.float32)]
    if name == "piecewise":
        return [(rng.standard_normal(12) * 2).astype(np.float32), np.zeros(12, np.float32)]
    return None


CONTROL_FLOW = CorpusCase("control_flow", _control_flow, _control_inputs,
                          reference={"piecewise": _piecewise, "triangle": _triangle,
                                     "while_sum": _while_sum})


def _scalar_params() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("axpy"):
        a = ib.scalar_arg("a", "float32")
        n = ib.scalar_arg("n", "int64")
        X = ib.arg("X", (16,), "float32")
        Y = ib.arg("Y", (16,), "float32")
        # Only the first n elements change; the loop bound is a parameter.
        with ib.for_range(n, name="i") as i:
            ib.store(Y, [i], a * X[i] + Y[i])
    return ib.get()


def _axpy_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    return [float(rng.standard_normal()), int(rng.integers(0, 17)),
            rng.standard_normal(16).astype(np.float32),
            rng.standard_normal(16).astype(np.float32)]


def _axpy(a: float, n: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = y.copy()
    out[:n] = np.float32(a) * x[:n] + y[:n]
    return out


SCALAR_PARAMS = CorpusCase("scalar_params", _scalar_params, _axpy_inputs,
                           reference={"axpy": _axpy})


def _loop_kinds() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("kinds"):
        X = ib.arg("X", (4, 8), "float32")
        Y = ib.arg("Y", (4, 8), "float32")
        Z = ib.arg("Z", (4,), "float32")
        with ib.for_range(4, name="i", kind="parallel") as i:
            with ib.for_range(8, name="j", kind="vectorized") as j:
                ib.store(Y, [i, j], X[i, j] * 2.0 + 1.0)
            ib.store(Z, [i], f32(0.0))
            with ib.for_range(4, name="k", kind="unrolled") as k:
                ib.store(Z, [i], Z[i] + X[i, k * 2])
    return ib.get()


LOOP_KINDS = CorpusCase(
    "loop_kinds", _loop_kinds,
    reference={"kinds": lambda x, y, z: (x * 2 + 1, x[:, ::2].sum(axis=1))},
)

# --------------------------------------------------------------------------- calls


def _call_func() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("scale_add"):
        X = ib.arg("X", (8,), "float32")
        Y = ib.arg("Y", (8,), "float32")
        s = ib.scalar_arg("s", "float32")
        with ib.for_range(8, name="i") as i:
            ib.store(Y, [i], X[i] * s + Y[i])
    with ib.prim_func("fill"):
        Y = ib.arg("Y", (8,), "float32")
        v = ib.scalar_arg("v", "float32")
        with ib.for_range(8, name="i") as i:
            ib.store(Y, [i], v)
    with ib.prim_func("combine"):
        X = ib.arg("X", (8,), "float32")
        Y = ib.arg("Y", (8,), "float32")
        tmp = ib.declare_allocate("tmp", (8,), "float32")
        ib.call_func("fill", [tmp, f32(1.0)])
        ib.call_func("scale_add", [X, tmp, f32(2.0)])
        ib.call_func("fill", [Y, f32(0.0)])
        ib.call_func("scale_add", [tmp, Y, f32(0.5)])
    return ib.get()


def _call_inputs(rng: np.random.Generator, name: str) -> list[Any] | None:
    x = rng.standard_normal(8).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    if name == "scale_add":
        return [x, y, float(rng.standard_normal())]
    if name == "fill":
        return [y, float(rng.standard_normal())]
    return None


CALL_FUNC = CorpusCase(
    "call_func", _call_func, _call_inputs,
    reference={
        "scale_add": lambda x, y, s: x * np.float32(s) + y,
        "fill": lambda y, v: np.full(8, v, np.float32),
        "combine": lambda x, y: (x * 2 + 1) * np.float32(0.5),
    },
)


def _extern_expf() -> IRModule:
    libm = ExternDependency("libm", libs=("-lm",))
    ib = IRBuilder()
    with ib.prim_func("exp_plus_one"):
        X = ib.arg("X", (10,), "float32")
        Y = ib.arg("Y", (10,), "float32")
        with ib.for_range(10, name="i") as i:
            ib.store(Y, [i], CallExtern("expf", (X[i],), "float32", libm) + 1.0)
    with ib.prim_func("tanh_pow"):
        X = ib.arg("X", (10,), "float32")
        Y = ib.arg("Y", (10,), "float32")
        with ib.for_range(10, name="i") as i:
            t = CallExtern("tanhf", (X[i],), "float32", libm)
            ib.store(Y, [i], CallExtern("powf", (Intrin("abs", (t,)), f32(1.5)), "float32",
                                        libm))
    return ib.get()


EXTERN_EXPF = CorpusCase(
    "extern_expf", _extern_expf,
    reference={
        "exp_plus_one": lambda x, y: np.exp(x.astype(np.float64)) + 1,
        "tanh_pow": lambda x, y: np.abs(np.tanh(x.astype(np.float64))) ** 1.5,
    },
    rtol=2e-6, atol=1e-6, tags=frozenset({"extern"}),
)

# --------------------------------------------------------------------------- memory


def _decl_buffer_arena() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("arena_views"):
        X = ib.arg("X", (8,), "float32")
        Y = ib.arg("Y", (8,), "float32")
        arena = ib.declare_allocate("arena", (64,), "uint8")
        f = ib.declare_view("scaled", (8,), "float32", arena, 0)
        n = ib.declare_view("truncated", (8,), "int32", arena, 32)
        with ib.for_range(8, name="i") as i:
            ib.store(f, [i], X[i] * 2.5)
            ib.store(n, [i], Cast("int32", f[i]))
        with ib.for_range(8, name="i") as i:
            ib.store(Y, [i], Cast("float32", n[i]) - f[i])
        # The same bytes reused with another type once the first views are no longer read.
        h = ib.declare_view("half", (4,), "float32", arena, 48)
        with ib.for_range(4, name="i") as i:
            ib.store(h, [i], Y[i * 2] + Y[i * 2 + 1])
        with ib.for_range(4, name="i") as i:
            ib.store(Y, [i], h[i])
    return ib.get()


def _arena_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    f = x * np.float32(2.5)
    out = f.astype(np.int32).astype(np.float32) - f
    out[:4] = out[0::2] + out[1::2]
    return out


DECL_BUFFER_ARENA = CorpusCase("decl_buffer_arena", _decl_buffer_arena,
                               reference={"arena_views": _arena_reference})

# --------------------------------------------------------------------------- symbolic shapes


def _symbolic_shapes() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("saxpy_n"):
        # Shapes that use a scalar parameter.
        n = ib.scalar_arg("n", "int64")
        a = ib.scalar_arg("a", "float32")
        X = ib.arg("X", (n,), "float32")
        Y = ib.arg("Y", (n,), "float32")
        with ib.for_range(n, name="i") as i:
            ib.store(Y, [i], a * X[i] + Y[i])
    m = Var("m", "int64")
    with ib.prim_func("double_rows"):
        # A shape variable bound by the first argument's shape, and a heap
        # allocation whose size depends on it.
        X = ib.arg("X", (m, 4), "float32")
        Y = ib.arg("Y", (m, 4), "float32")
        with ib.allocate("row_sums", (m * 2,), "float32") as tmp, ib.for_range(m, name="i") as i:
            ib.store(tmp, [i * 2], f32(0.0))
            with ib.for_range(4, name="j") as j:
                ib.store(Y, [i, j], X[i, j] * 2.0)
                ib.store(tmp, [i * 2], tmp[i * 2] + X[i, j])
            ib.store(Y, [i, 0], Y[i, 0] + tmp[i * 2] * 0.0)
    rows = Var("rows", "int64")
    with ib.function("main"):
        x = ib.param("x", TensorType((rows, 4), "float32"))
        y = ib.emit(g.CallTensor("double_rows", (x,), TensorType((rows, 4), "float32")), "y")
        ib.ret(y)
    return ib.get()


def _symbolic_inputs(rng: np.random.Generator, name: str) -> list[Any]:
    if name == "saxpy_n":
        n = int(rng.integers(0, 11))
        return [n, float(rng.standard_normal()), rng.standard_normal(n).astype(np.float32),
                rng.standard_normal(n).astype(np.float32)]
    rows = int(rng.integers(1, 6))
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    return [x] if name == "main" else [x, np.zeros((rows, 4), np.float32)]


SYMBOLIC_SHAPES = CorpusCase(
    "symbolic_shapes", _symbolic_shapes, _symbolic_inputs,
    reference={
        "saxpy_n": lambda n, a, x, y: np.float32(a) * x + y,
        "double_rows": lambda x, y: x * 2,
        "main": lambda x: x * 2,
    },
    tags=frozenset({"symbolic", "graph"}),
)

CASES = [CONTROL_FLOW, SCALAR_PARAMS, LOOP_KINDS, CALL_FUNC, EXTERN_EXPF, DECL_BUFFER_ARENA,
         SYMBOLIC_SHAPES]
