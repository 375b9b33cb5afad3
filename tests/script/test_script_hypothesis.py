"""Random IR (expressions of every dtype, nested statements, constants) round-trips."""

from __future__ import annotations

import functools

import numpy as np
from dsl_strict_equal import assert_roundtrip_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.ir import IRBuilder, TensorType
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.script import from_source, print_module

DTYPES = ("int64", "int32", "int8", "uint8", "uint64", "float32", "float64", "float16", "bool")
INT_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "mod", "min", "max", "pow",
           "and", "or", "xor", "shl", "shr")
FLOAT_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "pow")
BOOL_OPS = ("and", "or", "xor")
UNARY_INTRINSICS = tuple(sorted(n for n, k in t.INTRINSICS.items()
                                if k == 1 and n not in t.BOOL_INTRINSICS))

# One scalar parameter and one buffer per dtype, shared by every generated function.
VARS = {d: t.Var(f"s_{d}", d) for d in DTYPES}
BUFS = {d: t.Buffer(f"B_{d}", (8,), d) for d in DTYPES}
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def consts(dtype: str) -> st.SearchStrategy[t.Const]:
    if dt.is_bool(dtype):
        values: st.SearchStrategy[object] = st.booleans()
    elif dt.is_float(dtype):
        values = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from(
            [0.0, -0.0, 0.1, 1.0, -1.0, 1e-45, 65504.0])
        if dtype == "float32":
            values = values | st.floats(width=32)
    else:
        bits = dt.bits(dtype)
        half = 2 ** (bits - 1)
        lo, hi = (0, 2**bits - 1) if dtype.startswith("u") else (-half, half - 1)
        values = st.integers(lo, hi)
    return values.map(lambda v: t.Const(v, dtype))  # type: ignore[arg-type]


@functools.cache
def arrays(dtype: str, max_size: int) -> st.SearchStrategy[np.ndarray]:
    """1-d arrays whose values fit `dtype` (any float bit pattern of that width)."""
    if dt.is_float(dtype):
        values: st.SearchStrategy[object] = st.floats(width=dt.bits(dtype))  # type: ignore[arg-type]
    else:
        values = consts(dtype).map(lambda c: c.value)
    return st.lists(values, max_size=max_size).map(
        lambda vs: np.array(vs, dtype=dt.to_numpy(dtype)))


@functools.cache  # building strategies is the slow part: build each once
def exprs(dtype: str, depth: int) -> st.SearchStrategy[t.PrimExpr]:
    leaves: st.SearchStrategy[t.PrimExpr] = st.one_of(
        consts(dtype), st.just(VARS[dtype]),
        st.integers(0, 7).map(lambda k: t.Load(BUFS[dtype], (t.const(k),))),
    )
    if depth <= 0:
        return leaves
    sub = exprs(dtype, depth - 1)
    options = [leaves]
    if dt.is_bool(dtype):
        options.append(st.builds(t.BinaryOp, st.sampled_from(BOOL_OPS), sub, sub))
        options.append(st.builds(lambda a: t.UnaryOp("not", a), sub))
        options.append(st.sampled_from(DTYPES[:-1]).flatmap(
            lambda d: st.builds(t.Compare, st.sampled_from(t.COMPARE_OPS),
                                exprs(d, depth - 1), exprs(d, depth - 1))))
    else:
        ops = FLOAT_OPS if dt.is_float(dtype) else INT_OPS
        options.append(st.builds(t.BinaryOp, st.sampled_from(ops), sub, sub))
        options.append(st.builds(lambda a: t.UnaryOp("neg", a), sub))
        if dt.is_float(dtype):
            options.append(st.builds(lambda n, a: t.Intrin(n, (a,)),
                                     st.sampled_from(UNARY_INTRINSICS), sub))
            options.append(st.builds(lambda n, a, b: t.Intrin(n, (a, b)),
                                     st.sampled_from(("pow", "atan2", "fmod")), sub, sub))
        else:
            options.append(st.builds(lambda a: t.UnaryOp("not", a), sub))
    options.append(st.builds(t.Select, exprs("bool", depth - 1), sub, sub))
    options.append(st.sampled_from(DTYPES).flatmap(
        lambda d: exprs(d, depth - 1).map(lambda e: t.Cast(dtype, e))))
    options.append(st.lists(st.one_of(sub, st.just(BUFS["float32"])), max_size=3).map(
        lambda args: t.CallExtern("ext_fn", tuple(args), dtype)))
    return st.one_of(*options)


def _func(body: t.Stmt) -> IRModule:
    params = (*BUFS.values(), *VARS.values())
    return IRModule({"f": t.PrimFunc(params, body)})


def _check(mod: IRModule, **kwargs: object) -> None:
    text = print_module(mod, **kwargs)  # type: ignore[arg-type]
    again = from_source(text, metadata=text.metadata or None)
    assert_roundtrip_equal(again, mod)
    assert print_module(again, **kwargs) == text  # type: ignore[arg-type]


@SETTINGS
@given(st.sampled_from(DTYPES).flatmap(lambda d: exprs(d, 3)))
def test_random_expression_round_trips(e: t.PrimExpr) -> None:
    _check(_func(t.Store(BUFS[e.dtype], e, (t.const(0),))))


@st.composite
def stmts(draw: st.DrawFn, depth: int = 3) -> t.Stmt:
    """A random statement tree over fresh loop / let variables and allocations."""
    kind = draw(st.sampled_from(
        ["store", "evaluate", "call"] if depth <= 0 else
        ["store", "seq", "for", "let", "if", "allocate", "decl", "const"]))
    dtype = draw(st.sampled_from(DTYPES))
    if kind == "store":
        return t.Store(BUFS[dtype], draw(exprs(dtype, 1)), (draw(exprs("int64", 1)),))
    if kind == "evaluate":
        return t.Evaluate(draw(exprs(dtype, 1)))
    if kind == "call":
        return t.CallFunc("g", (BUFS[dtype], draw(exprs(dtype, 1))))
    body = draw(stmts(depth - 1))
    if kind == "seq":
        return t.seq(body, draw(stmts(depth - 1)), draw(stmts(depth - 1)))
    if kind == "for":
        start = draw(exprs("int64", 1))
        return t.For(t.Var("i"), start, draw(exprs("int64", 1)),
                     draw(st.sampled_from(t.FOR_KINDS)), body)
    if kind == "let":
        return t.seq(t.LetStmt(t.Var("x", dtype), draw(exprs(dtype, 2))), body)
    if kind == "if":
        other = draw(st.none() | stmts(depth - 1))
        return t.IfThenElse(draw(exprs("bool", 2)), body, other)
    if kind == "allocate":
        shape = tuple(draw(st.lists(st.integers(0, 9), max_size=3)))
        scope = draw(st.sampled_from(t.BUFFER_SCOPES))
        return t.seq(t.Allocate(t.Buffer("tmp", shape, dtype, scope)), body)
    if kind == "decl":
        view = t.Buffer("view", (2,), dtype)
        return t.seq(t.DeclBuffer(view, BUFS["uint8"], draw(st.integers(0, 6))), body)
    arr = draw(arrays(dtype, 24))
    return t.seq(t.AllocConst(t.Buffer("w", arr.shape, dtype), arr), body)


@SETTINGS
@given(stmts())
def test_random_statement_round_trips(body: t.Stmt) -> None:
    mod = _func(body)
    _check(mod)
    _check(mod, metadata="reference", inline_limit=4)


@SETTINGS
@given(st.sampled_from(DTYPES).flatmap(lambda d: arrays(d, 40)),
       st.sampled_from(["auto", "inline", "reference"]))
def test_random_constant_data_round_trips(arr: np.ndarray, mode: str) -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((1,), "int8"))
        c = ib.emit(g.Constant(arr), "c")
        ib.ret(g.Tuple((x, c)))
    _check(ib.get(), metadata=mode)
