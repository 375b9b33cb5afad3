"""Call overhead benchmark: where a small model's call goes, in kiln and onnxruntime.

    .venv/bin/python bench/call_overhead.py [--model models/mlp.onnx | --net mlp]
                                            [--calls 20000] [--threads 2] [--kernels]

Compiles the model (default: the MLP of models/, batch 1; `--net` takes one of
bench/nets.py instead, e.g. `mlp`, the 784-512-512-10 MLP of bench/models.py) for
`Target.from_host()` and prints the median microseconds per call (per-call times,
every row in its own block after a pause, over `--calls` calls in 5 rounds, so a
shared machine's drift hits all rows alike) of:

- `fn(x)`: the whole Python call, results allocated (the fast path,
  docs/runtime.md "Functions");
- `fn(x, out=o)`: the same writing into a preallocated result;
- `prepared run()`: `fn.prepare(x, out=o)` run again (docs/runtime.md, "Prepared
  calls"): the C entry and the ctypes hand-off alone;
- `C entry`: the packed C entry called directly, its arguments packed beforehand;
- `C entry, 1 thread`: the same library loaded again with `num_threads=1`, so the
  difference to `C entry` is what handing the parallel loops to the pool costs
  or saves;
- `kernels`: the kernels' own time per call (the median over single calls), from a
  second build with `profile=True` (docs/abi.md, "Profiling"); `C entry` minus it is
  the entry's checks; `--kernels` also prints each kernel's median beside each
  onnxruntime node's (its own profiler's `kernel_time`), for a per-kernel comparison;
- `ort run`, `ort IOBinding`: onnxruntime's `InferenceSession.run` and its
  preallocated-buffer `run_with_iobinding`, with `--threads` intra-op threads;
- `pack_arguments`: packing the arguments the general way (no call).

Then the first call after 50 ms idle, calls 2-10 and calls 11-100 (medians over 10
pauses) of `fn(x)` and `ort run`: how long waking each runtime's sleeping workers
(and the caches the pause cooled) takes, and how soon calls are back to speed.

Prints a table and the pool's counters; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from harness import alternating_blocks_ms, describe_target, ort_bound_run

import kiln
from kiln.frontend import from_onnx
from kiln.runtime import ctypes_abi

ROOT = Path(__file__).resolve().parent.parent


def load(opts: argparse.Namespace) -> onnx.ModelProto:
    if opts.net is None:
        return onnx.load(opts.model)
    from nets import MODELS

    return MODELS[opts.net]()[0]


def ort_rows(model: onnx.ModelProto, args: list[np.ndarray], outs: tuple[np.ndarray, ...],
             threads: int) -> dict[str, Callable[[], object]]:
    """onnxruntime's plain run and its IOBinding run (inputs and outputs bound once)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = dict(zip(names, args, strict=True))
    return {"ort run": lambda: session.run(None, feed),
            "ort IOBinding": ort_bound_run(session, feed, outs)}


def after_pause_us(fns: dict[str, Callable[[], object]], pause_s: float = 0.05,
                   repeats: int = 10) -> dict[str, list[float]]:
    """Median microseconds of the first call, of calls 2-10 and of calls 11-100 after
    `pause_s` idle (every runtime's workers asleep by then), over `repeats` pauses."""
    spans = ((0, 1), (1, 10), (10, 100))
    times: dict[str, list[list[float]]] = {name: [[] for _ in spans] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(pause_s)
            for i in range(spans[-1][1]):
                start = time.perf_counter()
                fn()
                took = time.perf_counter() - start
                span = next(k for k, (lo, hi) in enumerate(spans) if lo <= i < hi)
                times[name][span].append(took)
    return {name: [statistics.median(t) * 1e6 for t in per_span]
            for name, per_span in times.items()}


def kernel_us(model: onnx.ModelProto, target: kiln.target.Target, args: list[np.ndarray],
              calls: int) -> dict[str, float]:
    """Median microseconds per call of each kernel and of all kernels together ("kernels"),
    from a profile=True build, its counters read after every call: medians of single
    calls, which a call preempted by another job skews no more than it skews the
    other rows (sums over batches of calls took such calls' whole time)."""
    ex = kiln.compile(from_onnx(model), target, profile=True)
    fn = ex["main"]
    for _ in range(min(calls, 200)):
        fn(*args)
    lib: Any = ex._module
    per_call: dict[str, list[float]] = {}
    for _ in range(calls):
        lib.profile_reset()
        fn(*args)
        rows = [r for r in lib.profile() if r.function == "main" and r.kernel is not None]
        for r in rows:
            per_call.setdefault(r.kernel, []).append(r.total_ns / 1e3)
        per_call.setdefault("kernels", []).append(sum(r.total_ns for r in rows) / 1e3)
    return {name: statistics.median(t) for name, t in per_call.items()}


def ort_node_us(model: onnx.ModelProto, args: list[np.ndarray], threads: int,
                calls: int) -> dict[str, float]:
    """Median microseconds per call of each onnxruntime node ("name (op)"), from its
    own profiler (`enable_profiling`, the nodes' `kernel_time` events)."""
    import json

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "kiln-call-overhead")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in session.get_inputs()], args, strict=True))
    for _ in range(calls):
        session.run(None, feed)
    path = Path(session.end_profiling())
    times: dict[str, list[float]] = {}
    for event in json.loads(path.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = f"{event['name'].removesuffix('_kernel_time')} ({event['args'].get('op_name')})"
            times.setdefault(name, []).append(float(event["dur"]))
    path.unlink()
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "mlp.onnx"))
    parser.add_argument("--net", default=None, help="a model of bench/nets.py instead")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--kernels", action="store_true",
                        help="also print each kiln kernel's and each onnxruntime node's time")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of kiln's parallel loops and of ort (default 2)")
    opts = parser.parse_args()

    target = kiln.target.Target.from_host()
    kiln.runtime.set_num_threads(opts.threads)
    model = load(opts)
    ex = kiln.compile(from_onnx(model), target)
    fn = ex["main"]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(tuple(p["shape"])).astype(np.dtype(p["dtype"]))
            for p in fn.params]
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    values = [*args, *outs]
    packed, codes, keep = ctypes_abi.pack_arguments(values, fn._wheres)
    n = len(values)
    lib: Any = ex._module
    run = fn.prepare(*args, out=out)

    tmp = tempfile.TemporaryDirectory()
    ex.export_library(Path(tmp.name) / "one.so")
    single = kiln.runtime.load_module(Path(tmp.name) / "one.so", num_threads=1)["main"]

    rows: dict[str, Callable[[], object]] = {
        "fn(x)": lambda: fn(*args),
        "fn(x, out=o)": lambda: fn(*args, out=out),
        "prepared run()": run,
        "C entry": lambda: fn.c_func(packed, codes, n),
        "C entry, 1 thread": lambda: single.c_func(packed, codes, n),
        **ort_rows(model, args, outs, opts.threads),
        "pack_arguments": lambda: ctypes_abi.pack_arguments(values, fn._wheres),
    }
    name = opts.net or Path(opts.model).name
    print(f"model {name}, target {describe_target(target)}, {opts.threads} threads, "
          f"{opts.calls} calls per row")
    times = alternating_blocks_ms(rows, opts.calls)
    for row, ms in times.items():
        print(f"  {row:<18} {ms * 1e3:8.2f} us/call")
    kernels = kernel_us(model, target, args, max(200, opts.calls // 10))
    print(f"  {'kernels':<18} {kernels.pop('kernels'):8.2f} us/call (profile=True build)")
    print(f"  pool: {lib.pool_stats()}")
    pause = {"fn(x)": rows["fn(x)"], "ort run": rows["ort run"]}
    print("after 50 ms idle, us per call:  first   2-10  11-100")
    for row, (first, early, later) in after_pause_us(pause).items():
        print(f"  {row:<28} {first:7.1f} {early:6.1f} {later:7.1f}")
    if opts.kernels:
        print("per kernel, median us per call: kiln (profile=True build)")
        for kernel, us in kernels.items():
            print(f"  {kernel:<40} {us:8.2f}")
        print("onnxruntime nodes (its profiler), median us per call")
        for node, us in ort_node_us(model, args, opts.threads,
                                    max(200, opts.calls // 10)).items():
            print(f"  {node:<40} {us:8.2f}")
    del keep
    tmp.cleanup()


if __name__ == "__main__":
    main()
