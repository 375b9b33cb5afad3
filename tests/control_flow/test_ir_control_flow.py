"""The IR of control flow: the tensor-level `While` and the graph-level `If` / `Loop`
written in the DSL, printed and parsed back, verified, run by the interpreter and on
llvm and c against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.errors import CallError, IRError
from kiln.ir import assert_structural_equal, evaluate, verify
from kiln.script import from_source, print_module
from kiln.transform.pipeline import default_graph_pipeline

WHILE = '''
@T.prim_func
def collatz(X: T.Buffer((1,), "int64"), Y: T.Buffer((1,), "int64")):
    n = T.allocate((1,), "int64", scope="local")
    n[0] = X[0]
    Y[0] = 0
    while n[0] != 1:
        if n[0] % 2 == 0:
            n[0] = n[0] // 2
        else:
            n[0] = 3 * n[0] + 1
        Y[0] = Y[0] + 1
'''

GRAPH = '''
from kiln.script import G, I, T, ir_module

@ir_module
class Module:
    @G.function
    def add_branch(x: G.Tensor((n, 4), "float32"), y: G.Tensor((n, 4), "float32")
                   ) -> G.Tuple(G.Tensor((n, 4), "float32")):
        G.func_attr({"kiln.private": True})
        z: G.Tensor((n, 4), "float32") = G.op("add", x, y)
        return (z,)

    @G.function
    def mul_branch(x: G.Tensor((n, 4), "float32"), y: G.Tensor((n, 4), "float32")
                   ) -> G.Tuple(G.Tensor((n, 4), "float32")):
        G.func_attr({"kiln.private": True})
        z: G.Tensor((n, 4), "float32") = G.op("multiply", x, y)
        return (z,)

    @G.function
    def body(i: G.Tensor((), "int64"), c: G.Tensor((), "bool"), s: G.Tensor((n, 4), "float32"),
             w: G.Tensor((n, 4), "float32")) -> G.Tuple(
                 G.Tensor((), "bool"), G.Tensor((n, 4), "float32"), G.Tensor((n, 4), "float32")):
        G.func_attr({"kiln.private": True})
        s2: G.Tensor((n, 4), "float32") = G.op("add", s, w)
        return (c, s2, s2)

    @G.function
    def main(c: G.Tensor((), "bool"), x: G.Tensor((n, 4), "float32"),
             y: G.Tensor((n, 4), "float32"), m: G.Tensor((), "int64")) -> G.Tuple(
                 G.Tensor((n, 4), "float32"), G.Tensor((n, 4), "float32"),
                 G.Tensor((3, n, 4), "float32")):
        zt: G.Tuple(G.Tensor((n, 4), "float32")) = G.if_then_else(
            c, [x, y], then_branch="add_branch", else_branch="mul_branch")
        z: G.Tensor((n, 4), "float32") = zt[0]
        r: G.Tuple(G.Tensor((n, 4), "float32"), G.Tensor((3, n, 4), "float32")) = G.loop(
            "body", [z], captures=[y], trip_count=m)
        f: G.Tensor((n, 4), "float32") = r[0]
        sc: G.Tensor((3, n, 4), "float32") = r[1]
        return (z, f, sc)
'''


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_while_round_trips_verifies_and_runs_everywhere() -> None:
    mod = from_source(WHILE)
    verify(mod)
    text = print_module(mod)
    assert "while n[0] != 1:" in text
    assert_structural_equal(from_source(text), mod)
    exes = [kiln.compile(mod, target) for target in ("llvm", "c")]
    for start in (1, 6, 27):
        x = np.array([start], np.int64)
        y = np.zeros(1, np.int64)
        evaluate(mod, "collatz", x, y)
        assert y[0] == _collatz_steps(start)
        for exe in exes:
            y = np.zeros(1, np.int64)
            exe["collatz"](x, y)
            assert y[0] == _collatz_steps(start)


def test_a_while_condition_must_be_bool() -> None:
    mod = from_source(WHILE.replace("while n[0] != 1:", "while n[0]:"))
    with pytest.raises(IRError, match="while condition has dtype int64; it must be bool"):
        verify(mod)


def _graph_reference(c: bool, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    z = x + y if c else x * y
    return z, z + 3 * y, np.stack([z + (k + 1) * y for k in range(3)])


def test_graph_if_and_loop_round_trip_and_run_everywhere() -> None:
    mod = from_source(GRAPH)
    verify(mod)
    assert_structural_equal(from_source(print_module(mod)), mod)
    lowered = default_graph_pipeline()(mod)
    verify(lowered)
    assert_structural_equal(from_source(print_module(lowered)), lowered)
    assert set(lowered.graph_funcs()) == set()  # the bodies were lowered into main
    rng = np.random.default_rng(0)
    exes = [kiln.compile(mod, target) for target in ("llvm", "c")]
    for batch in (1, 3):
        x, y = (rng.normal(0, 1, (batch, 4)).astype(np.float32) for _ in range(2))
        m = np.array(3, np.int64)
        for c in (True, False):
            want = _graph_reference(c, x, y)
            for got in [kiln.evaluate(mod, "main", np.array(c), x, y, m),
                        *(exe["main"](np.array(c), x, y, m) for exe in exes)]:
                for a, b in zip(got, want):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_loop_that_does_not_fill_its_scan_output_fails_the_call(target: str) -> None:
    mod = from_source(GRAPH)
    exe = kiln.compile(mod, target)
    x = np.ones((2, 4), np.float32)
    for m in (2, 4):
        for run in (exe["main"], lambda *a: kiln.evaluate(mod, "main", *a)):
            with pytest.raises(CallError, match="loop: the number of iterations differs from "
                                                "the length of a scan output"):
                run(np.array(True), x, x, np.array(m, np.int64))


@pytest.mark.parametrize("old, new, message", [
    ('then_branch="add_branch"', 'then_branch="nothing"',
     "control flow calls 'nothing', which is missing"),
    ('G.loop(\n            "body", [z], captures=[y], trip_count=m)',
     'G.loop(\n            "body", [z], captures=[y], trip_count=c)',
     "loop trip count has type .*bool.*; it must be a 0-d int64 tensor"),
    ('G.loop(\n            "body", [z], captures=[y], trip_count=m)',
     'G.loop(\n            "body", [z], captures=[], trip_count=m)',
     "'body' takes .* but control flow passes"),
    ('G.loop(\n            "body", [z], captures=[y], trip_count=m)',
     'G.loop(\n            "body", [z], captures=[y])',
     "loop 'body' has neither a trip count nor a condition: it would never end"),
])
def test_the_verifier_checks_branches_and_bodies(old: str, new: str, message: str) -> None:
    assert old in GRAPH
    with pytest.raises(IRError, match=message):
        verify(from_source(GRAPH.replace(old, new)))
