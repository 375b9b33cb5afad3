"""Every module of the DSL corpus: parse, print, parse again; equal, and printing is stable."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from dsl_corpus import CORPUS_CASES, DSL_CORPUS
from dsl_strict_equal import assert_roundtrip_equal

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.script import from_source, print_module


def test_corpus_is_large_and_covers_both_levels() -> None:
    assert len(DSL_CORPUS) >= 30
    mods = [from_source(text) for text in DSL_CORPUS.values()]
    assert sum(len(m.graph_funcs()) for m in mods) >= 8
    assert sum(len(m.prim_funcs()) for m in mods) >= 35


@pytest.mark.parametrize("name", sorted(DSL_CORPUS))
def test_corpus_round_trip(name: str) -> None:
    mod = from_source(DSL_CORPUS[name])
    text = print_module(mod)
    again = from_source(text)
    assert_roundtrip_equal(again, mod)
    # Printed names are unique and valid, so a second trip keeps every name hint.
    assert_roundtrip_equal(from_source(print_module(again)), again, names=True)
    # Idempotence: parse(print(parse(text))) prints identically.
    assert print_module(again) == text
    assert mod.script() == text


@pytest.mark.parametrize("mode", ["inline", "reference"])
@pytest.mark.parametrize("name", ["metadata_section", "mlp_graph", "alloc_const_inline"])
def test_corpus_metadata_modes(name: str, mode: str) -> None:
    mod = from_source(DSL_CORPUS[name])
    text = print_module(mod, metadata=mode, inline_limit=4)
    assert "meta = {" not in text
    if mode == "inline":
        assert "meta[" not in text and text.metadata == {}
        again = from_source(text)
    else:
        assert "meta[" in text and text.metadata
        again = from_source(text, metadata=text.metadata)
    assert_roundtrip_equal(again, mod)


def _all_nodes(mod: IRModule) -> set[str]:
    seen: set[str] = set()

    def visit(x: object) -> None:
        seen.add(type(x).__name__)
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
        elif isinstance(x, (t.PrimExpr, t.Stmt, t.PrimFunc, g.Expr, g.Function, g.Binding,
                            t.Buffer)):
            for field in type(x).__dataclass_fields__:  # type: ignore[attr-defined]
                visit(getattr(x, field))

    for _, fn in mod.items():
        visit(fn)
    return seen


def test_corpus_covers_every_node_type() -> None:
    seen: set[str] = set()
    for text in DSL_CORPUS.values():
        seen |= _all_nodes(from_source(text))
    expected = {
        "Var", "Const", "BinaryOp", "Compare", "UnaryOp", "Select", "Cast", "Load", "Intrin",
        "CallExtern", "Buffer", "Store", "SeqStmt", "For", "LetStmt", "IfThenElse", "Allocate",
        "AllocConst", "DeclBuffer", "Evaluate", "CallFunc", "PrimFunc", "Constant", "Call",
        "CallTensor", "Tuple", "TupleGetItem", "Binding", "Function",
    }
    assert expected <= seen, expected - seen


def _evaluate_or_skip() -> object:
    try:
        from kiln.ir.evaluate import evaluate
    except ImportError:
        pytest.skip("kiln.ir.evaluate is not available yet")
    return evaluate


@pytest.mark.parametrize("name", sorted(CORPUS_CASES))
def test_corpus_semantics_survive_round_trip(name: str) -> None:
    """The parsed and the re-parsed module compute the numpy reference."""
    evaluate = _evaluate_or_skip()
    fn, inputs, out, ref = CORPUS_CASES[name]()
    for mod in (from_source(DSL_CORPUS[name]),
                from_source(print_module(from_source(DSL_CORPUS[name])))):
        args = [a.copy() for a in inputs]
        evaluate(mod, fn, *args)  # type: ignore[operator]
        np.testing.assert_allclose(args[out], ref, rtol=1e-5, atol=1e-5)


def _ir_corpus() -> dict[str, object]:
    """The hand-built IR corpus of tests/corpus (IRBuilder), when it is there."""
    try:
        corpus = importlib.import_module("corpus")
    except ImportError:
        return {}
    return {k: v for k, v in corpus.CORPUS.items() if not k.startswith("dsl_")}


IR_CORPUS = _ir_corpus()


@pytest.mark.skipif(not IR_CORPUS, reason="tests/corpus is not available")
@pytest.mark.parametrize("name", sorted(IR_CORPUS))
def test_hand_built_ir_corpus_round_trip(name: str) -> None:
    """IR built with IRBuilder elsewhere prints and parses back exactly."""
    mod = IR_CORPUS[name].module()  # type: ignore[attr-defined]
    text = print_module(mod)
    again = from_source(text)
    assert_roundtrip_equal(again, mod)
    assert print_module(again) == text
