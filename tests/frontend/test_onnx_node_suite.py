"""The ONNX backend node test cases (onnx.backend.test.case.node) through kiln,
next to onnxruntime.

Every case whose op types kiln imports is imported with `from_onnx` and run:
- through the reference interpreter after legalization (every op lowered to its
  PrimFunc, run by `kiln.ir.evaluate`): all cases but a few slow 3-D pools;
- compiled for `llvm` and run through `jit()`: a deterministic sample (one case
  per op-type/dtype group of small graphs, the slow 3-D pools, and a case of
  every op type);
- compiled for `c` and run through `jit()`: a case of every op type.
Outputs are compared with the suite's reference outputs (node_suite.check_outputs).
onnxruntime runs every case (in a child process); each case it passes and kiln
does not has a recorded reason (node_suite's XFAIL and MISSING_OP_REASONS).
Known-unsupported variants are XFAIL entries with reasons; a case listed there
that passes fails the test, so the list stays exact. docs/onnx.md is generated
from the same run (tests/frontend/onnx_report.py); test_docs_table_is_current
checks its collection-derived columns cheaply.
"""

from __future__ import annotations

import functools
from pathlib import Path

import node_suite as ns
import onnx_report
import pytest

# One worker runs this whole file (`make test` distributes with --dist loadgroup; see
# requirements.txt for the pytest versions where that grouping works), and each outcome
# list is computed once per process (the fixtures read functools caches).
pytestmark = pytest.mark.xdist_group("onnx_node_suite")

MIN_PASSING = 500
DOCS = Path(__file__).parents[2] / "docs" / "onnx.md"


@functools.cache
def _cases() -> tuple[list[ns.Case], list[ns.Outcome]]:
    return ns.all_cases()


def _report(outcomes: list[ns.Outcome]) -> str:
    bad = [o for o in outcomes if o.status in ("fail", "xpass")]
    lines = [f"{o.status.upper()} {o.name} [{', '.join(sorted(o.op_types))}]: {o.reason}"
             for o in bad]
    return f"{len(bad)} unexpected outcome(s):\n" + "\n".join(lines)


def _runnable_op_types() -> set[str]:
    cases, _ = _cases()
    return {op for c in cases if not ns.xfail_reason(c.name) for op in c.op_types}


@functools.cache
def _interpreter_outcomes() -> list[ns.Outcome]:
    cases, _ = _cases()
    return [ns.run_case(c, ns.execute_interpreter) for c in cases
            if not ns.compiled_only(c.name)]


@pytest.fixture
def interpreter_outcomes() -> list[ns.Outcome]:
    return _interpreter_outcomes()


def test_node_suite_through_the_interpreter(interpreter_outcomes: list[ns.Outcome]) -> None:
    bad = [o for o in interpreter_outcomes if o.status in ("fail", "xpass")]
    assert not bad, _report(interpreter_outcomes)


@functools.cache
def _compiled_outcomes() -> list[ns.Outcome]:
    cases, _ = _cases()
    return ns.run_compiled(ns.compiled_sample(cases), "llvm")


@pytest.fixture
def compiled_outcomes() -> list[ns.Outcome]:
    return _compiled_outcomes()


def test_node_suite_compiled_for_llvm(compiled_outcomes: list[ns.Outcome]) -> None:
    cases, _ = _cases()
    assert len(compiled_outcomes) == len(ns.compiled_sample(cases)) > 250
    bad = [o for o in compiled_outcomes if o.status in ("fail", "xpass")]
    assert not bad, _report(compiled_outcomes)
    uncovered = _runnable_op_types() - {op for o in compiled_outcomes for op in o.op_types}
    assert not uncovered, f"op types without a compiled llvm case: {sorted(uncovered)}"


@functools.cache
def _c_outcomes() -> list[ns.Outcome]:
    cases, _ = _cases()
    return ns.run_compiled(ns.c_sample(cases), "c")


@pytest.fixture
def c_outcomes() -> list[ns.Outcome]:
    return _c_outcomes()


def test_node_suite_compiled_for_c(c_outcomes: list[ns.Outcome]) -> None:
    bad = [o for o in c_outcomes if o.status in ("fail", "xpass")]
    assert not bad, _report(c_outcomes)
    uncovered = _runnable_op_types() - {op for o in c_outcomes for op in o.op_types}
    assert not uncovered, f"op types without a compiled c case: {sorted(uncovered)}"


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


def test_unsupported_cases_name_their_missing_ops_and_why() -> None:
    _, unsupported = _cases()
    assert unsupported, "the suite has cases of ops kiln lacks (e.g. Scan)"
    for o in unsupported:
        if o.reason.startswith("no converter for "):
            missing = ns.missing_by_case()[o.name]
            assert missing and all(f"{op} ({ns.missing_op_reason(op)})" in o.reason
                                   for op in missing), o
        else:
            assert o.reason.endswith(ns.NON_TENSOR_REASON), o


@functools.cache
def _onnxruntime_outcomes() -> list[ns.Outcome]:
    return ns.run_onnxruntime()


@pytest.fixture
def onnxruntime_outcomes() -> list[ns.Outcome]:
    return _onnxruntime_outcomes()


def test_onnxruntime_runs_every_case(onnxruntime_outcomes: list[ns.Outcome]) -> None:
    assert len(onnxruntime_outcomes) == len({o.name for o in onnxruntime_outcomes})
    cases, unsupported = _cases()
    assert {o.name for o in onnxruntime_outcomes} == \
        {c.name for c in cases} | {o.name for o in unsupported}
    assert sum(o.status == "pass" for o in onnxruntime_outcomes) > 1400
    for o in onnxruntime_outcomes:
        assert o.status in ("pass", "fail", "refused")
        assert (o.status == "pass") == (o.reason == ""), o


def test_every_case_onnxruntime_passes_kiln_passes_or_has_a_reason(
        interpreter_outcomes: list[ns.Outcome], compiled_outcomes: list[ns.Outcome],
        onnxruntime_outcomes: list[ns.Outcome]) -> None:
    _, unsupported = _cases()
    results = onnx_report.SuiteResults(interpreter_outcomes, compiled_outcomes, [],
                                       unsupported, onnxruntime_outcomes, len(ns.raw_cases()))
    unexplained = []
    for _, k in onnx_report.gap(results):
        if k.status == "xfail":
            continue  # its reason is its XFAIL entry's
        if k.status == "unsupported" and "no reason recorded" not in k.reason:
            continue
        unexplained.append(f"{k.name}: {k.status} {k.reason}")
    assert not unexplained, ("cases onnxruntime passes and kiln does not, without a "
                             "recorded reason (node_suite XFAIL / MISSING_OP_REASONS):\n"
                             + "\n".join(unexplained))


def test_docs_table_is_current() -> None:
    """docs/onnx.md's table matches a fresh collection: its op types and, per op type,
    the cases, kiln passes, expected failures and cases not run (all decided by the
    collection, since every run case passes or is an XFAIL). Cheap: nothing is run."""
    cases, unsupported = _cases()
    fresh = onnx_report.collection_counts(cases, unsupported)
    docs = onnx_report.table_counts(onnx_report.generated_section(DOCS))
    stale = sorted(set(fresh) ^ set(docs)) + \
        sorted(op for op in set(fresh) & set(docs) if fresh[op] != docs[op])
    assert not stale, (f"docs/onnx.md is out of date for op type(s) {stale}: run "
                       ".venv/bin/python tests/frontend/onnx_report.py")
    assert f"- test cases in the suite: **{len(ns.raw_cases())}**" in \
        onnx_report.generated_section(DOCS)
