"""The whole-model check of `kiln tune` (kiln.distributed.model_tuning.check_model) decided
from recorded timings, and its verdicts in the database (format version 3): round
trip, version 2 read, merge rule, untrusted fields, what a compile applies."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kiln.distributed.model_tuning import Choice, ModelCheck, check_model
from kiln.errors import FormatError
from kiln.tuning import Measurement, Record, TuningDatabase
from kiln.tuning.apply import FromDatabase
from kiln.tuning.database import Checked, Verdict

#: The model's time untuned, and what each choice adds to it in the model (us):
#: A and C gain in the model, B (fast alone) loses there.
UNTUNED = 1000.0
IN_MODEL = {"A": -30.0, "B": 60.0, "C": -25.0, "D": -40.0}
PAIRS = 15


def _drift(n: int = PAIRS) -> list[float]:
    """A host whose speed drifts 2x over a measurement: both builds of a block alike."""
    return [1 + (i % 5) / 4 for i in range(n)]


def _recorded(effects: dict[str, float]) -> tuple[
        object, object, list[tuple[frozenset[str], frozenset[str]]]]:
    """A `build` giving the set of choices built, and a `measure` replaying what
    recorded timings of those builds would be (the model's time per set, drifting)."""
    measured: list[tuple[frozenset[str], frozenset[str]]] = []

    def build(choices: tuple[Choice, ...]) -> frozenset[str]:
        return frozenset(c.kernel for c in choices)

    def measure(a: frozenset[str], b: frozenset[str]) -> tuple[list[float], list[float]]:
        measured.append((a, b))
        t = {s: UNTUNED + sum(effects[k] for k in s) for s in (a, b)}
        return [t[a] * d for d in _drift()], [t[b] * d for d in _drift()]

    return build, measure, measured


def _choices(*names: str) -> list[Choice]:
    # in the order of their expected saving, as kiln.distributed.model_tuning.model_choices sorts
    return [Choice(n, f"conv2d({n})", {"tile": [i + 1, 16]}, 100.0 - i)
            for i, n in enumerate(names)]


def _check(names: str, effects: dict[str, float] = IN_MODEL, deadline: float = 1e9
           ) -> tuple[ModelCheck, list[tuple[frozenset[str], frozenset[str]]]]:
    build, measure, measured = _recorded(effects)
    return check_model(_choices(*names), build, measure, deadline,  # type: ignore[arg-type]
                       clock=lambda: 0.0), measured


def test_choices_the_model_gains_from_together_are_all_accepted() -> None:
    result, measured = _check("AC")
    assert [c.kernel for c in result.accepted] == ["A", "C"] and not result.rejected
    assert measured == [(frozenset(), frozenset("AC"))]  # one comparison, all at once
    # the verdict's samples: untuned and tuned, pair by pair
    assert [t / u for u, t in zip(result.untuned_us, result.tuned_us, strict=True)] \
        == pytest.approx([0.945] * PAIRS)


def test_the_choice_that_loses_in_the_model_is_dropped_the_others_kept() -> None:
    """All together the model is slower (A + B + C: +5 us); added one at a time in
    order of expected saving, B makes it slower and is dropped; A and C are kept and
    the two together checked against the untuned model once more."""
    result, measured = _check("ABC")
    assert [c.kernel for c in result.accepted] == ["A", "C"]
    assert [(c.kernel, why.split(" (")[0]) for c, why in result.rejected] == [
        ("B", "the model was not faster with it")]
    assert measured == [(frozenset(), frozenset("ABC")), (frozenset(), frozenset("A")),
                        (frozenset("A"), frozenset("AB")), (frozenset("A"), frozenset("AC")),
                        (frozenset(), frozenset("AC"))]
    assert result.tuned_us[0] / result.untuned_us[0] == pytest.approx(0.945)
    # the same recorded timings, the same verdict
    again, _ = _check("ABC")
    assert again == result


@pytest.mark.parametrize(("names", "effects"), [
    ("B", IN_MODEL),  # one choice, slower in the model
    ("AB", {"A": -10.0, "B": 60.0}),  # 1 % from A: under the line; a loss from B
])
def test_a_model_that_gains_nothing_keeps_the_rule_everywhere(
        names: str, effects: dict[str, float]) -> None:
    result, _ = _check(names, effects)
    assert not result.accepted and [c.kernel for c, _ in result.rejected] == list(names)
    assert result.tuned_us  # the losing comparison is the verdict's samples


def test_kept_one_by_one_but_not_together_drops_them_all() -> None:
    """D gains against untuned, A against D, but the two together lose against the
    untuned model when measured so (the host drifted between the comparisons, or
    gains that do not add up): the final comparison drops both."""
    effects = {"A": -30.0, "D": -40.0}
    build, measure, _ = _recorded(effects)

    def interacting(a: frozenset[str], b: frozenset[str]) -> tuple[list[float], list[float]]:
        base, new = measure(a, b)
        return base, [t * (1.1 if not a and b == {"A", "D"} else 1.0) for t in new]

    result = check_model(_choices("D", "A"), build, interacting, 1e9,  # type: ignore[arg-type]
                         clock=lambda: 0.0)
    assert not result.accepted
    assert all("kept one by one" in why for _, why in result.rejected)


def test_choices_not_reached_before_the_deadline_are_dropped() -> None:
    """Every step takes two ticks of the clock (its builds, its measurement): a step
    starts only if one more fits, and, once a choice is kept, one more measurement (the
    kept set against untuned) after it."""
    for deadline, measured in ((10.5, "B"), (8.5, "")):
        ticks = itertools.count()
        build, measure, _ = _recorded(IN_MODEL)
        result = check_model(_choices("A", "B", "C"), build, measure,  # type: ignore[arg-type]
                             deadline, clock=lambda: float(next(ticks)))  # noqa: B023
        assert [c.kernel for c in result.accepted] == ["A"]
        assert [(c.kernel, "ran out" in why) for c, why in result.rejected] == [
            (k, k not in measured) for k in "BC"]


def test_no_check_starts_that_cannot_end_before_the_deadline() -> None:
    """A build and a measurement of the model took 30 s before: with 20 s left the check
    does not start (so `kiln tune` ends within its budget), and every choice is dropped
    as not checked: a compile applies none of them."""
    build, measure, measured = _recorded(IN_MODEL)
    logged: list[str] = []
    result = check_model(_choices("A", "C"), build, measure, 20.0,  # type: ignore[arg-type]
                         clock=lambda: 0.0, log=logged.append, step_s=30.0)
    assert measured == [] and not result.accepted and not result.tuned_us
    assert [(c.kernel, "ran out" in why) for c, why in result.rejected] == [
        ("A", True), ("C", True)]
    assert "no time left for a build and a measurement" in logged[0]
    result, _ = _check("AC")  # the same with time: checked
    assert [c.kernel for c in result.accepted] == ["A", "C"]


KEY = "x86_64:znver3:abc"


def _db(choice: dict[str, int], verdicts: list[Verdict]) -> TuningDatabase:
    default = tuple(100.0 * d for d in _drift())
    records = [Record("gemm", sig, KEY, Measurement({"tile": [8, 32]}, default),
                      [Measurement({"tile": [t, 32]}, tuple(0.8 * d for d in default), True,
                                   default)])
               for sig, t in choice.items()]
    return TuningDatabase(records, verdicts)


def _verdict(threads: int | None, accepted: dict[str, int], rejected: tuple[str, ...] = ()
             ) -> Verdict:
    return Verdict("m" * 64, KEY, threads,
                   tuple(Checked("gemm", s, {"tile": [t, 32]}, "faster") for s, t in
                         accepted.items()),
                   tuple(Checked("gemm", s, {"tile": [4, 32]}, "slower") for s in rejected),
                   (100.0, 101.0), (90.0, 91.0))


def test_verdicts_round_trip_in_version_3_and_version_2_files_still_read(
        tmp_path: Path) -> None:
    db = _db({"s1": 4, "s2": 6}, [_verdict(2, {"s1": 4}, ("s2",))])
    db.save(tmp_path / "db.json")
    again = TuningDatabase.load(tmp_path / "db.json")
    assert again.to_json() == db.to_json() and again.fingerprint() == db.fingerprint()
    doc = json.loads((tmp_path / "db.json").read_text())
    assert doc["version"] == 3 and doc["verdicts"][0]["accepted"][0]["signature"] == "s1"
    assert again.checked("m" * 64, KEY) == {("gemm", "s1"): {"tile": [4, 32]}}
    assert again.checked("other", KEY) is None and again.checked("m" * 64, "x") is None
    # a version 2 file: the records as before, no verdicts
    doc = {**doc, "version": 2}
    del doc["verdicts"]
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    v2 = TuningDatabase.load(tmp_path / "v2.json")
    assert v2.records() == again.records() and not v2.verdicts()


def test_a_compile_applies_only_what_the_models_verdicts_accepted() -> None:
    """A checked model: the params every verdict (per thread count) accepted, not the
    records' other choices; an unchecked model: the records' choices, flagged."""
    db = _db({"s1": 4, "s2": 6, "s3": 2},
             [_verdict(1, {"s1": 4, "s3": 2}), _verdict(2, {"s1": 4}, ("s3",))])
    assert db.checked("m" * 64, KEY) == {("gemm", "s1"): {"tile": [4, 32]}}
    session = FromDatabase(db, "m" * 64)
    assert session.checked(KEY) == {("gemm", "s1"): {"tile": [4, 32]}}
    assert FromDatabase(db, "another model").checked(KEY) is None
    assert db.lookup("gemm", "s2", KEY) == {"tile": [6, 32]}  # the record still chooses


def test_merging_keeps_verdicts_and_a_later_check_replaces_one() -> None:
    """Verdicts are per (model, target, threads): a merge keeps both databases' and the
    second's replaces the first's of the same key; records merged in for a checked
    model do not reach it (the verdict names the params it checked)."""
    old = _db({"s1": 4}, [_verdict(2, {"s1": 4}), _verdict(1, {"s1": 4})])
    new = _db({"s2": 6}, [_verdict(2, {})])  # a later run: s2 chosen, checked: nothing
    merged = old.merge(new)
    assert [v.threads for v in merged.verdicts()] == [1, 2]
    assert merged.verdicts()[1] == _verdict(2, {})
    assert merged.checked("m" * 64, KEY) == {}  # s1 not accepted on 2 threads any more
    assert merged.lookup("gemm", "s2", KEY) == {"tile": [6, 32]}
    grown = old.merge(_db({"s2": 6}, []))  # records added, no new check
    assert grown.checked("m" * 64, KEY) == {("gemm", "s1"): {"tile": [4, 32]}}


def _doc(verdict: object, version: int = 3) -> dict[str, object]:
    return {"format": "kiln-tuning", "version": version, "records": [],
            "verdicts": [verdict]}


GOOD = {"model": "m", "target": "t", "threads": 2, "accepted": [], "rejected": [],
        "untuned_us": [1.0], "tuned_us": [1.0]}


@pytest.mark.parametrize(("doc", "message"), [
    (_doc(GOOD, 2), "no 'verdicts' in a version 2 file"),
    ({"format": "kiln-tuning", "version": 3, "records": [], "verdicts": {}}, "'verdicts'"),
    (_doc([]), r"verdicts\[0\]: expected an object"),
    (_doc({**GOOD, "model": ""}), "'model'"),
    (_doc({**GOOD, "threads": "2"}), "'threads'"),
    (_doc({**GOOD, "threads": True}), "'threads'"),
    (_doc({**GOOD, "accepted": {}}), "'accepted'"),
    (_doc({**GOOD, "rejected": [{"kernel": "g", "signature": "s", "params": []}]}),
     r"rejected\[0\]: expected 'params'"),
    (_doc({**GOOD, "accepted": [{"kernel": "g", "signature": "s", "params": {},
                                 "reason": 3}]}), "'reason'"),
    (_doc({**GOOD, "tuned_us": [-1.0]}), "'tuned_us'"),
    (_doc({**GOOD, "tuned_us": [1.0, 2.0]}), "as many samples"),
])
def test_bad_verdicts_are_format_errors(tmp_path: Path, doc: object, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=message):
        TuningDatabase.load(path)
