"""Every tensor-level function of the IR corpus, compiled with llvmjit, vs the interpreter."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llvm_helpers import jit

from kiln.ir.tensor import Buffer, PrimFunc

TESTS = Path(__file__).resolve().parent.parent


def _corpus_cases() -> list[Any]:
    corpus_dir = TESTS / "corpus"
    if not corpus_dir.is_dir():
        return []
    cases: list[Any] = []
    for info in pkgutil.iter_modules([str(corpus_dir)]):
        if not info.name.startswith("_"):
            cases.extend(getattr(importlib.import_module(f"corpus.{info.name}"), "CASES", []))
    return cases


CASES = _corpus_cases()


def _prim_funcs(case: Any) -> list[str]:
    """Plain tensor-level functions with static parameter shapes (what the ABI describes)."""
    return [n for n, f in case.module().functions.items()
            if isinstance(f, PrimFunc) and not f.attrs.get("kiln.graph")
            and all(isinstance(d, int) for b in f.buffer_params for d in b.shape)]


@pytest.mark.skipif(not CASES, reason="the IR corpus (tests/corpus) is not available")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_case_matches_the_interpreter(case: Any) -> None:
    from corpus._case import assert_outputs_match, run_interpreter

    names = _prim_funcs(case)
    if not names:
        pytest.skip(f"{case.name} has no tensor-level function with static shapes")
    mod = case.module()
    graph = [n for n in mod.functions if n not in names]
    m = jit(mod.without(*graph))
    rng = np.random.default_rng(0)
    for name in names:
        # Give every buffer its parameter's exact shape (0-d buffers may come back as (1,)).
        args = [np.asarray(a).reshape(p.shape) if isinstance(p, Buffer) else a
                for a, p in zip(case.args(name, rng), mod[name].params)]
        expected = run_interpreter(case, name, args)
        actual = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        m[name](*actual)
        assert_outputs_match(case, expected, actual, f"{case.name}.{name}")
