"""The ONNX backend node test cases (onnx.backend.test.case.node) through kiln.

Every case whose op types kiln supports is imported with `from_onnx` and run:
- through the reference interpreter after legalization (every op lowered to its
  PrimFunc, run by `kiln.ir.evaluate`): all cases but a few slow 3-D pools;
- compiled for `llvm` and run through `jit()`: a deterministic sample (one case
  per op-type/dtype group of small graphs, and the slow 3-D pools).
Outputs are compared with the suite's reference outputs (node_suite.check_outputs).
Known-unsupported variants are XFAIL entries with reasons; a case listed there
that passes fails the test, so the list stays exact. docs/onnx.md is generated
from the same run (tests/frontend/onnx_report.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import node_suite as ns
import pytest

MIN_PASSING = 500


@functools.cache
def _cases() -> tuple[list[ns.Case], list[ns.Outcome]]:
    return ns.all_cases()


def _report(outcomes: list[ns.Outcome]) -> str:
    bad = [o for o in outcomes if o.status in ("fail", "xpass")]
    lines = [f"{o.status.upper()} {o.name} [{', '.join(sorted(o.op_types))}]: {o.reason}"
             for o in bad]
    return f"{len(bad)} unexpected outcome(s):\n" + "\n".join(lines)


@pytest.fixture(scope="module")
def interpreter_outcomes() -> list[ns.Outcome]:
    cases, _ = _cases()
    return [ns.run_case(c, ns.execute_interpreter) for c in cases
            if not ns.compiled_only(c.name)]


def test_node_suite_through_the_interpreter(interpreter_outcomes: list[ns.Outcome]) -> None:
    bad = [o for o in interpreter_outcomes if o.status in ("fail", "xpass")]
    assert not bad, _report(interpreter_outcomes)


@pytest.fixture(scope="module")
def compiled_outcomes() -> list[ns.Outcome]:
    cases, _ = _cases()
    return ns.run_compiled(ns.compiled_sample(cases), "llvm")


def test_node_suite_compiled_for_llvm(compiled_outcomes: list[ns.Outcome]) -> None:
    cases, _ = _cases()
    assert len(compiled_outcomes) == len(ns.compiled_sample(cases)) > 250
    bad = [o for o in compiled_outcomes if o.status in ("fail", "xpass")]
    assert not bad, _report(compiled_outcomes)


def test_enough_cases_pass_and_xfails_are_explained(
        interpreter_outcomes: list[ns.Outcome]) -> None:
    passing = [o for o in interpreter_outcomes if o.status == "pass"]
    assert len(passing) >= MIN_PASSING
    for o in interpreter_outcomes:
        if o.status == "xfail":
            assert o.reason == ns.xfail_reason(o.name)
    # every XFAIL pattern still matches a case (stale entries are removed)
    names = [o.name for o in interpreter_outcomes]
    for pattern in ns.XFAIL:
        assert any(ns.re.search(pattern, n) for n in names), f"stale XFAIL entry {pattern!r}"


def test_unsupported_cases_name_their_missing_ops() -> None:
    _, unsupported = _cases()
    assert unsupported, "the suite has cases of ops kiln lacks (e.g. LSTM)"
    for o in unsupported:
        assert o.reason.startswith("no converter for ")
        assert not ns.supported(o.op_types)


def test_docs_table_is_current(interpreter_outcomes: list[ns.Outcome],
                               compiled_outcomes: list[ns.Outcome]) -> None:
    import onnx_report

    _, unsupported = _cases()
    fresh = onnx_report.render(interpreter_outcomes, compiled_outcomes, unsupported,
                               len(ns.raw_cases()))
    docs = Path(__file__).parents[2] / "docs" / "onnx.md"
    assert onnx_report.without_date(onnx_report.generated_section(docs)) == \
        onnx_report.without_date(fresh), (
        "docs/onnx.md is out of date: run .venv/bin/python tests/frontend/onnx_report.py")
