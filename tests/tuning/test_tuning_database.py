"""The tuning database and selection rule: deterministic choices from recorded
timings, never a slower or different kernel, strict reading of untrusted files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from kiln.errors import FormatError, UsageError
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.tuning import Measurement, Record, TuningDatabase, choose, parse_budget, target_key
from kiln.tuning.select import MIN_PAIRS, noise, ratio_bounds, undecided

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


def _drifting(n: int = 15) -> tuple[float, ...]:
    """A default whose samples drift 2x over the run (another process came and went)."""
    return tuple(100.0 * (1 + (i % 5) / 4) for i in range(n))


def test_a_candidate_wins_only_when_its_paired_ratio_bound_says_faster() -> None:
    default = _times(100, 0.01)

    def paired(factor: float, spread: float = 0.01) -> tuple[tuple[float, ...], ...]:
        return tuple(d * factor * (1 + spread * float(e)) for d, e in
                     zip(default, RNG.standard_normal(len(default)), strict=True)),

    assert choose([(*paired(0.99), default, True)]) is None  # 1 %: under MIN_GAIN
    assert choose([(*paired(0.8), default, True), (*paired(0.7), default, True)]) == 1
    assert choose([(*paired(0.7), default, False)]) is None  # different result
    assert choose([(*paired(1.2), default, True)]) is None  # slower never wins
    # 15 % faster inside 30 % per-block noise: the bound does not say faster
    assert choose([(*paired(0.85, 0.3), default, True)]) is None
    # too few pairs to bound a median at all
    few = default[:MIN_PAIRS - 1]
    assert choose([(tuple(t / 2 for t in few), few, True)]) is None


def test_pairs_cancel_drift_that_hides_a_gain_from_unpaired_spreads() -> None:
    """The default drifts 2x within the run (a relative interquartile spread of 50 %),
    the candidate moves with it, 10 % faster block by block: the paired ratios are
    tight, the candidate wins; the same timings shuffled out of their pairs do not."""
    default = _drifting()
    fast = tuple(t * 0.9 for t in default)
    assert noise(default) > 0.3
    low, median, high = ratio_bounds(fast, default)
    assert low == median == high == pytest.approx(0.9)
    assert choose([(fast, default, True)]) == 0
    unpaired = fast[2:] + fast[:2]
    assert choose([(unpaired, default, True)]) is None
    # more candidates, stricter bounds (shared confidence): with 15 pairs, 2 blocks
    # slower than the default are tolerated for one candidate, not for one of 30
    two_slow = (default[0] * 1.05, default[1] * 1.05, *fast[2:])
    assert choose([(two_slow, default, True)]) == 0
    assert choose([(two_slow, default, True)] + [(default, default, True)] * 29) is None


def test_a_verdict_is_open_while_the_bounds_straddle_the_line() -> None:
    default = _drifting(15)
    assert not undecided(tuple(t * 0.8 for t in default), default)  # clearly faster
    assert not undecided(default, default)  # clearly not 2 % faster
    wobbly = tuple(t * (0.7 if i % 2 else 1.2) for i, t in enumerate(default))
    assert undecided(wobbly, default)


def test_measurement_goes_on_while_a_verdict_is_open() -> None:
    """`measure_blocks`: one sample per variant per block, the order reversed every
    other block; a clear candidate stops at the repeats, a noisy one is measured up to
    MORE_BLOCKS x the repeats, a slow clock caps it at MORE_TIME x their time."""
    from kiln.distributed.tune import MORE_BLOCKS, measure_blocks

    order: list[str] = []
    # around the line (0.98), never decided; not drawn from the module's RNG, whose
    # state depends on which tests ran before in the worker
    noisy = itertools.cycle([0.7, 1.26])

    def sample(fn: str) -> float:
        order.append(fn)
        return {"d": 100.0, "fast": 80.0, "noisy": 100.0 * next(noisy)}[fn]

    still = lambda: 0.0  # noqa: E731  (no time passes: only the block cap stops)
    times = measure_blocks(sample, ["d", "fast"], [True, True], 6, still)
    assert [len(t) for t in times] == [6, 6] and order[:4] == ["d", "fast", "fast", "d"]
    times = measure_blocks(sample, ["d", "noisy"], [True, True], 6, still)
    assert len(times[0]) == len(times[1]) == 6 * MORE_BLOCKS
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    times = measure_blocks(sample, ["d", "noisy"], [True, True], 6, clock)
    assert 6 < len(times[0]) < 6 * MORE_BLOCKS  # the time cap, not the block cap


def test_merged_pools_past_a_thousand_pairs_still_bound_the_median() -> None:
    # many merged runs pool their pairs: the order-statistic bound must not overflow
    rng = np.random.default_rng(3)
    default = rng.uniform(100.0, 110.0, 1500)
    low, median, high = ratio_bounds(default * 0.8, default)
    assert low == median == high == pytest.approx(0.8)
    assert choose([(list(default * 0.8), list(default), True)]) == 0


def test_the_choice_is_a_function_of_the_recorded_timings(tmp_path: Path) -> None:
    default = _times(100, 0.02)
    record = Record("gemm", "m=64,n=512,k=256,float32", "x86_64:znver4:abc",
                    Measurement({"mr": 8, "nr": 32}, default),
                    [Measurement({"mr": 6, "nr": 32}, _times(80, 0.02), True, default),
                     Measurement({"mr": 4, "nr": 64}, _times(90, 0.02), True, default)])
    db = TuningDatabase([record])
    db.save(tmp_path / "a.json")
    again = TuningDatabase.load(tmp_path / "a.json")
    assert again.to_json() == db.to_json() and again.fingerprint() == db.fingerprint()
    assert again.lookup(*record.key) == {"mr": 6, "nr": 32}
    assert again.lookup("gemm", "m=1,n=1,k=1,float32", "x86_64:znver4:abc") is None
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["format"] == "kiln-tuning" and doc["version"] == 3
    assert doc["records"][0]["chosen"] == {"mr": 6, "nr": 32}


def test_merge_pools_timings_and_decides_again() -> None:
    key = ("conv2d", "c=64,k=3", "x86_64:haswell:def")
    d1, d2 = _times(100, 0.01), _times(100, 0.01)
    fast_once = Record(*key, Measurement({"cb": 16}, d1),
                       [Measurement({"cb": 8}, _times(85, 0.01), True, d1)])
    slow_later = Record(*key, Measurement({"cb": 16}, d2),
                        [Measurement({"cb": 8}, _times(115, 0.01), True, d2)])
    a, b = TuningDatabase([fast_once]), TuningDatabase([slow_later])
    assert a.lookup(*key) == {"cb": 8}
    merged = a.merge(b)
    (record,) = merged.records()
    assert len(record.default.times_us) == 30 and len(record.candidates[0].times_us) == 30
    assert record.candidates[0].default_us == d1 + d2  # the pairs pooled with them
    assert merged.lookup(*key) is None  # pooled: half the pairs 15 % slower


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
    ({"format": "kiln-tuning", "version": 1, "records": []}, "unpaired timings"),
    ({"format": "kiln-tuning", "version": 2, "records": [{"kernel": "g"}]}, "'signature'"),
    ({"format": "kiln-tuning", "version": 2, "records": [
        {"kernel": "g", "signature": "s", "target": "t",
         "default": {"params": {}, "times_us": [float("nan")]}}]}, "'times_us'"),
    ({"format": "kiln-tuning", "version": 2, "records": [
        {"kernel": "g", "signature": "s", "target": "t",
         "default": {"params": {}, "times_us": [1.0]},
         "candidates": [{"params": [], "times_us": [1.0]}]}]}, "'params'"),
    ({"format": "kiln-tuning", "version": 2, "records": [
        {"kernel": "g", "signature": "s", "target": "t",
         "default": {"params": {}, "times_us": [1.0]},
         "candidates": [{"params": {}, "times_us": [1.0, 2.0], "default_us": [1.0],
                         "equal": True}]}]}, "'default_us'"),
])
def test_bad_files_are_format_errors(tmp_path: Path, doc: object, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=message.replace("(", r"\(")):
        TuningDatabase.load(path)
    path.write_text("[" * 100000)
    with pytest.raises(FormatError, match="not JSON"):
        TuningDatabase.load(path)
