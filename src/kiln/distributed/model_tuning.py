"""`kiln tune` for a model: the kernels tuned (kiln.distributed.tune), then what is
measured in the whole model, in this process, on the machine that runs it:

1. `measure_knobs`: the model-level knobs (NCHWc per region, the parallel threshold:
   kiln.distributed.tune.model_knobs), each variant a whole-model build timed in paired
   blocks against the untuned model, recorded like a kernel's variants;
2. `check_model`: the database's choices for the model (kernels' and knobs') checked
   together in the whole model, a verdict recorded (kiln.tuning.database.Verdict).

`tune_model` runs both after the kernel search within one budget (`KNOB_SHARE`,
`CHECK_SHARE`); docs/tuning.md ("Model-level knobs", "The whole-model check").
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import kiln
from kiln.distributed.executor import Executor
from kiln.distributed.tune import (
    REPEATS,
    WARMUP,
    KernelSpec,
    ModelKnob,
    Params,
    TuneReport,
    discover,
    equal_result,
    last_level_cache_bytes,
    measure_blocks,
    measure_resource,
    resolve,
    show,
    tune,
)
from kiln.driver.fingerprint import module_fingerprint
from kiln.errors import UsageError
from kiln.frontend import from_onnx
from kiln.ops.cblas import LIBRARY_CHOICE
from kiln.runtime.threads import check_num_threads
from kiln.target.isa import isa_for
from kiln.tuning.apply import Chosen, using
from kiln.tuning.database import Checked, Measurement, Record, TuningDatabase, Verdict, target_key
from kiln.tuning.select import faster, ratio_bounds


def tune_model(model: str | os.PathLike[str], target: Any, budget_s: float, output: str |
               os.PathLike[str], *, executor: Executor | None = None,
               shapes: dict[str, Any] | None = None, log: Callable[[str], None] = print,
               repeats: int = REPEATS, threads: int | None = None) -> TuneReport:
    """Tune `model` for `target`, merge the records into the database `output` (created
    when missing), then check the database's choices in the whole model (`check_model`,
    on `threads` threads, in `CHECK_SHARE` of the budget plus what tuning left) and
    record the verdict. A `threads` outside 1 to kiln.runtime.threads.MAX_THREADS, or a
    `budget_s` that is not a positive number of seconds, is a UsageError before anything
    is read."""
    if threads is not None:
        threads = check_num_threads(threads)
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) \
            or not math.isfinite(budget_s) or budget_s <= 0:
        raise UsageError(f"budget_s={budget_s!r}: expected a positive number of seconds")
    start = time.monotonic()
    knobs: list[ModelKnob] = []
    specs = discover(model, target, shapes, knobs)
    log(f"{model}: {len(specs)} distinct tunable kernel(s), "
        f"{sum(s.count for s in specs)} call(s), "
        f"{sum(len(s.candidates) for s in specs)} candidate(s) in the search space")
    if specs:
        weights = specs[0].model_weight_bytes
        log(f"weights {weights / 2**20:.1f} MiB: kernels measured with the caches evicted "
            f"before each call where the weights exceed the measuring machine's "
            f"last-level cache ({last_level_cache_bytes() / 2**20:.0f} MiB here)")
    reserve = CHECK_SHARE * budget_s if specs else 0.0
    knob_share = KNOB_SHARE * budget_s if specs else 0.0
    left = max(1.0, budget_s - reserve - knob_share - (time.monotonic() - start))
    report = tune(specs, target, left, executor=executor, log=log, repeats=repeats,
                  threads=threads)
    path = Path(output)
    db = TuningDatabase.load(path).merge(report.database) if path.exists() \
        else report.database
    if specs:
        runner = model_runner(model, shapes, target, threads, repeats, log)
        if runner is not None:
            for record in measure_knobs(knobs, runner, start + budget_s - reserve, log):
                db.add(record)
        report.check = check_in_model(model, shapes, target, specs, db, threads, repeats,
                                       start + budget_s, log, knobs, runner)
    db.save(path)
    report.database = db
    return report


def model_runner(model: str | os.PathLike[str], shapes: dict[str, Any] | None,
                 target: Any, threads: int | None, repeats: int,
                 log: Callable[[str], None]) -> _ModelRunner | None:
    """Builds and measurements of `model` in this process; None (logged) when this
    machine's CPU is not the target's (the model-level knobs and the model check are
    then not measured: the records stay unchecked in the model)."""

    tgt = resolve(target)
    if measure_resource(tgt) != measure_resource(resolve("host")):
        log(f"model knobs and model check skipped: this machine's CPU is not the "
            f"target's ({target_key(isa_for(tgt))}); the records stay unchecked in the model")
        return None
    return _ModelRunner(from_onnx(model, shapes or None), tgt, threads, repeats)


def measure_knobs(knobs: Sequence[ModelKnob], runner: _ModelRunner, deadline: float,
                  log: Callable[[str], None], clock: Callable[[], float] = time.monotonic
                  ) -> list[Record]:
    """Each variant of `knobs` measured in the whole model: the model built with that
    one variant (the rule's elsewhere) against the untuned model, paired samples
    (`_ModelRunner.measure`); its result checked equal to the untuned one's. A record
    per knob (its `times_us`/`default_us` model timings), decided by
    kiln.tuning.select like a kernel's. A variant starts only while the last one's time
    fits before `deadline`; the others are logged as not measured."""

    key = target_key(isa_for(runner.tgt))
    # round robin: every knob's first variant, then the second ones, ...
    order = [(j, k, p) for i in range(max((len(k.candidates) for k in knobs), default=0))
             for j, k in enumerate(knobs) if i < len(k.candidates)
             for p in (k.candidates[i],)]
    if not order or clock() >= deadline:
        if order:
            log(f"model knobs: none of {len(order)} variant(s) measured: the budget ran out")
        return []
    began = clock()
    untuned = runner.build(())
    reference = runner.outputs(untuned)
    step = clock() - began
    measured: dict[int, list[Measurement]] = {}  # by the knob's index
    skipped = 0
    for j, knob, params in order:
        now = clock()
        if now + step > deadline:
            skipped += 1
            continue
        variant = runner.build((Choice(knob.kernel, knob.signature, dict(params), 0.0),))
        equal = all(equal_result(o, r) for o, r in
                    zip(runner.outputs(variant), reference, strict=True))
        base, new = runner.measure(untuned, variant)
        step = clock() - now
        measured.setdefault(j, []).append(
            Measurement(dict(params), tuple(new), equal, tuple(base)))
        _, mid, high = ratio_bounds(new, base)
        log(f"model knob {knob.label} {show(params)}: median ratio {mid:.3f}, bound "
            f"{high:.3f} over {len(new)} pairs" + ("" if equal else "; result differs"))
    log(f"model knobs: {len(order) - skipped} of {len(order)} variant(s) measured in the "
        "model" + (f" ({skipped} not: the budget ran out)" if skipped else ""))
    return [Record(knobs[j].kernel, knobs[j].signature, key,
                   Measurement(dict(knobs[j].default),
                               tuple(t for m in ms for t in m.default_us)), ms)
            for j, ms in sorted(measured.items())]


def check_in_model(model: str | os.PathLike[str], shapes: dict[str, Any] | None,
                    target: Any, specs: Sequence[KernelSpec], db: TuningDatabase,
                    threads: int | None, repeats: int, deadline: float,
                    log: Callable[[str], None], knobs: Sequence[ModelKnob] = (),
                    runner: _ModelRunner | None = None) -> ModelCheck | None:
    """`check_model` of `db`'s choices for `model` (its kernels' and `knobs`') in this
    process, its verdict added to `db`; None (and no verdict) when this machine's CPU is
    not the target's."""

    runner = runner or model_runner(model, shapes, target, threads, repeats, log)
    if runner is None:
        return None
    key = target_key(isa_for(runner.tgt))
    choices = model_choices(db, specs, key, knobs)
    log(f"model check on {threads or 'the default'} thread(s): {len(choices)} choice(s), "
        f"{max(0.0, deadline - time.monotonic()):.0f} s left")
    result = check_model(choices, runner.build, runner.measure, deadline, log=log,
                         step_s=runner.step_estimate())
    db.add_verdict(Verdict(
        runner.fingerprint, key, threads,
        tuple(Checked(c.kernel, c.signature, c.params, "the model was faster with it")
              for c in result.accepted),
        tuple(Checked(c.kernel, c.signature, c.params, why) for c, why in result.rejected),
        tuple(result.untuned_us), tuple(result.tuned_us)))
    if not choices:
        log("model check: no record chooses another variant for this model's kernels")
    else:
        _, mid, high = ratio_bounds(result.tuned_us, result.untuned_us)
        pairs = f"median ratio {mid:.3f}, bound {high:.3f} over {len(result.tuned_us)} pairs"
        log(f"model check: {len(result.accepted)} of {len(choices)} choice(s) accepted; "
            f"the model with them against untuned: {pairs}" if result.accepted else
            f"model check: none of {len(choices)} choice(s) accepted: this model keeps the "
            f"rule's kernels (the last comparison with untuned: {pairs})")
    for c, why in result.rejected:
        log(f"  dropped {c.kernel} {c.signature} {show(c.params)}: {why}")
    return result


class _ModelRunner:
    """Builds of a whole model with given choices (through kiln's compile cache),
    loaded in this process, and paired measurements of two of them."""

    def __init__(self, mod: Any, tgt: Any, threads: int | None, repeats: int) -> None:
        self.mod, self.tgt, self.threads, self.repeats = mod, tgt, threads, repeats
        # as kiln.compile takes it, before any pass: what the model's verdicts and its
        # `parallel_threshold` record are signed with
        self.fingerprint = module_fingerprint(mod)
        self.libs: list[Any] = []  # keeps the loaded libraries alive
        # the longest build and measurement so far (seconds): what the check's first
        # step is estimated to take before it starts
        self.longest = {"build": 0.0, "measure": 0.0}
        rng = np.random.default_rng(0)
        self.inputs = []
        for p in mod["main"].params:
            shape = tuple(d if isinstance(d, int) else 1 for d in p.type.shape)
            dtype = np.dtype(str(p.type.dtype))
            self.inputs.append(rng.standard_normal(shape).astype(dtype)
                               if dtype.kind == "f" else np.zeros(shape, dtype))

    def build(self, choices: tuple[Choice, ...]) -> Any:
        began = time.monotonic()
        with using(Chosen({c.key: c.params for c in choices}, self.fingerprint)):
            ex = kiln.compile(self.mod, self.tgt)
        lib = ex.jit()
        if self.threads:
            lib.set_num_threads(self.threads)
        self.libs.append(lib)
        self.longest["build"] = max(self.longest["build"], time.monotonic() - began)
        return lib["main"]

    def step_estimate(self) -> float:
        """Seconds one build and one measurement took at most so far (0 before any)."""
        return self.longest["build"] + self.longest["measure"]

    def outputs(self, fn: Any) -> list[np.ndarray]:
        """The outputs of build `fn` on the inputs."""
        out = fn(*self.inputs)
        return [np.array(o) for o in (out if isinstance(out, (tuple, list)) else (out,))]

    def measure(self, a: Any, b: Any) -> tuple[list[float], list[float]]:
        for _ in range(WARMUP):
            a(*self.inputs)
            b(*self.inputs)

        def sample(fn: Callable[..., Any]) -> float:
            # the other build's idle workers go to sleep first (they would share the
            # CPUs with this call, which hurts a build that needs both CPUs more than
            # one whose kernels run serial), then one call wakes this build's workers
            # and the next one is timed: a call as in a run of calls, alone
            time.sleep(MODEL_PAUSE_S)
            fn(*self.inputs)
            t0 = time.perf_counter()
            fn(*self.inputs)
            return (time.perf_counter() - t0) * 1e6

        began = time.monotonic()
        base, new = measure_blocks(sample, [a, b], [True, True], self.repeats,
                                   line=MODEL_LINE)
        self.longest["measure"] = max(self.longest["measure"], time.monotonic() - began)
        return base, new


#: Why a choice the check did not reach is dropped.
OUT_OF_TIME = "not checked in the model: the check's time ran out"
#: Share of `kiln tune`'s budget reserved for the whole-model check (`check_model`):
#: the kernels are tuned in the rest, the check takes this plus what tuning left.
CHECK_SHARE = 0.25
#: Share of `kiln tune`'s budget for the model-level knobs (`measure_knobs`: NCHWc
#: regions, the parallel threshold), measured after the kernels (plus what they left),
#: before the check. Small: each variant is a whole-model build and measurement, and
#: the kernels' own space holds most of the choices that make a model faster, so they
#: get most of the budget (docs/tuning.md).
KNOB_SHARE = 0.15
#: The model check's line: a tuned build is accepted when the upper bound of its
#: median per-block ratio tuned / untuned (kiln.tuning.select.faster, one test) is
#: below it: the model measured faster at 95 % by the kernels' margin (MIN_GAIN, 2 %),
#: never merely not slower. Not 1.0: on a loaded host two loads of one library
#: measured 5 % apart (docs/tuning.md, "The whole-model check").
MODEL_LINE = 0.98


#: Pause before each sample of a model check, longer than a library's default spin
#: window (20 ms): the other build's workers are asleep when this one is timed.
MODEL_PAUSE_S = 0.03


@dataclass(frozen=True)
class Choice:
    """A record's choice for one of the model's kernels, and its expected saving in the
    model (default time x occurrences x (1 - median ratio), microseconds)."""

    kernel: str
    signature: str
    params: Params
    saving: float

    @property
    def key(self) -> tuple[str, str]:
        """(kernel, signature)."""
        return self.kernel, self.signature


@dataclass
class ModelCheck:
    """What `check_model` decided: choices kept and dropped (with why), the model's
    paired samples of the last comparison against the untuned build."""

    accepted: list[Choice]
    rejected: list[tuple[Choice, str]]
    untuned_us: list[float]
    tuned_us: list[float]


def model_choices(db: TuningDatabase, specs: Sequence[KernelSpec], key: str,
                  knobs: Sequence[ModelKnob] = ()) -> list[Choice]:
    """The choices `db` makes for `specs` and `knobs` on target `key`, largest expected
    saving first (ties by kernel and signature; a knob's saving is of the model's time,
    once). A GEMM choice of a product that stays on CBLAS (its `cblas_matmul` record
    does not choose kiln's own kernel) is left out: it cannot change the model."""

    out = []
    records = {r.key: r for r in db.records()}
    on_library = {s.signature for s in specs if s.family == LIBRARY_CHOICE.name and
                  LIBRARY_CHOICE.calls_library(
                      getattr(records.get((s.family, s.signature, key)), "chosen", None))}
    for name, sig, count in [*((s.family, s.signature, s.count) for s in specs),
                             *((k.kernel, k.signature, 1) for k in knobs)]:
        rec = records.get((name, sig, key))
        chosen = None if rec is None else rec.chosen
        if rec is None or chosen is None or (sig in on_library and name != LIBRARY_CHOICE.name):
            continue
        best = next(c for c in rec.candidates if c.params == chosen)
        _, mid, _ = ratio_bounds(best.times_us, best.default_us)
        saving = float(np.median(rec.default.times_us)) * count * (1 - mid)
        out.append(Choice(name, sig, dict(chosen), saving))
    return sorted(out, key=lambda c: (-c.saving, c.kernel, c.signature))


def check_model(choices: Sequence[Choice], build: Callable[[tuple[Choice, ...]], Any],
                measure: Callable[[Any, Any], tuple[Sequence[float], Sequence[float]]],
                deadline: float, clock: Callable[[], float] = time.monotonic,
                log: Callable[[str], None] = lambda s: None, step_s: float = 0.0
                ) -> ModelCheck:
    """Which `choices` (largest expected saving first) a model gains from as a whole.

    `build(choices)` gives the model built with those choices (the rule's elsewhere),
    `measure(a, b)` paired samples of two builds (`measure_blocks`); a build is faster
    than another when `kiln.tuning.select.faster` bounds it below `MODEL_LINE`.

    1. The model with every choice against the untuned model: faster, all are kept.
    2. Else (two or more choices) they are added one at a time in order, each kept only
       if the model with it is faster than without it, while the last step's time (and,
       once one is kept, the last measurement's, for the comparison that follows) fits
       before `deadline` (the rest are dropped: not checked); then, if more than one
       was kept, the kept set against the untuned model once more: not faster, all
       are dropped.

    Step 1 starts only if `step_s` (a build and a measurement of this model as timed
    before, 0 when unknown) fits before `deadline`; else every choice is dropped, not
    checked, so the budget holds. The decision depends only on the samples `measure`
    returns (and `clock`, which only stops the steps): the same measurements always
    give the same verdict."""

    def compare(base: Any, new: Any) -> tuple[bool, float, float, list[float], list[float]]:
        b, n = measure(base, new)
        ok, mid, high = faster(n, b, MODEL_LINE)
        return ok, mid, high, list(b), list(n)

    def text(mid: float, high: float, pairs: int) -> str:
        return f"median ratio {mid:.3f}, bound {high:.3f} over {pairs} pairs"

    if not choices:
        return ModelCheck([], [], [], [])
    began = clock()
    if began + step_s > deadline:
        log(f"model check: no time left for a build and a measurement of the model "
            f"({step_s:.0f} s); a longer --budget checks the choices")
        return ModelCheck([], [(c, OUT_OF_TIME) for c in choices], [], [])
    untuned = build(())
    tuned = build(tuple(choices))
    measuring = clock()
    ok, mid, high, base_us, new_us = compare(untuned, tuned)
    end = clock()
    step = end - began  # a step of 2 takes about as long: one build, one measurement
    compare_s = end - measuring
    log(f"model check: all {len(choices)} choice(s) against untuned: "
        f"{text(mid, high, len(new_us))}")
    if ok:
        return ModelCheck(list(choices), [], base_us, new_us)
    why = f"the model with all {len(choices)} was not faster ({text(mid, high, len(new_us))})"
    if len(choices) == 1:
        return ModelCheck([], [(choices[0], why)], base_us, new_us)
    kept: list[Choice] = []
    rejected: list[tuple[Choice, str]] = []
    current = untuned
    last = (base_us, new_us, False)  # the last comparison against untuned, kept or not
    for i, c in enumerate(choices):
        now = clock()
        # once one is kept, a comparison of the kept set with untuned may follow
        if now + step + (compare_s if kept else 0.0) > deadline:
            rejected += [(r, OUT_OF_TIME) for r in choices[i:]]
            break
        trial = build((*kept, c))
        measuring = clock()
        ok, mid, high, b, n = compare(current, trial)
        end = clock()
        step, compare_s = end - now, end - measuring
        log(f"  model with {len(kept)} kept + {c.kernel} {c.signature} {show(c.params)}: "
            f"{text(mid, high, len(n))}: {'kept' if ok else 'dropped'}")
        if ok:
            if not kept:
                last = (b, n, True)
            kept.append(c)
            current = trial
        else:
            rejected.append((c, f"the model was not faster with it ({text(mid, high, len(n))})"))
    if len(kept) > 1:
        ok, mid, high, b, n = compare(untuned, current)
        log(f"  model with the {len(kept)} kept against untuned: {text(mid, high, len(n))}")
        if not ok:
            rejected = [(c, f"kept one by one, but the model with all kept was not faster "
                            f"than untuned ({text(mid, high, len(n))})") for c in kept] \
                + rejected
            kept = []
        last = (b, n, True)
    base_us, new_us, _ = last
    return ModelCheck(kept, rejected, base_us, new_us)
