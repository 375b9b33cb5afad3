"""`kiln tune --budget` is the command's budget: starting and closing Ray count, so a
90 s budget ends within 90 s (it once took 106 s: Ray's start came on top). The clock
is injected: no test here times anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kiln_cli import MODEL

import kiln.distributed.executor as executor_module
import kiln.distributed.model_tuning as model_tuning
from kiln.cli.tune import CLOSE_RAY_S, cmd_tune, tuning_budget
from kiln.errors import UsageError


def test_the_time_before_tuning_comes_off_the_budget() -> None:
    assert tuning_budget(90.0, 100.0, 112.0, "ray", "90s") == 90.0 - 12.0 - CLOSE_RAY_S
    assert tuning_budget(90.0, 100.0, 100.5, "in-process", "90s") == 89.5
    with pytest.raises(UsageError, match=r"--budget 10s: starting ray took 12 s of the 10 s "
                                         r"and 3 s are kept for closing it; give a longer "
                                         r"budget, or --in-process"):
        tuning_budget(10.0, 0.0, 12.0, "ray", "10s")


class _SlowStart:
    """An executor whose start took 12 s of the fake clock, as a local Ray's does."""

    def __init__(self, clock: list[float]) -> None:
        clock[0] += 12.0

    def describe(self) -> dict[str, Any]:
        return {"engine": "ray", "address": None, "nodes": []}

    def close(self) -> None:
        pass


def test_cmd_tune_gives_the_tuning_what_is_left(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    now = [1000.0]
    given: list[float] = []

    def tune_model(model: str, tgt: Any, budget_s: float, output: str, **_: Any) -> Any:
        given.append(budget_s)
        raise UsageError("stop here")  # what follows is tests/tuning's

    monkeypatch.setattr(executor_module, "make_executor",
                        lambda *a, **k: _SlowStart(now))
    monkeypatch.setattr(model_tuning, "tune_model", tune_model)
    with pytest.raises(UsageError, match="stop here"):
        cmd_tune(str(MODEL), None, "90s", str(tmp_path / "db.json"), None, False, {}, None,
                 clock=lambda: now[0])
    assert given == [90.0 - 12.0 - CLOSE_RAY_S]
    assert f"budget: {given[0]:.0f} s of 90 s left for tuning" in capsys.readouterr().out
