"""Simplify: exact constant folding, identities, single-iteration loops, lets."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.ir import IRModule
from kiln.ir import tensor as t
from kiln.transform import Simplify
from kiln.transform.simplify import fold_binary, fold_cast, simplify_expr, simplify_stmt

HAVE_EVALUATE = importlib.util.find_spec("kiln.ir.evaluate") is not None


def c(v: float, dtype: str = "int32") -> t.Const:
    return t.Const(v, dtype)


def folded(e: t.PrimExpr) -> object:
    out = simplify_expr(e)
    assert isinstance(out, t.Const), out
    return out.value


@pytest.mark.parametrize(("op", "a", "b", "dtype", "want"), [
    ("add", 2**31 - 1, 1, "int32", -(2**31)),     # wraps
    ("mul", 200, 2, "uint8", 144),
    ("sub", 0, 1, "uint32", 2**32 - 1),
    ("div", -7, 2, "int32", -3),                 # truncates
    ("mod", -7, 2, "int32", -1),                 # C remainder
    ("floordiv", -7, 2, "int32", -4),
    ("floormod", -7, 2, "int32", 1),
    ("div", -(2**31), -1, "int32", -(2**31)),    # wraps like two's complement hardware
    ("min", -3, 4, "int64", -3),
    ("xor", 0b1100, 0b1010, "int8", 0b0110),
])
def test_integer_folding_semantics(op: str, a: int, b: int, dtype: str, want: int) -> None:
    assert folded(t.BinaryOp(op, c(a, dtype), c(b, dtype))) == want


def test_float_folding_rounds_to_the_dtype() -> None:
    x = folded(t.BinaryOp("add", c(0.1, "float32"), c(0.2, "float32")))
    assert x == float(np.float32(0.1) + np.float32(0.2))
    assert x != 0.1 + 0.2
    assert folded(t.BinaryOp("mul", c(1e30, "float32"), c(1e30, "float32"))) == float("inf")


@pytest.mark.parametrize(("op", "a", "b", "dtype"), [
    ("div", 1, 0, "int32"), ("mod", 1, 0, "int32"), ("floordiv", 5, 0, "int64"),
    ("div", 1.0, 3.0, "float32"), ("pow", 2.0, 0.5, "float32"),
    ("add", 1.0, 2.0, "float16"), ("shl", 1, 3, "int32"),
])
def test_unsafe_folds_are_left_alone(op: str, a: float, b: float, dtype: str) -> None:
    assert fold_binary(op, c(a, dtype), c(b, dtype)) is None


def test_cast_folding() -> None:
    assert fold_cast("int8", c(300, "int32")).value == 44  # type: ignore[union-attr]
    assert fold_cast("float32", c(16777217, "int64")).value == 16777216.0  # type: ignore[union-attr]
    assert fold_cast("int32", c(1e20, "float32")) is None
    assert fold_cast("bool", c(2, "int32")).value is True  # type: ignore[union-attr]
    x = t.Var("x", "float32")
    assert simplify_expr(t.Cast("float32", x)) is x


def test_compare_unary_select_folding() -> None:
    assert folded(t.Compare("lt", c(-1), c(0))) is True
    assert folded(t.UnaryOp("neg", c(-(2**31)))) == -(2**31)
    assert folded(t.UnaryOp("not", c(True, "bool"))) is False
    x, y = t.Var("x"), t.Var("y")
    assert simplify_expr(t.Select(t.Compare("gt", c(2), c(1)), x, y)) is x


def test_identities_and_signed_zero() -> None:
    i = t.Var("i")
    assert simplify_expr(i * 1) is i
    assert simplify_expr(1 * i) is i
    assert simplify_expr(i + 0) is i
    assert simplify_expr(0 + i) is i
    assert simplify_expr(i - 0) is i
    f = t.Var("f", "float32")
    assert simplify_expr(f * 1.0) is f
    assert simplify_expr(f - t.Const(0.0, "float32")) is f
    assert simplify_expr(f + t.Const(-0.0, "float32")) is f
    # f + 0.0 maps -0.0 to +0.0; f - (-0.0) is f + 0.0: neither is an identity.
    keep = f + t.Const(0.0, "float32")
    assert simplify_expr(keep) is keep
    keep2 = f - t.Const(-0.0, "float32")
    assert simplify_expr(keep2) is keep2
    # Nested: (i * 1 + (2 + 3)) folds the constant part.
    e = simplify_expr(i * 1 + (c(2, "int64") + c(3, "int64")))
    assert isinstance(e, t.BinaryOp) and e.a is i and e.b.value == 5  # type: ignore[attr-defined]


def test_unchanged_expression_keeps_identity() -> None:
    x = t.Buffer("x", (4,), "float32")
    i = t.Var("i")
    e = x[i * 2] + x[i]
    assert simplify_expr(e) is e


def test_single_iteration_loop_and_lets_are_substituted() -> None:
    x = t.Buffer("x", (8,), "int32")
    i, j = t.Var("i"), t.Var("j")
    inner = t.For(j, c(0, "int64"), c(1, "int64"), "serial",
                  t.Store(x, i + j, (i * 1 + j,)))
    outer = t.For(i, c(3, "int64"), c(1, "int64"), "serial", inner)
    out = simplify_stmt(outer)
    assert isinstance(out, t.Store)
    assert out.indices[0].value == 3  # type: ignore[attr-defined]
    assert out.value.value == 3  # type: ignore[attr-defined]


def test_let_of_non_constant_stays() -> None:
    x = t.Buffer("x", (8,), "int32")
    v = t.Var("v", "int32")
    s = t.seq(t.LetStmt(v, x[0] + 1), t.Store(x, v, (c(1, "int64"),)))
    assert simplify_stmt(s) is s


def test_constant_let_is_substituted_into_the_rest_of_its_list_only() -> None:
    """A flat let bound to a constant is dropped and substituted up to the end of the
    statement list it stands in, not into the statements after that list."""
    x = t.Buffer("x", (8,), "int32")
    v, i = t.Var("v", "int32"), t.Var("i", "int64")
    inner = t.seq(t.LetStmt(v, c(5)), t.Store(x, v + 1, (i,)))
    s = t.seq(t.For(i, c(0, "int64"), c(2, "int64"), "serial", inner),
              t.Store(x, c(7), (c(3, "int64"),)))
    out = simplify_stmt(s)
    assert isinstance(out, t.SeqStmt) and isinstance(out.body[0], t.For)
    store = out.body[0].body
    assert isinstance(store, t.Store) and store.value.value == 6  # type: ignore[attr-defined]
    assert out.body[1] is s.body[1]  # type: ignore[attr-defined]


def test_constant_if() -> None:
    x = t.Buffer("x", (1,), "int32")
    then, other = t.Store(x, c(1), (c(0, "int64"),)), t.Store(x, c(2), (c(0, "int64"),))
    assert simplify_stmt(t.IfThenElse(t.Compare("eq", c(1), c(1)), then, other)) is then
    assert simplify_stmt(t.IfThenElse(t.Compare("eq", c(1), c(2)), then, other)) is other
    empty = simplify_stmt(t.IfThenElse(t.Compare("eq", c(1), c(2)), then, None))
    assert isinstance(empty, t.Evaluate)


def test_pass_keeps_unchanged_functions() -> None:
    x = t.Buffer("x", (4,), "float32")
    i = t.Var("i")
    body = t.For(i, c(0, "int64"), c(4, "int64"), "serial", t.Store(x, x[i] * 2.0, (i,)))
    fn = t.PrimFunc((x,), body)
    mod = IRModule({"f": fn})
    assert Simplify()(mod) is mod
    body2 = t.For(i, c(0, "int64"), c(4, "int64"), "serial", t.Store(x, x[i] * 1.0, (i,)))
    out = Simplify()(IRModule({"f": t.PrimFunc((x,), body2, {"keep": 1})}))
    fn2 = out["f"]
    assert isinstance(fn2, t.PrimFunc) and fn2.attrs["keep"] == 1
    assert isinstance(fn2.body.body.value, t.Load)  # type: ignore[attr-defined]


# ----------------------------------------------------------------- property: same results

INT_OPS = ["add", "sub", "mul", "div", "mod", "floordiv", "floormod", "min", "max", "and",
           "or", "xor"]


@st.composite
def int_exprs(draw: st.DrawFn, leaves: list[t.PrimExpr], dtype: str, depth: int = 0
              ) -> t.PrimExpr:
    if depth >= 4 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            return draw(st.sampled_from(leaves))
        lo, hi = (-100, 100) if dtype.startswith("int") else (0, 200)
        return t.Const(draw(st.integers(lo, hi)), dtype)
    op = draw(st.sampled_from(INT_OPS))
    a = draw(int_exprs(leaves, dtype, depth + 1))
    b = draw(int_exprs(leaves, dtype, depth + 1))
    if op in ("div", "mod", "floordiv", "floormod"):
        b = t.Const(draw(st.integers(1, 7)), dtype)  # the interpreter may reject / 0
    return t.BinaryOp(op, a, b)


@pytest.mark.skipif(not HAVE_EVALUATE, reason="kiln.ir.evaluate not written yet")
@settings(max_examples=80, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["int32", "int8", "uint8"]))
def test_simplify_preserves_results(data: st.DataObject, dtype: str) -> None:
    from kiln.ir.evaluate import evaluate

    x = t.Buffer("x", (3,), dtype)
    y = t.Buffer("y", (3,), dtype)
    i = t.Var("i")
    j = t.Var("j")
    leaves: list[t.PrimExpr] = [x[i], x[0], t.Cast(dtype, j)]
    e = data.draw(int_exprs(leaves, dtype))
    body = t.For(i, c(0, "int64"), c(3, "int64"), "serial",
                 t.For(j, c(1, "int64"), c(1, "int64"), "serial", t.Store(y, e, (i,))))
    mod = IRModule({"f": t.PrimFunc((x, y), body)})
    simple = Simplify()(mod)
    xs = np.array([-3, 5, 9], dtype=dtype) if dtype != "uint8" else np.array([3, 5, 250], dtype)
    want, got = np.zeros(3, dtype), np.zeros(3, dtype)
    evaluate(mod, "f", xs, want)
    evaluate(simple, "f", xs, got)
    np.testing.assert_array_equal(got, want)
