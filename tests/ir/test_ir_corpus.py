"""Every corpus module verifies, is alpha-equal to a rebuild, and evaluates to its reference."""

from __future__ import annotations

import numpy as np
import pytest

from corpus import (
    CORPUS,
    assert_outputs_match,
    run_interpreter,
    run_reference,
)
from kiln.errors import CallError, IRError
from kiln.ir import graph as g
from kiln.ir import structural_equal, verify

HAND_BUILT = {name: case for name, case in CORPUS.items() if "dsl" not in case.tags}
DSL = {name: case for name, case in CORPUS.items() if "dsl" in case.tags}

FUNCTIONS = [(name, fn) for name, case in HAND_BUILT.items() for fn in case.functions()]


def test_corpus_size_and_coverage() -> None:
    assert len(HAND_BUILT) >= 30
    kinds = {type(fn).__name__ for case in HAND_BUILT.values()
             for fn in case.module().functions.values()}
    assert kinds == {"PrimFunc", "Function"}
    graphs = [case for case in HAND_BUILT.values() if case.module().graph_funcs()]
    assert any(len(case.module().prim_funcs()) >= 3 for case in graphs)


@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_every_function_has_a_reference(name: str) -> None:
    case = HAND_BUILT[name]
    missing = [fn for fn in case.functions() if fn not in case.reference]
    assert not missing, f"{name}: no numpy reference for {missing}"


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_verifies_and_rebuilds_alpha_equal(name: str) -> None:
    case = CORPUS[name]
    mod = case.module()
    verify(mod)
    rebuilt = case.build()
    assert rebuilt is not mod
    assert structural_equal(mod, rebuilt)


@pytest.mark.parametrize(("name", "func"), FUNCTIONS, ids=[f"{n}.{f}" for n, f in FUNCTIONS])
def test_interpreter_matches_reference(name: str, func: str) -> None:
    case = HAND_BUILT[name]
    for seed in (0, 1):
        args = case.args(func, np.random.default_rng(seed))
        expected = run_reference(case, func, args)
        actual = run_interpreter(case, func, args)
        assert_outputs_match(case, expected, actual, f"{name}.{func} (seed {seed})")


def test_interpreter_leaves_inputs_alone() -> None:
    case = CORPUS["conv2d_nchw"]
    args = case.args("conv2d_nchw", np.random.default_rng(3))
    before = [a.copy() for a in args]
    run_interpreter(case, "conv2d_nchw", args)  # works on copies
    from kiln.ir import evaluate

    evaluate(case.module(), "conv2d_nchw", *args)
    for a, b in zip(args[:3], before[:3]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(args[3], before[3])


DSL_FUNCTIONS = [(name, fn) for name, case in DSL.items() for fn in case.functions()]


@pytest.mark.skipif(not DSL, reason="the DSL corpus (tests/script/dsl_corpus.py) is absent")
@pytest.mark.parametrize(("name", "func"), DSL_FUNCTIONS,
                         ids=[f"{n}.{f}" for n, f in DSL_FUNCTIONS])
def test_dsl_corpus_evaluates(name: str, func: str) -> None:
    """DSL modules run in the interpreter; those with inputs match their expected output."""
    case = DSL[name]
    try:
        args = case.args(func, np.random.default_rng(0))
    except ValueError as exc:  # symbolic shapes without explicit inputs
        pytest.skip(str(exc))
    if func in case.reference:
        assert_outputs_match(case, run_reference(case, func, args),
                             run_interpreter(case, func, args), f"{name}.{func}")
        return
    try:
        result = run_interpreter(case, func, args)
    except CallError as exc:
        # Random inputs may be invalid for the function (a zero divisor, an index).
        pytest.skip(f"random inputs rejected at run time: {exc}")
    except IRError as exc:
        if "unknown operator" not in str(exc):
            raise
        pytest.skip(f"the DSL text uses an operator kiln.ops does not define: {exc}")
    if isinstance(case.module()[func], g.Function):
        assert result is not None
