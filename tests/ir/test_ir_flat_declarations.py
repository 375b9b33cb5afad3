"""Declarations (Allocate, AllocConst, DeclBuffer) are flat statements: thousands of
them in one function are walked, compared, evaluated and printed without recursion
that grows with their number."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, evaluate, structural_equal, verify
from kiln.ir import tensor as t
from kiln.script import from_source, print_module

N = 5000  # several times the default Python frame limit


def many_constants(n: int = N) -> IRModule:
    """Y[0] = X[0] + 0 + 1 + ... + (n - 1), each term a weight of its own."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (1,), "float32")
        Y = ib.arg("Y", (1,), "float32")
        ib.store(Y, [0], X[0])
        for k in range(n):
            w = ib.declare_const(f"w{k}", np.array([k], np.float32))
            ib.store(Y, [0], Y[0] + w[0])
    return ib.get()


def test_thousands_of_declarations_stay_one_flat_list() -> None:
    mod = many_constants()
    body = mod["f"].body
    assert isinstance(body, t.SeqStmt) and len(body.body) == 2 * N + 1
    verify(mod)
    assert structural_equal(mod, many_constants())
    assert not structural_equal(mod, many_constants(N - 1))
    y = np.zeros(1, np.float32)
    evaluate(mod, "f", np.array([0.5], np.float32), y)
    assert y[0] == np.float32(0.5 + N * (N - 1) / 2)
    assert print_module(mod).count("T.alloc_const(") == N


def test_thousands_of_declarations_round_trip_through_the_dsl() -> None:
    mod = many_constants()
    text = print_module(mod)
    assert f"    w{N - 1} = T.alloc_const([{float(N - 1)}], \"float32\")" in text
    assert structural_equal(from_source(text), mod)


def test_builder_declarations_return_their_buffer() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        Y = ib.arg("Y", (2,), "float32")
        arena = ib.declare_allocate("arena", (8,), "uint8")
        view = ib.declare_view("view", (2,), "float32", arena, 0)
        w = ib.declare_const("w", np.array([1.0, 2.0], np.float32))
        with ib.for_range(2) as i:
            ib.store(view, [i], w[i] * 3.0)
        with ib.for_range(2) as i:
            ib.store(Y, [i], view[i])
    mod = ib.get()
    body = mod["f"].body
    assert isinstance(body, t.SeqStmt)
    assert [type(s) for s in body.body[:3]] == [t.Allocate, t.DeclBuffer, t.AllocConst]
    assert (body.body[0].buffer, body.body[1].buffer, body.body[2].buffer) == (arena, view, w)
    y = np.zeros(2, np.float32)
    evaluate(mod, "f", y)
    assert y.tolist() == [3.0, 6.0]


def test_a_declaration_ends_with_its_block() -> None:
    """A buffer declared in a loop body is gone after the loop."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        Y = ib.arg("Y", (2,), "float32")
        with ib.for_range(2) as i:
            tmp = ib.declare_allocate("tmp", (1,), "float32", "local")
            ib.store(tmp, [0], t.Cast("float32", i))
            ib.store(Y, [i], tmp[0])
        ib.store(Y, [0], tmp[0])
    with pytest.raises(IRError, match="use of buffer 'tmp' outside its scope"):
        verify(ib.get())
