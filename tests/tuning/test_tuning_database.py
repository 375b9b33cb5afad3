"""The tuning database and selection rule: deterministic choices from recorded
timings, never a slower or different kernel, strict reading of untrusted files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kiln.errors import FormatError, UsageError
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.tuning import Measurement, Record, TuningDatabase, choose, parse_budget, target_key
from kiln.tuning.select import noise

RNG = np.random.default_rng(3)


def _times(median: float, spread: float, n: int = 15) -> tuple[float, ...]:
    return tuple(float(t) for t in median * (1 + spread * RNG.standard_normal(n)))


@pytest.mark.parametrize(("text", "seconds"), [
    ("10m", 600), ("120s", 120), ("1h30m", 5400), ("90", 90), ("1.5m", 90), (" 2M ", 120)])
def test_budgets(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "10x", "m", "5 m", "-3s", "10s5"])
def test_bad_budgets(text: str) -> None:
    with pytest.raises(UsageError, match="budget"):
        parse_budget(text)


def test_a_candidate_wins_only_beyond_the_noise() -> None:
    default = _times(100, 0.01)
    assert choose(default, [(_times(99, 0.01), True)]) is None  # 1 %: within noise
    assert choose(default, [(_times(80, 0.01), True), (_times(70, 0.01), True)]) == 1
    assert choose(default, [(_times(70, 0.01), False)]) is None  # different result
    assert choose(default, [(_times(120, 0.01), True)]) is None  # slower never wins
    noisy = _times(100, 0.3)
    assert noise(noisy) > 0.15
    assert choose(noisy, [(_times(85, 0.01), True)]) is None  # 15 % inside 30 % noise


def test_the_choice_is_a_function_of_the_recorded_timings(tmp_path: Path) -> None:
    record = Record("gemm", "m=64,n=512,k=256,float32", "x86_64:znver4:abc",
                    Measurement({"mr": 8, "nr": 32}, _times(100, 0.02)),
                    [Measurement({"mr": 6, "nr": 32}, _times(80, 0.02)),
                     Measurement({"mr": 4, "nr": 64}, _times(90, 0.02))])
    db = TuningDatabase([record])
    db.save(tmp_path / "a.json")
    again = TuningDatabase.load(tmp_path / "a.json")
    assert again.to_json() == db.to_json() and again.fingerprint() == db.fingerprint()
    assert again.lookup(*record.key) == {"mr": 6, "nr": 32}
    assert again.lookup("gemm", "m=1,n=1,k=1,float32", "x86_64:znver4:abc") is None
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["format"] == "kiln-tuning" and doc["version"] == 1
    assert doc["records"][0]["chosen"] == {"mr": 6, "nr": 32}


def test_merge_pools_timings_and_decides_again() -> None:
    key = ("conv2d", "c=64,k=3", "x86_64:haswell:def")
    fast_once = Record(*key, Measurement({"cb": 16}, _times(100, 0.01)),
                       [Measurement({"cb": 8}, _times(85, 0.01))])
    slow_later = Record(*key, Measurement({"cb": 16}, _times(100, 0.01)),
                        [Measurement({"cb": 8}, _times(115, 0.01))])
    a, b = TuningDatabase([fast_once]), TuningDatabase([slow_later])
    assert a.lookup(*key) == {"cb": 8}
    merged = a.merge(b)
    (record,) = merged.records()
    assert len(record.default.times_us) == 30 and len(record.candidates[0].times_us) == 30
    assert merged.lookup(*key) is None  # pooled: 100 vs ~100, within the noise


def test_target_keys_follow_the_cpu() -> None:
    keys = {target_key(isa_for(Target(f"llvm -mtriple=x86_64-linux-gnu -mcpu={cpu}")))
            for cpu in ("znver4", "haswell", "skylake-avx512")}
    assert len(keys) == 3
    assert target_key(isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4"))) \
        .startswith("x86_64:znver4:")


@pytest.mark.parametrize(("doc", "message"), [
    ([], "expected an object"),
    ({"format": "other", "version": 1, "records": []}, "'format'"),
    ({"format": "kiln-tuning", "version": 9, "records": []}, "newer than this kiln"),
    ({"format": "kiln-tuning", "version": True, "records": []}, "'version'"),
    ({"format": "kiln-tuning", "version": 1, "records": [{"kernel": "g"}]}, "'signature'"),
    ({"format": "kiln-tuning", "version": 1, "records": [
        {"kernel": "g", "signature": "s", "target": "t",
         "default": {"params": {}, "times_us": [float("nan")]}}]}, "'times_us'"),
    ({"format": "kiln-tuning", "version": 1, "records": [
        {"kernel": "g", "signature": "s", "target": "t",
         "default": {"params": {}, "times_us": [1.0]},
         "candidates": [{"params": [], "times_us": [1.0]}]}]}, "'params'"),
])
def test_bad_files_are_format_errors(tmp_path: Path, doc: object, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=message.replace("(", r"\(")):
        TuningDatabase.load(path)
    path.write_text("[" * 100000)
    with pytest.raises(FormatError, match="not JSON"):
        TuningDatabase.load(path)
