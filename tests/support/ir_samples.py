"""Small hand-built IR modules shared by the transform, driver and e2e tests.

Kernels (destination-passing PrimFuncs over float32 vectors of length N unless
noted) and graph functions calling them, with numpy references.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType, TupleType

N = 8
F32 = TensorType((N,), "float32")


def add_kernels(ib: IRBuilder, n: int = N, dtype: str = "float32",
                names: Sequence[str] = ("add", "mul", "scale2", "neg", "square")) -> None:
    """Elementwise kernels: add(x, y, out), mul(x, y, out), scale2(x, out), neg, square."""
    one = 1.0 if dtype.startswith("float") else 1
    two = 2.0 if dtype.startswith("float") else 2
    if "add" in names:
        with ib.prim_func("add"):
            x, y, o = (ib.arg(s, (n,), dtype) for s in ("x", "y", "out"))
            with ib.for_range(n) as i:
                ib.store(o, [i], x[i] + y[i])
    if "mul" in names:
        with ib.prim_func("mul"):
            x, y, o = (ib.arg(s, (n,), dtype) for s in ("x", "y", "out"))
            with ib.for_range(n) as i:
                ib.store(o, [i], x[i] * y[i])
    if "scale2" in names:
        with ib.prim_func("scale2"):
            x, o = ib.arg("x", (n,), dtype), ib.arg("out", (n,), dtype)
            with ib.for_range(n) as i:
                ib.store(o, [i], x[i] * two)
    if "neg" in names:
        with ib.prim_func("neg"):
            x, o = ib.arg("x", (n,), dtype), ib.arg("out", (n,), dtype)
            with ib.for_range(n) as i:
                ib.store(o, [i], x[i] * (-one))
    if "square" in names:
        with ib.prim_func("square"):
            x, o = ib.arg("x", (n,), dtype), ib.arg("out", (n,), dtype)
            with ib.for_range(n) as i:
                ib.store(o, [i], x[i] * x[i])


KERNEL_REFS: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "scale2": lambda x: x * 2,
    "neg": lambda x: -x,
    "square": lambda x: x * x,
}
KERNEL_ARITY = {"add": 2, "mul": 2, "scale2": 1, "neg": 1, "square": 1}


def call(func: str, *args: g.Expr, ty: Any = F32) -> g.CallTensor:
    return g.CallTensor(func, tuple(args), ty)


WEIGHT = (np.arange(N, dtype=np.float32) - 3.0) / 4.0
BIAS = np.linspace(-1.0, 1.0, N).astype(np.float32)


def chain_module() -> IRModule:
    """main(x, y) = square(scale2(add(x, y)) * W) + B  -- 4 kernels, 2 constants."""
    ib = IRBuilder()
    add_kernels(ib)
    with ib.function("main"):
        x = ib.param("x", F32)
        y = ib.param("y", F32)
        a = ib.emit(call("add", x, y), "a")
        b = ib.emit(call("scale2", a), "b")
        c = ib.emit(call("mul", b, g.Constant(WEIGHT, "weight")), "c")
        d = ib.emit(call("square", c), "d")
        e = ib.emit(call("add", d, g.Constant(BIAS, "bias")), "e")
        ib.ret(e)
    return ib.get()


def chain_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.square((x + y) * 2 * WEIGHT) + BIAS


def tuple_module() -> IRModule:
    """main(x) -> (neg(x), x, neg(x), W, scale2(x)[via tuple+getitem])."""
    ib = IRBuilder()
    add_kernels(ib)
    with ib.function("main", attrs={"output_names": ("n1", "ident", "n2", "w", "s")}):
        x = ib.param("x", F32)
        n = ib.emit(call("neg", x), "n")
        s = ib.emit(call("scale2", x), "s")
        pair = ib.emit(g.Tuple((n, s)), "pair")
        s2 = ib.emit(g.TupleGetItem(pair, 1), "s2")
        ib.ret(g.Tuple((n, x, n, g.Constant(WEIGHT, "w"), s2)))
    return ib.get()


def tuple_reference(x: np.ndarray) -> tuple[np.ndarray, ...]:
    return (-x, x, -x, WEIGHT, x * 2)


def multi_output_module() -> IRModule:
    """A kernel with two outputs; main returns one of them plus a use of the other."""
    ib = IRBuilder()
    add_kernels(ib)
    with ib.prim_func("split2"):
        x = ib.arg("x", (N,), "float32")
        lo, hi = ib.arg("lo", (N,), "float32"), ib.arg("hi", (N,), "float32")
        with ib.for_range(N) as i:
            ib.store(lo, [i], x[i] * -1.0)
            ib.store(hi, [i], x[i] * 2.0)
    with ib.function("main"):
        x = ib.param("x", F32)
        both = ib.emit(call("split2", x, ty=TupleType((F32, F32))), "both")
        lo_v = ib.emit(g.TupleGetItem(both, 0), "lo")
        hi_v = ib.emit(g.TupleGetItem(both, 1), "hi")
        r = ib.emit(call("add", lo_v, hi_v), "r")
        ib.ret(g.Tuple((r, hi_v)))
    return ib.get()


def multi_output_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (x, x * 2)


def random_inputs(fn: PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    """Random arrays for every buffer parameter of `fn` (outputs too: zeros)."""
    out = []
    for p in fn.buffer_params:
        dtype = np.dtype(p.dtype)
        if dtype.kind == "f":
            out.append(rng.standard_normal(p.shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, p.shape).astype(bool))
        else:
            out.append(rng.integers(-5, 6, p.shape).astype(dtype))
    return out
