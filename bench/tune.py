"""Tuning benchmarks (docs/tuning.md, "Measured"):

    .venv/bin/python bench/tune.py speedup MODEL.onnx DB.json [--threads 1] [--repeat 30]
    .venv/bin/python bench/tune.py workers MODEL.onnx [--candidates 3] [--workers 1,2]
    .venv/bin/python bench/tune.py check MODEL.onnx DB.json [--threads 2] [--seconds 60]
    .venv/bin/python bench/tune.py knobs MODEL.onnx [--threads 2] [--seconds 300]

`speedup` compiles MODEL untuned and with the tuning database DB and times both as
bench/models.py times a model (the median of `--repeat` calls in alternating blocks:
harness.alternating_blocks_ms), printing the medians and their ratio. `workers`
tunes the same candidates (the first K of each kernel, no time limit) on a local Ray
instance of 1 and of 2 CPUs, each with an empty compile cache, and prints the wall
times and where they went (the time inside build and measurement tasks and their CPU
time, the time the driver waited for each: builds and measurements overlap, and the
time the measurements' CPU was not measuring). `check` runs `kiln tune`'s whole-model
check alone (kiln.distributed.model_tuning.check_in_model) on the records DB already has for
MODEL, within `--seconds`, and writes its verdict into DB (a database tuned before the
check existed gets one). `knobs` measures the model-level knobs alone (NCHWc per region,
the parallel threshold: kiln.distributed.model_tuning.measure_knobs) within `--seconds`, each
variant as the whole model against the untuned one, and prints each ratio and the
records' choices. Prints numbers; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import numpy as np
from harness import alternating_blocks_ms

import kiln
from kiln.distributed.executor import RayExecutor
from kiln.distributed.model_tuning import check_in_model
from kiln.distributed.tune import REPEATS, discover, measure_resource, tune
from kiln.frontend import from_onnx


def speedup(model: str, db: str, threads: int | None, repeat: int) -> None:
    target = kiln.Target.from_host()
    mod = from_onnx(model)
    tuned = kiln.compile(mod, target, tuning=db)
    untuned = kiln.compile(mod, target)
    meta = tuned.metadata["tuning"]
    # a build without any tuned kernel is the untuned library (its compile cache key):
    # what `speedup` then prints is the host's noise between two loads of one library
    same = tuned.cache_key is not None and tuned.cache_key == untuned.cache_key
    print(f"{len(meta['kernels'])} tuned kernel(s) applied; checked in this model: "
          f"{meta['checked_in_model']}; the same library as untuned: {same}")
    libs = [untuned.jit(), tuned.jit()]
    for lib in libs:
        lib.set_num_threads(threads)
    fns = [lib["main"] for lib in libs]
    param = mod["main"].params[0]
    shape = tuple(d if isinstance(d, int) else 1 for d in param.type.shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    outs = [np.asarray(f(x)) for f in fns]
    err = float(np.max(np.abs(outs[0] - outs[1])) / max(1e-30, np.max(np.abs(outs[0]))))
    # as bench/models.py times a model: medians of alternating blocks of calls
    ms = alternating_blocks_ms({"untuned": lambda: fns[0](x), "tuned": lambda: fns[1](x)},
                               repeat)
    base, tuned = ms["untuned"], ms["tuned"]
    print(f"{model}: untuned {base:.2f} ms, tuned {tuned:.2f} ms (medians of {repeat} calls "
          f"in alternating blocks, threads {threads or 'default'}): {base / tuned:.3f}x; "
          f"max rel diff {err:.1e}")


def check(model: str, db_path: str, threads: int | None, seconds: float) -> None:
    from kiln.tuning import TuningDatabase

    target = kiln.Target.from_host()
    db = TuningDatabase.load(db_path)
    t0 = time.monotonic()
    check_in_model(model, None, target, discover(model, target), db, threads, REPEATS,
                   t0 + seconds, print)
    db.save(db_path)
    print(f"check took {time.monotonic() - t0:.1f} s; verdict written to {db_path}")


def workers(model: str, candidates: int, counts: list[int]) -> None:
    import ray

    target = kiln.Target.from_host()
    specs = [dataclasses.replace(s, candidates=s.candidates[:candidates])
             for s in discover(model, target)]
    total = sum(len(s.candidates) for s in specs)
    for n in counts:
        # an empty compile cache per run (the workers inherit the variable), so no run
        # reuses another's builds
        os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-bench-cache-")
        ex = RayExecutor(None, {measure_resource(target): 1.0}, n)
        try:
            epoch = time.time()
            t0 = time.perf_counter()
            report = tune(specs, target, 1e9, executor=ex, threads=1)
            wall = time.perf_counter() - t0
        finally:
            ex.close()
            ray.shutdown()
        p = report.profile
        print(f"{n} Ray worker CPU(s): {total} candidates of {len(specs)} kernels "
              f"({report.measured} measured) in {wall:.1f} s wall: build tasks "
              f"{p['build_tasks']:.1f} s ({p['build_cpu']:.1f} s CPU; the driver waited "
              f"{p['build']:.1f} s for builds), measurement tasks {p['measure_tasks']:.1f} s "
              f"({p['measure_cpu']:.1f} s CPU; waited {p['measure']:.1f} s); "
              f"the measuring CPU idle {wall - p['measure_tasks']:.1f} s; the driver's CPU "
              f"{p['driver_cpu']:.1f} s")
        busy = occupancy(report.spans, epoch, epoch + wall)
        print("    seconds with k tasks running: " +
              ", ".join(f"{k}: {s:.1f}" for k, s in sorted(busy.items())))


def occupancy(spans: list[tuple[str, float, float]], start: float, end: float
              ) -> dict[int, float]:
    """Seconds of [start, end] during which k of the `spans` ran, per k."""
    events = sorted([(start, 0), (end, 0)] + [(a, 1) for _, a, _ in spans]
                    + [(b, -1) for _, _, b in spans])
    out: dict[int, float] = {}
    running, last = 0, start
    for t, step in events:
        t = min(max(t, start), end)
        out[running] = out.get(running, 0.0) + t - last
        running, last = running + step, t
    return out


def knobs(model: str, threads: int | None, seconds: float) -> None:
    from kiln.distributed.model_tuning import measure_knobs, model_runner
    from kiln.distributed.tune import ModelKnob
    from kiln.target.isa import isa_for
    from kiln.tuning import target_key

    target = kiln.Target.from_host()
    found: list[ModelKnob] = []
    discover(model, target, None, found)
    print(f"{model}: {len(found)} model-level knob(s), "
          f"{sum(len(k.candidates) for k in found)} variant(s); CPU "
          f"{target_key(isa_for(target))}")
    runner = model_runner(model, None, target, threads, REPEATS, print)
    assert runner is not None
    for r in measure_knobs(found, runner, time.monotonic() + seconds, print):
        print(f"{r.kernel} {r.signature[:80]}: chosen {r.chosen}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speedup")
    s.add_argument("model")
    s.add_argument("db")
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--repeat", type=int, default=30)
    w = sub.add_parser("workers")
    w.add_argument("model")
    w.add_argument("--candidates", type=int, default=3)
    w.add_argument("--workers", default="1,2")
    c = sub.add_parser("check")
    c.add_argument("model")
    c.add_argument("db")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--seconds", type=float, default=60.0)
    k = sub.add_parser("knobs")
    k.add_argument("model")
    k.add_argument("--threads", type=int, default=None)
    k.add_argument("--seconds", type=float, default=300.0)
    args = p.parse_args()
    if args.cmd == "knobs":
        knobs(args.model, args.threads, args.seconds)
    elif args.cmd == "speedup":
        speedup(args.model, args.db, args.threads, args.repeat)
    elif args.cmd == "check":
        check(args.model, args.db, args.threads, args.seconds)
    else:
        workers(args.model, args.candidates, [int(n) for n in args.workers.split(",")])


if __name__ == "__main__":
    main()
