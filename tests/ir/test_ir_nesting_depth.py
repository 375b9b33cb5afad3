"""`nesting_depth` measures IR without recursion, and the walkers that do recurse
(verify, structural_equal, the printer, the interpreter, the DSL parser) refuse
IR deeper than `MAX_NESTING` up front instead of running out of Python frames."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, TensorType, evaluate, structural_equal, verify
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.visitor import MAX_NESTING, check_nesting, nesting_depth
from kiln.script import from_source, print_module


def _sum_chain(terms: int) -> IRModule:
    """Y[0] = X[0] + X[0] + ... (`terms` additions, left-nested): depth terms + 3."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (1,), "int32")
        Y = ib.arg("Y", (1,), "int32")
        e: t.PrimExpr = X[0]
        for _ in range(terms):
            e = e + X[0]
        ib.store(Y, [0], e)
    return ib.get()


def test_depth_of_leaves_expressions_and_statements() -> None:
    x = t.Var("x", "int32")
    assert nesting_depth(x) == 1
    assert nesting_depth(x + 1) == 2
    assert nesting_depth((x + 1) * (x - (x + 2))) == 4
    # Store(1) -> BinaryOp(2) chain ... -> Load(terms + 2) -> index Const(terms + 3)
    mod = _sum_chain(10)
    assert nesting_depth(mod["f"].body) == 13
    assert nesting_depth(mod["f"]) == 13  # a function adds no level
    assert nesting_depth(mod) == 13


def test_depth_of_a_deep_chain_needs_no_frames() -> None:
    x = t.Var("x", "int32")
    e: t.PrimExpr = x
    for _ in range(2 * sys.getrecursionlimit()):
        e = e + 1
    assert nesting_depth(e) == 2 * sys.getrecursionlimit() + 1


def test_depth_of_graph_functions() -> None:
    ty = TensorType((2,), "float32")
    p = g.Var("p", ty)
    e: g.Expr = p
    for _ in range(5):
        e = g.Call("nn.relu", (e,), {}, ty)
    fn = g.Function((p,), (), e)
    assert nesting_depth(fn) == 6
    v = g.Var("v", ty)
    flat = g.Function((p,), (g.Binding(v, g.Call("nn.relu", (p,), {}, ty)),), v)
    assert nesting_depth(flat) == 2


def test_limit_is_inclusive_and_named() -> None:
    at_limit = _sum_chain(MAX_NESTING - 3)
    assert nesting_depth(at_limit) == MAX_NESTING
    check_nesting(at_limit, "here")
    over = _sum_chain(MAX_NESTING - 2)
    with pytest.raises(IRError, match=rf"^here: nested too deeply \(depth {MAX_NESTING + 1} > "
                                      rf"limit {MAX_NESTING}\)"):
        check_nesting(over, "here")
    for run in (lambda: verify(over), lambda: print_module(over),
                lambda: structural_equal(over, over),
                lambda: evaluate(over, "f", np.ones(1, np.int32), np.zeros(1, np.int32))):
        with pytest.raises(IRError, match="nested too deeply"):
            run()


def _nested_calls(levels: int, fn: object) -> object:
    return fn() if levels == 0 else _nested_calls(levels - 1, fn)  # type: ignore[operator]


def test_walkers_have_headroom_at_the_limit() -> None:
    """IR exactly at the limit is verified, compared, printed, parsed and evaluated
    even when the caller already uses 200 Python frames."""
    mod = _sum_chain(MAX_NESTING - 3)

    def walk_all() -> None:
        verify(mod)
        assert structural_equal(mod, _sum_chain(MAX_NESTING - 3))
        text = print_module(mod)
        assert structural_equal(from_source(text), mod)
        y = np.zeros(1, np.int32)
        evaluate(mod, "f", np.array([2], np.int32), y)
        assert y[0] == 2 * (MAX_NESTING - 2)

    _nested_calls(200, walk_all)


def test_parser_refuses_deep_text_before_walking_it() -> None:
    head = ("@T.prim_func\ndef f(X: T.Buffer((1,), \"int32\"), Y: T.Buffer((1,), "
            "\"int32\")):\n    Y[0] = ")
    # Past the token bound: refused before Python's own parser runs.
    with pytest.raises(IRError, match=r"nested too deeply \(depth up to \d+ > limit"):
        from_source(head + " + ".join(["X[0]"] * 50_000) + "\n")
    # Under the token bound but deeper than the parser's limit once parsed.
    with pytest.raises(IRError, match=r"nested too deeply \(depth \d+ > limit"):
        from_source(head + " + ".join(["X[0]"] * (MAX_NESTING + 20)) + "\n")
    # Long flat lists are not deep.
    values = ", ".join(str(k) for k in range(20_000))
    mod = from_source(head.replace("(1,)", "(20000,)", 1).replace("Y[0] = ", "")
                      + f"w = T.alloc_const([{values}], \"int32\")\n    Y[0] = w[19999]\n")
    y = np.zeros(1, np.int32)
    evaluate(mod, "f", np.zeros(20_000, np.int32), y)
    assert y[0] == 19_999
