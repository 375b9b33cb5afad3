"""What bench/models.py and bench/kernels.py share: timing, the host line, errors.

Not a benchmark itself. The bench scripts run as `python bench/<name>.py`, so
this folder is first on `sys.path` and they import it as `harness`.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import kiln
from kiln.errors import UsageError

# Features worth naming when describing a CPU (the host target lists ~150).
NOTABLE_FEATURES = (
    "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni",
    "avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-bf16", "amx-int8",
    "neon", "fp-armv8", "dotprod", "i8mm", "bf16", "sve", "sve2", "sme", "v", "zvfh",
)


def describe_target(target: kiln.target.Target) -> str:
    """`mcpu` and the notable features of a target, e.g. 'znver5 (avx2 fma avx512f ...)':
    those LLVM's subtarget enables (the ISA object's), so `-mattr=-avx512f` shows no
    AVX-512 although the CPU has it."""
    from kiln.target.isa import isa_for

    enabled = isa_for(target).features
    notable = [f for f in NOTABLE_FEATURES if f in enabled]
    notable += sorted(enabled - set(NOTABLE_FEATURES))
    return f"{target.get('mcpu', '') or '?'} ({' '.join(notable) or 'no notable features'})"


def ort_on_target_isa(target: kiln.target.Target, mode: str = "target") -> str:
    """Before onnxruntime is imported: with `mode` "target", hide from its cpuid the CPU
    features the host has and `target` lacks (`ort_isa.hidden_for`), so both runtimes
    run the same instruction set's kernels, e.g. the AVX2 path on an AVX-512 host;
    "host" leaves onnxruntime on the host's. Returns the line saying what onnxruntime
    sees."""
    import ort_isa

    if mode == "host":
        return "onnxruntime: the host's CPU features"
    return _hide_target_isa(ort_isa.hide_from_onnxruntime, target, "onnxruntime")


def openvino_on_target_isa(target: kiln.target.Target) -> str:
    """`ort_on_target_isa` for OpenVINO, before it is imported; the line also names the
    kernels its CPU plugin then picks (`ort_isa.openvino_isas`, e.g. brgconv_avx2_f32)."""
    import ort_isa

    line = _hide_target_isa(ort_isa.hide_from_openvino, target, "openvino")
    try:
        return f"{line}; its kernels: {', '.join(ort_isa.openvino_isas())}"
    except ImportError:
        return "openvino: absent"


def hidden_features(target: kiln.target.Target) -> list[str]:
    """The CPU features bench/ort_isa.py hides from a peer to put it on `target`'s
    instruction set: those the host has and `target` lacks (none for the host)."""
    import ort_isa

    from kiln.target.isa import isa_for

    host = isa_for(kiln.target.Target("host")).features
    return ort_isa.hidden_for(isa_for(target).features, host)


def _hide_target_isa(hide: Callable[[list[str]], str], target: kiln.target.Target,
                     package: str) -> str:
    hidden = hidden_features(target)
    try:
        return hide(hidden)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        # a bench goes on: its ratios then compare against the package's host kernels
        return (f"{package}: the host's CPU features (could not hide {' '.join(hidden)}"
                f": {short_error(exc)})")


def alternating_blocks(fns: dict[str, Callable[[], object]], calls: int,
                       rounds: int = 5, clock: Callable[[], float] = time.perf_counter
                       ) -> dict[str, list[list[float]]]:
    """Seconds per call of each function, by round: `rounds` rounds, each running
    every function in its own block of calls (after a pause and one warm-up call),
    so slow drift of a shared machine hits all alike while each runtime's thread
    pool runs undisturbed by the other's spinning threads. `clock` times the calls
    (`time.thread_time`: the CPU time of single-threaded calls, which time spent
    descheduled by other jobs does not count)."""
    times: dict[str, list[list[float]]] = {name: [] for name in fns}
    rounds = max(1, min(rounds, calls))
    per_block = max(1, calls // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.05)  # let the other runtime's spinning threads go to sleep
            fn()
            block = []
            for _ in range(per_block):
                start = clock()
                fn()
                block.append(clock() - start)
            times[name].append(block)
    return times


def alternating_blocks_ms(fns: dict[str, Callable[[], object]], calls: int,
                          rounds: int = 5, clock: Callable[[], float] = time.perf_counter
                          ) -> dict[str, float]:
    """Median milliseconds per call of each function over all rounds of
    `alternating_blocks`."""
    return pooled_ms(alternating_blocks(fns, calls, rounds, clock))


def pooled_ms(times: dict[str, list[list[float]]]) -> dict[str, float]:
    """Median milliseconds per call of each function over all blocks of
    `alternating_blocks` results."""
    return {name: statistics.median(t for block in blocks for t in block) * 1e3
            for name, blocks in times.items()}


def paired_ratio(num: list[list[float]], den: list[list[float]]) -> float:
    """The median over rounds of one round's ratio of block medians (`alternating_blocks`
    results of two functions): the two blocks of a round run within a fraction of a
    second, so a slow spell of a shared machine (this guest's CPUs run 10-60% slower
    for seconds at a time) moves both sides of most rounds' ratios alike, and the
    median leaves out the rounds it split."""
    return statistics.median(statistics.median(a) / statistics.median(b)
                             for a, b in zip(num, den, strict=True))


def paced_ms(fns: dict[str, Callable[[], object]], period_s: float, calls: int = 200,
             rounds: int = 2) -> dict[str, float]:
    """Median milliseconds per call of each function when called once every `period_s`
    seconds (as a server or a camera loop calls), `calls` calls each: the caller sleeps
    between calls, so each runtime's workers spin or sleep as their policy says. A call
    longer than the period is followed by a pause of the period (a model slower than
    the period still finds its workers idle for that long). Blocks alternate between
    the functions (`rounds` each, after a pause for the other's spinning threads to go
    to sleep) so that drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    per_block = max(1, calls // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.05)
            fn()
            due = time.perf_counter()
            for _ in range(per_block):
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                start = time.perf_counter()
                fn()
                end = time.perf_counter()
                times[name].append(end - start)
                due = (start if end - start < period_s else end) + period_s
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def calls_within(fns: dict[str, Callable[[], object]], repeat: int, seconds: float) -> int:
    """How many timed calls of each function fit in about `seconds` in all (at most
    `repeat`, at least 3), judged from one call of each (which also warms them up)."""
    one = 0.0
    for fn in fns.values():
        start = time.perf_counter()
        fn()
        one += time.perf_counter() - start
    return max(3, min(repeat, int(seconds / max(one, 1e-9))))


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """Relative L2 error of `actual` against `expected`."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.linalg.norm(expected)), 1e-30)
    return float(np.linalg.norm(actual - expected)) / scale


def short_error(exc: BaseException, width: int = 90) -> str:
    """One line naming an exception: its type and the start of its first line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= width else text[: width - 3] + "..."


def kiln_fastest_call(fn: Any, args: Sequence[np.ndarray]) -> Callable[[], object]:
    """kiln's fastest call of `fn` on `args`: a prepared call, or the plain call where
    the results' sizes are known only after it (`prepare` refuses those)."""
    try:
        return fn.prepare(*args)  # type: ignore[no-any-return]
    except UsageError:
        return lambda: fn(*args)


def ort_bound_run(session: Any, feed: dict[str, np.ndarray],
                  outs: Sequence[np.ndarray]) -> Callable[[], object]:
    """onnxruntime's fastest public call of `session` on `feed`: `run_with_iobinding`
    with the inputs and the outputs (preallocated arrays `outs`, one per session output)
    bound once, as kiln's `PackedFunction.prepare` binds its arrays once."""
    binding = session.io_binding()
    for name, array in feed.items():
        binding.bind_cpu_input(name, array)
    for o, array in zip(session.get_outputs(), outs, strict=True):
        binding.bind_output(o.name, "cpu", 0, array.dtype, list(array.shape),
                            array.ctypes.data)
    held = (feed, outs)  # the binding holds raw pointers into these arrays: keep them

    def run() -> object:
        session.run_with_iobinding(binding)
        return held[1]

    return run


def ort_profile_events(model: Any, feed: dict[str, np.ndarray], threads: int,
                       calls: int) -> list[dict[str, Any]]:
    """onnxruntime's profiling trace (its JSON events) of `calls` runs of `model` on
    `threads` threads; each event's `ts`/`dur` are microseconds."""
    import json
    import os
    import tempfile

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        for _ in range(calls):
            session.run(None, feed)
        with open(session.end_profiling()) as f:
            events: list[dict[str, Any]] = json.load(f)
    return events
