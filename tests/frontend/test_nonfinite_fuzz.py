"""kiln against onnxruntime on non-finite inputs: the node suite's cases on inputs holding
NaN, infinities, signed zeros, subnormals and values near the float limits
(tests/frontend/nonfinite.py; docs/onnx.md, *Non-finite values*).

The cases are those the node suite compiles (`compiled_sample` for llvm, `c_sample` for
c) that have a float data input, plus a case of every op type they miss that
onnxruntime runs; their modules are the node suite's (node_suite.run_compiled compiles
a case once per process), so the fuzz costs the variants' runs and one onnxruntime
child process per target, the second's for the cases the first did not run (the
variants do not depend on the target: nonfinite._onnxruntime_runs). Every difference
must be covered by an ALLOW entry (nonfinite.py), and every entry must still cover
one: a fixed difference fails the test until its entry is removed.
bench/fuzz_nonfinite.py runs every case by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import node_suite as ns
import nonfinite as nf
import pytest

# The node suite's worker: the compiled modules and the collected cases are shared.
pytestmark = pytest.mark.xdist_group("onnx_node_suite")

TARGETS = ("llvm", "c")
MIN_OP_TYPES = 150
# Position draws per pattern: the variants cost little next to the compiled modules.
SEEDS = 2


@functools.cache
def _cases() -> tuple[list[ns.Case], list[ns.Outcome]]:
    return ns.all_cases()


@functools.cache
def _report(target: str) -> nf.Report:
    cases, _ = _cases()
    return nf.fuzz(nf.suite_selection(cases, target), target, seeds=SEEDS,
                   pool=nf.eligible(cases))


def _listing(results: list[nf.Result]) -> str:
    return "\n".join(f"{r.case} [{r.variant}] ({', '.join(sorted(r.op_types))}): {r.detail}"
                     for r in results)


@pytest.mark.parametrize("target", TARGETS)
def test_kiln_matches_onnxruntime_on_non_finite_inputs(target: str) -> None:
    """Every variant's outputs equal onnxruntime's NaN-aware, or ALLOW says why not."""
    report = _report(target)
    new = [r for r in report.differences() if not nf.allowed_by(r)]
    if new:
        pytest.fail(f"{report.summary()}\n{len(new)} difference(s) from onnxruntime no "
                    f"nonfinite.ALLOW entry covers:\n{_listing(new)}", pytrace=False)


def test_every_allow_list_entry_still_covers_a_difference() -> None:
    """As the node suite's XFAIL: an entry whose difference is gone must be removed."""
    differing = [r for t in TARGETS for r in _report(t).differences()]
    stale = [k for k in nf.ALLOW if not any(k in nf.allowed_by(r) for r in differing)]
    assert not stale, f"nonfinite.ALLOW entries that no longer differ (remove them): {stale}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_op_type_onnxruntime_runs_is_fuzzed(target: str) -> None:
    """Each op type of the eligible cases is fuzzed, unless every case with it was left
    out (onnxruntime refuses or fails them all on the prepared model, or kiln fails)."""
    cases, _ = _cases()
    report = _report(target)
    pool = nf.eligible(cases)
    unfuzzed = {op for c in pool for op in c.op_types} - report.op_types()
    runnable = {op for op in unfuzzed
                if any(op in c.op_types and c.name not in report.left_out for c in pool)}
    assert not runnable, f"op types with a case onnxruntime runs, not fuzzed: {runnable}"
    assert len(report.op_types()) >= MIN_OP_TYPES, report.summary()


def test_summary(capsys: pytest.CaptureFixture[str],
                 record_property: Callable[[str, object], None]) -> None:
    """The counts of both targets, printed past pytest's capture (docs/onnx.md quotes
    them) and recorded as a property of this test."""
    lines = [_report(t).summary() for t in TARGETS]
    for line in lines:
        record_property("non-finite fuzz", line)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert all(_report(t).results for t in TARGETS)
