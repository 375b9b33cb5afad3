"""The IR test corpus: small modules every analysis and backend is tested on.

    from corpus import CORPUS, run_reference, run_interpreter

    case = CORPUS["matmul"]
    mod = case.module()                      # built once with IRBuilder
    args = case.args("matmul", rng)          # valid inputs (random by dtype by default)
    expected = run_reference(case, "matmul", args)   # numpy, written independently
    actual = run_interpreter(case, "matmul", args)   # kiln.ir.evaluate
    assert_outputs_match(case, expected, actual)

Every function of every hand-built case has a numpy reference. Cases whose
name starts with `dsl_` come from the DSL corpus (tests/script/dsl_corpus.py,
parsed with kiln.script.from_source) when it exists; they have no reference and
are checked against the interpreter only. `tags` mark features a backend may
need to opt into: "extern" (links libm), "graph" (has a graph-level main),
"constants" (weights), "float16".
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from . import elementwise, graphs, integers, layout, nn, reductions, structure
from ._case import (
    CorpusCase,
    assert_outputs_match,
    random_args,
    random_value,
    run_interpreter,
    run_reference,
)

__all__ = [
    "CORPUS", "CorpusCase", "assert_outputs_match", "random_args", "random_value",
    "run_interpreter", "run_reference",
]


def _dsl_cases() -> list[CorpusCase]:
    """Cases parsed from the DSL corpus, if both it and kiln.script are available.

    Entries of its `CORPUS_CASES` (function, inputs, output index, expected
    output) become the case's inputs and reference.
    """
    path = Path(__file__).resolve().parents[1] / "script" / "dsl_corpus.py"
    try:
        from_source = importlib.import_module("kiln.script").from_source
        # Loaded by path: this package is imported as `tests.corpus` or as `corpus`.
        spec = importlib.util.spec_from_file_location("_kiln_dsl_corpus", path)
        if spec is None or spec.loader is None or not path.exists():
            return []
        dsl = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(dsl)
    except (ImportError, AttributeError):
        return []
    texts: dict[str, str] = getattr(dsl, "DSL_CORPUS", {})
    checks: dict[str, Any] = getattr(dsl, "CORPUS_CASES", {})
    cases = []
    for name, text in texts.items():
        case = CorpusCase(f"dsl_{name}", _parser(from_source, text), tags=frozenset({"dsl"}))
        if name in checks:
            func, inputs, out, expected = checks[name]()
            case.inputs = _fixed_inputs(func, inputs)
            case.reference = {func: _fixed_reference(expected, out)}
        cases.append(case)
    return cases


def _parser(from_source: Any, text: str) -> Any:
    return lambda: from_source(text)


def _fixed_inputs(func: str, inputs: list[Any]) -> Any:
    def make(rng: Any, name: str) -> list[Any] | None:
        if name != func:
            return None
        return [a.copy() if hasattr(a, "copy") else a for a in inputs]
    return make


def _fixed_reference(expected: Any, out: int) -> Any:
    # Our reference protocol returns the trailing buffers from `out` on; buffers
    # after the output must come back unchanged.
    def reference(*args: Any) -> Any:
        rest = args[out + 1:]
        return (expected, *rest) if rest else expected
    return reference


def _collect() -> dict[str, CorpusCase]:
    cases: dict[str, CorpusCase] = {}
    for module in (elementwise, reductions, nn, layout, integers, structure, graphs):
        for case in module.CASES:
            if case.name in cases:
                raise ValueError(f"duplicate corpus case {case.name!r}")
            cases[case.name] = case
    for case in _dsl_cases():
        cases.setdefault(case.name, case)
    return cases


CORPUS: dict[str, CorpusCase] = _collect()
