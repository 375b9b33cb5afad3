"""A `LetStmt` is a flat binding, in scope to the end of its statement list: a chain
of thousands of lets is one long list that every walker handles without recursion
that grows with its length."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, evaluate, structural_equal, verify
from kiln.ir import tensor as t
from kiln.ir.visitor import MAX_NESTING, nesting_depth
from kiln.script import from_source, print_module

N = 5000  # several times the default Python frame limit


def let_chain(n: int = N) -> IRModule:
    """Y[i] = f(X[i]) with v0 = X[i], v_k = v_{k-1} * 3 + k: one let per step, in a loop."""
    ib = IRBuilder()
    with ib.prim_func("main"):
        X = ib.arg("X", (4,), "int32")
        Y = ib.arg("Y", (4,), "int32")
        with ib.for_range(4) as i:
            v = ib.declare_let("v0", X[i])
            for k in range(1, n):
                v = ib.declare_let(f"v{k}", v * 3 + k)
            ib.store(Y, [i], v)
    return ib.get()


def let_chain_reference(x: np.ndarray, n: int = N) -> np.ndarray:
    """The same chain with int32 wrap-around, in numpy."""
    v = x.astype(np.int64)
    for k in range(1, n):
        v = (v * 3 + k + 2**31) % 2**32 - 2**31
    return v.astype(np.int32)


def test_a_let_chain_is_one_flat_list() -> None:
    mod = let_chain()
    loop = mod["main"].body
    assert isinstance(loop, t.For) and isinstance(loop.body, t.SeqStmt)
    assert len(loop.body.body) == N + 1
    assert all(isinstance(s, t.LetStmt) for s in loop.body.body[:N])
    assert nesting_depth(mod) < 10 < MAX_NESTING


def test_a_long_let_chain_verifies_prints_parses_and_evaluates() -> None:
    mod = let_chain()
    verify(mod)
    assert structural_equal(mod, let_chain())
    assert not structural_equal(mod, let_chain(N - 1))
    text = print_module(mod)
    assert "            v0 = T.let(X[i])\n" in text
    assert (f"            v{N - 1} = T.let(v{N - 2} * T.int32(3) + T.int32({N - 1}))\n"
            in text)
    assert structural_equal(from_source(text), mod)
    x = np.array([0, 1, -7, 2**30], np.int32)
    y = np.zeros(4, np.int32)
    evaluate(mod, "main", x, y)
    np.testing.assert_array_equal(y, let_chain_reference(x))


def test_the_with_form_still_builds_and_parses_the_flat_form() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        Y = ib.arg("Y", (2,), "int32")
        with ib.let("a", t.const(3, "int32")) as a:
            ib.store(Y, [0], a)
        ib.store(Y, [1], a + 1)  # still in scope: the binding is flat
    mod = ib.get()
    body = mod["f"].body
    assert isinstance(body, t.SeqStmt) and isinstance(body.body[0], t.LetStmt)
    verify(mod)
    old = from_source(
        "@T.prim_func\ndef f(Y: T.Buffer((2,), \"int32\")):\n"
        "    with T.let(T.int32(3)) as a:\n        Y[0] = a\n"
        "    b = T.let(T.int32(3))\n    Y[1] = b + 1\n")
    new = from_source(print_module(mod))
    assert structural_equal(new, mod)
    assert isinstance(old["f"].body, t.SeqStmt) and len(old["f"].body.body) == 4
    y = np.zeros(2, np.int32)
    evaluate(old, "f", y)
    assert y.tolist() == [3, 4]


def test_a_let_ends_with_its_list_and_binds_afresh_each_iteration() -> None:
    X = t.Buffer("X", (4,), "int32")
    Y = t.Buffer("Y", (4,), "int32")
    i, v = t.Var("i"), t.Var("v", "int32")
    loop = t.For(i, t.const(0), t.const(4), "serial",
                 t.seq(t.LetStmt(v, X[i] * 2), t.Store(Y, v, (i,))))
    mod = IRModule({"f": t.PrimFunc((X, Y), loop)})
    verify(mod)
    y = np.zeros(4, np.int32)
    evaluate(mod, "f", np.array([1, 2, 3, 4], np.int32), y)
    assert y.tolist() == [2, 4, 6, 8]
    after = IRModule({"f": t.PrimFunc((X, Y), t.seq(loop, t.Store(Y, v, (t.const(0),))))})
    with pytest.raises(IRError, match="use of variable 'v' outside its scope"):
        verify(after)
    twice = IRModule({"f": t.PrimFunc((X, Y), t.seq(
        t.LetStmt(v, X[t.const(0)]), t.LetStmt(v, X[t.const(1)]), t.Store(Y, v, (t.const(0),))))})
    with pytest.raises(IRError, match="redefinition of variable 'v' by a let"):
        verify(twice)
