"""onnxruntime scripts run unchanged with `rt = kiln` (issue 62's acceptance).

Each script of compat_scripts.py runs with onnxruntime and with kiln over one small
MLP (compiled once: the other sessions hit the compile cache). kiln must do as
onnxruntime did (equal values, or both raise), or raise a KilnError, or differ where
REASONS says why; never an AttributeError. docs/session.md's table is current.
"""

from __future__ import annotations

import pytest
from compat_scripts import REASONS, SCRIPTS
from compat_table import Outcome, difference, documented, outcomes, render, write_mlp

import kiln

pytestmark = pytest.mark.xdist_group("ort_compat")  # one worker computes the pairs


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Outcome, Outcome]]:
    model = write_mlp(tmp_path_factory.mktemp("compat") / "compat_mlp.onnx")
    return outcomes(model)


def test_there_are_dozens_of_scripts() -> None:
    assert len(SCRIPTS) >= 30


def test_kiln_runs_each_script_as_onnxruntime_or_says_why(
        pairs: dict[str, tuple[Outcome, Outcome]]) -> None:
    problems = []
    for name, (ort, got) in pairs.items():
        if got.error is not None and not isinstance(got.error, kiln.KilnError):
            # an AttributeError included: an onnxruntime name kiln neither has nor refuses
            problems.append(f"{name}: kiln raised {type(got.error).__name__}: {got.error}")
        elif difference(ort, got) is not None and name not in REASONS:
            problems.append(f"{name}: onnxruntime {ort.describe()} ({ort.error}), kiln "
                            f"{difference(ort, got)} ({got.error}) with no reason listed")
    stale = [n for n in REASONS if n in pairs and difference(*pairs[n]) is None]
    assert not problems, "\n".join(problems)
    assert not stale, f"REASONS lists scripts that now run the same: {stale}"


def test_the_table_in_docs_session_md_is_current(
        pairs: dict[str, tuple[Outcome, Outcome]]) -> None:
    assert documented() == render(pairs), (
        "docs/session.md's compatibility table is stale: run "
        "PYTHONPATH=src:tests:tests/session/compat python tests/session/compat/make_table.py")

