"""`kiln tune`: measure the legal variants (tiles, parallel splits, K blocking,
convolution algorithms: kiln.kernels.search) of each distinct kernel of a model, keep the
clearly faster ones in a tuning database.

1. `discover`: the graph pipeline runs once under a `Recorder` (kiln.tuning.apply);
   every call a tunable kernel family packs becomes a `KernelSpec` — the source call
   (operand types, constant weights, attributes), its signature, how often the model
   has it and its search space (`kiln.kernels.search.variants`, most promising
   first). Equal calls are one spec.
2. Until the budget is spent, every CPU runs one task at a time (`tune`): builds of
   the defaults (the rule's variants) of kernels not built yet, the most frequent
   first, so the time each kernel takes becomes known, and of candidates of the
   kernels whose untried time is largest (default time x occurrences / (tried + 1));
   every variant is built as a library of that one call (`build_variants`: a task
   builds two variants of one kernel, tasks run anywhere, in parallel); and
   `measure_kernel` tasks, each loading a kernel's default and its candidates built
   since its last measurement, checking each result equals the default's, and timing
   them interleaved (warm-up, then repeats).
3. `kiln.tuning.select` decides from the recorded timings; the records are merged
   into the database (timings of a variant measured before are pooled).
4. `kiln.distributed.model_tuning.tune_model` then measures the model-level knobs
   (`model_knobs`: NCHWc per region, the parallel threshold) as whole-model builds in
   this process, records them like kernels, and checks every choice in the whole model
   (`check_model`).

Measurement tasks ask for the resource `measure_resource(target)` ("kiln-cpu-" + a
hash of the target's `target_key`), one unit per node: Ray runs them only on nodes
started with it (`ray start --resources='{"kiln-cpu-...": 1}'`), one at a time per
node, so measurements never share a CPU with each other. Build tasks ask for a CPU
only. Without Ray, everything runs in this process with the same results.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import kiln
from kiln import __version__ as version
from kiln import ops
from kiln.distributed.executor import (
    Executor,
    InProcessExecutor,
    Pending,
    TaskOutcome,
    error_line,
    task_node,
)
from kiln.driver.fingerprint import module_fingerprint
from kiln.errors import UsageError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.kernels import parallel_work
from kiln.kernels.search import default_params, variants
from kiln.runtime import load_module
from kiln.runtime.module import LibraryModule
from kiln.target.isa import isa_for
from kiln.transform.pipeline import get_pipeline
from kiln.tuning.apply import NCHWC_REGION, PARALLEL_THRESHOLD, Forced, Recorder, using
from kiln.tuning.database import Measurement, Record, TuningDatabase, target_key
from kiln.tuning.select import MIN_GAIN, ratio_bounds, undecided

if TYPE_CHECKING:
    from kiln.distributed.model_tuning import ModelCheck

Params = dict[str, Any]

#: Default measurement: warm-up calls, then `REPEATS` samples of every variant,
#: interleaved; a sample is the fastest of `CALLS` consecutive calls (a call another
#: process delayed says nothing about the kernel).
WARMUP = 3
REPEATS = 15
CALLS = 3
#: Calls per sample where the caches are evicted before each: two, so a time slice
#: another process took during one call does not make the sample (on a loaded 2-vCPU
#: host one cold call's samples spread by 50-350 %, docs/tuning.md "Measured").
COLD_CALLS = 2
#: Adaptive repeats (`measure_blocks`): while a candidate's verdict is open, blocks go
#: on up to MORE_BLOCKS x the repeats and MORE_TIME x the time the repeats took on top.
MORE_BLOCKS = 4
MORE_TIME = 2.0
#: C flags of a variant's host code (the wrapper around its kernel: argument checks,
#: metadata; the kernel itself is LLVM's). Unoptimized, it costs every variant a
#: measurement compares the same few instructions per call, and its compile no longer
#: takes most of a build's C compiler time (docs/tuning.md, "Measured").
HOST_CFLAGS = ("-O0",)
#: Relative and absolute (to the largest |value|) tolerance of a candidate's result.
RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True)
class KernelSpec:
    """One distinct kernel call: what a task needs to build it alone (plain data)."""

    family: str
    signature: str
    op: str
    # ("input", dtype, shape) with symbolic dims as 1, or ("const", array)
    operands: tuple[tuple[Any, ...], ...]
    attrs: dict[str, Any]
    count: int
    default: Params
    candidates: tuple[Params, ...]
    # the weight bytes of the whole model's tunable calls: a measurement evicts the
    # caches before each call when they exceed the measuring machine's last-level
    # cache (`evict_bytes`), since in the model each kernel then reads its weights
    # from memory
    model_weight_bytes: int = 0

    @property
    def label(self) -> str:
        """Family and signature, for logs."""
        return f"{self.family} {self.signature}"


def measure_resource(target: Any) -> str:
    """The Ray custom resource a node offers when its CPU is `target`'s."""

    return "kiln-cpu-" + hashlib.sha256(target_key(isa_for(target)).encode()).hexdigest()[:12]


def resolve(spec: Any) -> Any:
    """`spec` ("host", a kind, a tag, JSON or a Target) as a Target: "host" is the
    machine that resolves it (the driver), so every task builds the same code."""

    if isinstance(spec, kiln.Target):
        return spec
    return kiln.Target.from_host() if spec in (None, "host") else kiln.Target(spec)


def discover(model: Any, target: Any, shapes: dict[str, Any] | None = None,
             knobs: list[ModelKnob] | None = None) -> list[KernelSpec]:
    """The distinct tunable kernel calls of `model` (an ONNX path, bytes or ModelProto,
    or an IRModule) on `target`, in the order the passes meet them; `knobs`, when given,
    gets the model's model-level knobs appended (`model_knobs`)."""

    tgt = resolve(target)
    mod = model if isinstance(model, IRModule) else from_onnx(model, shapes or None)
    recorder = Recorder()
    fingerprint = module_fingerprint(mod) if knobs is not None else ""  # before any pass
    with tgt, using(recorder):
        get_pipeline("default", "graph", target=tgt)(mod)
    if knobs is not None:
        knobs += model_knobs(recorder, fingerprint)
    specs = []
    for key, (family, call, isa) in recorder.calls.items():
        operands: list[tuple[Any, ...]] = []
        for a in call.args:
            if isinstance(a, g.Constant):
                operands.append(("const", a.data))
            else:
                t = a.type
                assert isinstance(t, TensorType)
                operands.append(("input", t.dtype,
                                 tuple(d if isinstance(d, int) else 1 for d in t.shape)))
        specs.append(KernelSpec(family.name, key[1], call.op, tuple(operands),
                                dict(call.attrs), recorder.counts[key],
                                default_params(family, call, isa),
                                tuple(variants(family, call, isa))))
    # a call two knobs record (CBLAS or kiln's GEMM, then the GEMM's tiles) reads its
    # weights once: count each signature once
    by_call = {s.signature: s for s in specs}.values()
    weights = sum(s.count * sum(o[1].nbytes for o in s.operands if o[0] == "const")
                  for s in by_call)
    return [replace(s, model_weight_bytes=weights) for s in specs]


@dataclass(frozen=True)
class ModelKnob:
    """A model-level knob (kiln.tuning.apply.MODEL_KNOBS): its pseudo-kernel name,
    signature, the rule's params and the other variants, measured in the whole model."""

    kernel: str
    signature: str
    default: Params
    candidates: tuple[Params, ...]

    @property
    def label(self) -> str:
        """Pseudo-kernel and signature, for logs (a long region's cut after its first
        convolutions, with their count)."""
        sig = self.signature
        if len(sig) > 160:
            sig = f"{sig[:120]}... ({sig.count('|') + 1} convolutions)"
        return f"{self.kernel} {sig}"


def model_knobs(recorder: Any, fingerprint: str) -> list[ModelKnob]:
    """The model-level knobs of a model the graph pipeline ran on under `recorder`:
    the parallel threshold (signed by the model's `fingerprint`; the values of
    kiln.kernels.parallel_work.THRESHOLD_CHOICES: it applies to every kernel, so it
    comes first), then each NCHWc region the `nchwc-layout` pass formed (the other
    layout than the rule's)."""
    from kiln.transform.nchwc_layout import (
        LAYOUTS,  # lazy: kiln.transform.registry loads it on first use
    )

    default_ns = parallel_work.PARALLEL_MIN_NS
    threshold = ModelKnob(PARALLEL_THRESHOLD, fingerprint, {"min_ns": default_ns},
                          tuple({"min_ns": n} for n in parallel_work.THRESHOLD_CHOICES
                                if n != default_ns))
    return [threshold, *(ModelKnob(NCHWC_REGION, sig, dict(default),
                                   tuple({"layout": x} for x in LAYOUTS
                                         if x != default["layout"]))
                         for (kernel, sig), default in recorder.knobs.items()
                         if kernel == NCHWC_REGION and sig is not None)]


def last_level_cache_bytes() -> int:
    """This machine's last-level cache (the OS's figure for L3, else L2; 32 MiB when
    it gives none)."""
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if size > 0:
            return int(size)
    return 32 << 20


def evict_bytes(spec: KernelSpec) -> int:
    """Bytes to write between the timed calls of `spec`'s variants: 1.5x the
    last-level cache when the model's weights do not fit in it (each kernel of the
    model then finds its weights in memory, not in a cache: a variant that reads more
    weight bytes, e.g. Winograd's transformed ones, must pay for them when measured
    too), else 0 (the weights stay cached between calls, as in the model)."""
    llc = last_level_cache_bytes()
    return llc * 3 // 2 if spec.model_weight_bytes > llc else 0


def kernel_module(spec: KernelSpec) -> Any:
    """An IRModule whose `main` is the one call of `spec` on its inputs."""
    params: list[g.Var] = []
    args: list[g.Expr] = []
    for i, operand in enumerate(spec.operands):
        if operand[0] == "const":
            args.append(g.Constant(operand[1], f"w{i}"))
        else:
            v = g.Var(f"x{i}", TensorType(operand[2], operand[1]))
            params.append(v)
            args.append(v)
    c = ops.call(spec.op, *args, **spec.attrs)
    out = g.Var("y", c.ret_type)
    return IRModule({"main": g.Function(tuple(params), (g.Binding(out, c),), out)})


def build_variant(spec: KernelSpec, target: str, params: Params | None) -> dict[str, Any]:
    """The library of `spec` alone with `params` (None: the rule's), as bytes."""

    start, cpu, wall = time.perf_counter(), _cpu_seconds(), time.time()
    forced = Forced(spec.family, params)
    with using(forced):
        ex = kiln.compile(kernel_module(spec), kiln.Target(target))
    if params is not None and forced.seen != 1:
        raise UsageError(f"{spec.label}: the {spec.family} kernel did not take the call "
                         "when built alone")
    # the host's C (argument checks, metadata) is the only C: compile it unoptimized
    host_only = all(a.extension != ".c" or a.codegen_id == "host" for a in ex.artifacts)
    with tempfile.TemporaryDirectory(prefix="kiln-tune-") as tmp:
        path = Path(tmp) / "kernel.so"
        ex.export_library(path, options=list(HOST_CFLAGS) if host_only else None)
        data = path.read_bytes()
    return {"data": data, "seconds": time.perf_counter() - start,
            "cpu_seconds": _cpu_seconds() - cpu, "node": task_node(),
            "kiln": kiln.__version__, "span": (wall, time.time())}


def build_variants(jobs: Sequence[tuple[KernelSpec, str, Params | None]]
                   ) -> list[dict[str, Any]]:
    """A task: `build_variant` of each job, in order; a job that fails gives
    `{"error": ...}` (the others are still built). One task builds a batch, so a worker
    pays its start, kiln's import and the shipping of a kernel's weights once."""

    out: list[dict[str, Any]] = []
    for job in jobs:
        try:
            out.append(build_variant(*job))
        except Exception as exc:  # one variant's failure is its outcome
            out.append({"error": error_line(exc)})
    return out


def kernel_inputs(spec: KernelSpec) -> list[np.ndarray]:
    """The inputs every variant of `spec` is run on (seeded by its signature)."""
    seed = int.from_bytes(hashlib.sha256(spec.signature.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(o[2]).astype(o[1]) for o in spec.operands if o[0] == "input"]


def measure_blocks(sample: Callable[[Any], float], fns: Sequence[Any], equal: Sequence[bool],
                   repeats: int, clock: Callable[[], float] = time.perf_counter,
                   line: float | None = None) -> list[list[float]]:
    """Samples of every variant (`fns[0]` the default), taken in blocks of one sample
    each, the order reversed every other block (so what drifts within a block weighs
    on the default and the candidates alike). After `repeats` blocks, more are taken
    while a candidate's verdict is open (kiln.tuning.select.undecided: its median
    ratio's bounds straddle the winning line, a kernel's or `line`), up to
    `MORE_BLOCKS` x `repeats` blocks and `MORE_TIME` x the time the first `repeats`
    took: a noisy kernel is measured longer, a clear one not."""

    win = 1 - MIN_GAIN if line is None else line
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    tests = sum(equal[1:])
    began = clock()
    first = 0.0
    block = 0
    while True:
        if block >= repeats:
            if block == repeats:
                first = clock() - began
            if block >= MORE_BLOCKS * repeats or clock() - began > (1 + MORE_TIME) * first \
                    or not any(eq and undecided(t, times[0], tests, win)
                               for t, eq in zip(times[1:], equal[1:], strict=True)):
                return times
        for i in (order if block % 2 == 0 else order[::-1]):
            times[i].append(sample(fns[i]))
        block += 1


def equal_result(out: np.ndarray, ref: np.ndarray) -> bool:
    """Whether a candidate's output `out` equals the rule's `ref` within the tuner's
    tolerance (RTOL of each value, ATOL of the largest magnitude, at least 1)."""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return bool(out.shape == ref.shape and
                np.allclose(out, ref, rtol=RTOL, atol=ATOL * max(scale, 1.0)))


def measure_kernel(spec: KernelSpec, libraries: Sequence[bytes], warmup: int = WARMUP,
                   repeats: int = REPEATS, threads: int | None = None) -> dict[str, Any]:
    """A task: load the libraries (the first is the default's; `threads`: their thread
    count, None the runtime's default), check every result equals the default's, take
    `repeats` samples of each, variants interleaved, the caches evicted before each
    call where the model's weights exceed them (`evict_bytes`), in alternating blocks,
    longer while the noise leaves a verdict open (`measure_blocks`). Returns the
    samples (us) per library (as many for each, block by block), whether each result
    was equal and the task's seconds."""

    start, cpu, wall = time.perf_counter(), _cpu_seconds(), time.time()
    inputs = kernel_inputs(spec)
    # written (read and stored through the caches) before each timed call
    evict = np.zeros(evict_bytes(spec) // 4, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="kiln-measure-") as tmp:
        fns = []
        for i, data in enumerate(libraries):
            path = Path(tmp) / f"v{i}.so"
            path.write_bytes(data)
            lib = load_module(str(path), num_threads=threads)
            if evict.size and isinstance(lib, LibraryModule):
                # idle workers sleep at once: an eviction outlasts the spin window
                # anyway, and a library's spinning workers would share the CPUs with
                # the next variant's call; every call pays one wake-up alike
                lib.set_spin_us(0)
            fns.append(lib["main"])
        outs = [np.asarray(fn(*inputs)) for fn in fns]
        equal = [equal_result(o, outs[0]) for o in outs]
        for _ in range(warmup):
            for fn in fns:
                fn(*inputs)
        # a sample is the fastest of CALLS calls, of COLD_CALLS where each call is
        # preceded by an eviction (which, not the call, takes most of the time)
        calls = COLD_CALLS if evict.size else CALLS

        def sample(fn: Callable[..., Any]) -> float:
            best = float("inf")
            for _ in range(calls):
                if evict.size:
                    np.add(evict, 1.0, out=evict)
                t0 = time.perf_counter()
                fn(*inputs)
                best = min(best, time.perf_counter() - t0)
            return best * 1e6

        times = measure_blocks(sample, fns, equal, repeats)
    return {"times_us": times, "equal": equal, "node": task_node(),
            "seconds": time.perf_counter() - start, "cpu_seconds": _cpu_seconds() - cpu,
            "span": (wall, time.time())}


@dataclass(eq=False)
class _State:
    """What the tuner knows of one kernel."""

    spec: KernelSpec
    default_lib: bytes | None = None
    default_times: list[float] = field(default_factory=list)
    measured: list[Measurement] = field(default_factory=list)
    tried: int = 0  # candidates handed to builds
    failed: bool = False
    queued: bool = False  # its default is built or being built
    building: int = 0  # build tasks under way
    measuring: bool = False
    ready: list[tuple[Params, bytes]] = field(default_factory=list)  # built, not measured

    def score(self) -> tuple[bool, float]:
        """Kernels not measured yet first (by occurrences / (candidates tried + 1)),
        then by default time x occurrences / (candidates tried + 1)."""
        if not self.default_times:  # picked before its default's timings are in
            return True, float(self.spec.count) / (self.tried + 1)
        return False, float(np.median(self.default_times)) * self.spec.count / (self.tried + 1)

    def open(self) -> bool:
        """Whether candidates are left to build."""
        return self.queued and not self.failed and self.tried < len(self.spec.candidates)


@dataclass(eq=False)
class _Task:
    """A build or measurement task under way."""

    kind: str  # "build" | "measure"
    state: _State
    cpus: float
    pending: Pending
    params: list[Params | None]  # build: the jobs' params (None: the default)
    libs: list[tuple[Params, bytes]] = field(default_factory=list)  # measure: candidates
    submitted: float = 0.0


@dataclass
class TuneReport:
    """The database a run made, and what happened (for the log); `check` what the
    whole-model check decided (None: not run)."""

    database: TuningDatabase
    lines: list[str]
    kernels: int
    measured: int
    discarded: list[str]
    builds_on: set[str]
    measured_on: set[str]
    seconds: float
    profile: dict[str, float] = field(default_factory=dict)
    # ("build" | "measure", start, end): each task's wall-clock span, for a timeline
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    check: ModelCheck | None = None


Build = Callable[[Sequence[tuple[Any, ...]]], list[TaskOutcome]]
Measure = Callable[[Sequence[tuple[Any, ...]]], list[TaskOutcome]]
#: Starts tasks over argument tuples; calling the result waits for their outcomes.
Start = Callable[[Sequence[tuple[Any, ...]]], Pending]

#: Variants per build task (one kernel's: its weights ship once per task), and the
#: built candidates of a kernel that make its measurement due. Small, so a CPU that
#: frees takes the next task soon and no CPU waits long for another's last build.
PER_BUILD = 2


def tune(specs: Sequence[KernelSpec], target: Any, budget_s: float, *,
         executor: Executor | None = None, build: Build | None = None,
         measure: Measure | None = None, log: Callable[[str], None] = lambda s: None,
         repeats: int = REPEATS, warmup: int = WARMUP, threads: int | None = None,
         clock: Callable[[], float] = time.monotonic) -> TuneReport:
    """Measure candidates of `specs` on `target` until `budget_s` seconds are spent.

    `build` / `measure` run a list of `build_variants` / `measure_kernel` argument
    tuples (default: as tasks of `executor`; measurement tasks with
    `measure_resource`); a test injects recorded ones.

    No rounds: every CPU of the executor keeps one task. When a task ends, the driver
    starts the next: a measurement when one is due (a kernel with `PER_BUILD` built
    candidates, or its default not measured yet, or no more builds coming; one
    measurement at a time per measuring node, and builds wait while a due measurement
    waits for its CPUs), else a build of `PER_BUILD` variants of one kernel: the default
    and a candidate of the most frequent kernel not built yet (while fewer than 2 x
    CPUs kernels await their first timings), else the next candidates of the kernel of
    the largest score (`_State.score`). Builds start while the budget leaves time for
    one more build and measurement (the longest seen); what is built is measured.
    Picks depend on the timings in the order tasks end: an executor whose tasks end in
    submission order (this process, a test's recorded runs) gives the same database
    every run."""

    tgt = resolve(target)
    spec_text = str(tgt)
    runner = executor or InProcessExecutor()
    start_build: Start = _eager(build) if build is not None else \
        (lambda args: runner.submit(build_variants, args))
    if measure is None:
        start_measure, measure_cpus, measurers = _measurer(runner, tgt, target, threads, log)
    else:
        start_measure, measure_cpus, measurers = _eager(measure), 1.0, 1
    cpus = float(_cpus(runner))
    run = _TuneRun(runner=runner, target_text=spec_text, budget_s=budget_s, cpus=cpus,
                   start_build=start_build, start_measure=start_measure,
                   measure_cpus=measure_cpus, measurers=measurers, warmup=warmup,
                   repeats=repeats, threads=threads, clock=clock, log=log, start=clock(),
                   states=[_State(s) for s in specs])
    run.note(f"tuning {len(specs)} distinct kernel(s) for {target_key(_isa(tgt))}, "
             f"budget {budget_s:.0f} s, {cpus:.0f} CPU(s) each running one task at a time "
             f"(builds of {PER_BUILD} variants, measurements one at a time per node)")
    run.launch()
    run.drain()
    db = run.database(target_key(_isa(tgt)))
    run.note_choices(db)
    return run.report(db, len(specs))


@dataclass(eq=False)
class _TuneRun:
    """The driver of one `tune` run: what it knows of each kernel, the tasks under way,
    and what it logs and tallies for the report."""

    runner: Executor
    target_text: str  # str(target): what every build task compiles for
    budget_s: float
    cpus: float  # the executor's CPUs, each keeping one task
    start_build: Start
    start_measure: Start
    measure_cpus: float  # CPUs one measurement holds
    measurers: int  # measurements under way at most (one per measuring node)
    warmup: int
    repeats: int
    threads: int | None
    clock: Callable[[], float]
    log: Callable[[str], None]
    start: float  # the clock when the run began
    states: list[_State]
    lines: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    builds_on: set[str] = field(default_factory=set)
    measured_on: set[str] = field(default_factory=set)
    # where the wall time goes (seconds): the time the driver waited for a build or a
    # measurement to end (it waits for whichever ends first), the time the tasks report,
    # and the CPU time they had (on a loaded machine far less than their time)
    profile: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("build", "build_tasks", "build_cpu", "measure", "measure_tasks", "measure_cpu"), 0.0))
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    driver_cpu: float = field(default_factory=time.process_time)  # at the run's start
    # the longest task of each kind (clock): the budget keeps room for one more of each
    longest: dict[str, float] = field(default_factory=lambda: {"build": 0.0, "measure": 0.0})
    running: list[_Task] = field(default_factory=list)
    measured: int = 0

    def note(self, text: str) -> None:
        """Log `text` and keep it for the report."""
        self.lines.append(text)
        self.log(text)

    def discard(self, text: str) -> None:
        """Record a discarded variant or kernel (`text`: what and why) and log it."""
        self.discarded.append(text)
        self.note(f"  discarded {text}")

    def time_left(self) -> bool:
        """Whether the budget leaves time for one more build and measurement."""
        return (self.clock() - self.start + self.longest["build"] + self.longest["measure"]
                <= self.budget_s)

    def due(self, more: bool) -> _State | None:
        """The kernel whose measurement is due (its default unmeasured first, then the
        most candidates ready), None when none is; `more`: builds may still start."""
        cands = [st for st in self.states if _measurement_due(st, more)]
        return max(cands, key=lambda st: (not st.default_times, len(st.ready)),
                   default=None)

    def next_build(self) -> list[tuple[_State, Params | None]]:
        """The variants of the next build task (one kernel's; None: its default), or none."""
        states = self.states
        fresh = [st for st in states if not st.queued and not st.failed]
        waiting = sum(st.queued and not st.default_times and not st.failed for st in states)
        opened = [st for st in states if st.open()]
        if fresh and (waiting < 2 * self.cpus or not opened):
            st = max(fresh, key=lambda s: s.spec.count)  # the first of the most frequent
            st.queued = True
            jobs: list[tuple[_State, Params | None]] = [(st, None)]
        elif opened:
            st = max(opened, key=_State.score)
            jobs = []
        else:
            return []
        while len(jobs) < PER_BUILD and st.tried < len(st.spec.candidates):
            jobs.append((st, st.spec.candidates[st.tried]))
            st.tried += 1
        return jobs

    def launch(self) -> None:
        """Fill the free CPUs: a due measurement first (builds wait for its CPUs), else
        builds while the budget lasts."""
        while True:
            free = self.cpus - sum(t.cpus for t in self.running)
            more = self.time_left()
            st = self.due(more) \
                if sum(t.kind == "measure" for t in self.running) < self.measurers else None
            if st is not None:
                if free < min(self.measure_cpus, self.cpus):
                    return
                self.start_measurement(st)
                continue
            if free < 1 or not more:
                return
            jobs = self.next_build()
            if not jobs:
                return
            self.start_builds(jobs)

    def start_measurement(self, st: _State) -> None:
        """Start measuring `st`'s default against its candidates built since the last."""
        cands, st.ready = st.ready, []
        st.measuring = True
        assert st.default_lib is not None
        began = self.clock()
        pending = self.start_measure([(st.spec, [st.default_lib, *(d for _, d in cands)],
                                       self.warmup, self.repeats, self.threads)])
        self.running.append(_Task("measure", st, min(self.measure_cpus, self.cpus), pending,
                                  [], cands, began))

    def start_builds(self, jobs: list[tuple[_State, Params | None]]) -> None:
        """Start one build task of `jobs` (variants of one kernel)."""
        st = jobs[0][0]
        st.building += 1
        began = self.clock()
        pending = self.start_build([([(st.spec, self.target_text, params)
                                      for _, params in jobs],)])
        self.running.append(_Task("build", st, 1.0, pending, [p for _, p in jobs],
                                  submitted=began))

    def drain(self) -> None:
        """Wait for the tasks as they end, each end starting the next, until none runs."""
        while self.running:
            t0 = time.perf_counter()
            task = self.running.pop(self.runner.first_done([t.pending for t in self.running]))
            (outcome,) = task.pending()
            self.profile[task.kind] += time.perf_counter() - t0
            self.longest[task.kind] = max(self.longest[task.kind],
                                          self.clock() - task.submitted)
            (self.finish_build if task.kind == "build" else self.finish_measure)(task, outcome)
            self.launch()

    def tally(self, kind: str, value: Mapping[str, Any]) -> None:
        """Count a finished task's node, seconds, CPU seconds and span (`kind`: "build"
        or "measure")."""
        (self.builds_on if kind == "build" else self.measured_on).add(value["node"])
        self.profile[f"{kind}_tasks"] += float(value.get("seconds", 0.0))
        self.profile[f"{kind}_cpu"] += float(value.get("cpu_seconds", 0.0))
        if "span" in value:
            self.spans.append((kind, *value["span"]))

    def finish_build(self, task: _Task, outcome: TaskOutcome) -> None:
        """Take a build task's libraries: the default's, or candidates ready to measure."""
        st = task.state
        st.building -= 1
        for params, out in zip(task.params, _variant_outcomes(task, outcome), strict=True):
            if not out.ok:
                what = "default" if params is None else show(params)
                st.failed = st.failed or params is None
                self.discard(f"{st.spec.label} {what}: build failed: {out.error}")
                continue
            self.tally("build", out.value)
            if params is None:
                st.default_lib = out.value["data"]
            else:
                st.ready.append((params, out.value["data"]))

    def finish_measure(self, task: _Task, outcome: TaskOutcome) -> None:
        """Take a measurement task's timings: the default's, and each candidate's paired
        with them."""
        st = task.state
        st.measuring = False
        if not outcome.ok:  # the kernel is left alone (measuring it again would fail too)
            st.failed = True
            self.discard(f"{st.spec.label}: measurement failed: {outcome.error}")
            return
        value = outcome.value
        self.tally("measure", value)
        st.default_times += value["times_us"][0]
        paired = tuple(value["times_us"][0])
        for (params, _), times, eq in zip(task.libs, value["times_us"][1:],
                                          value["equal"][1:], strict=True):
            st.measured.append(Measurement(dict(params), tuple(times), eq, paired))
            self.measured += 1
            if not eq:
                self.discard(f"{st.spec.label} {show(params)}: result differs "
                             "from the default's")
        self.note(f"measured {st.spec.label}: {len(task.libs)} candidate(s); {self.measured} "
                  f"measured, {self.clock() - self.start:.0f} s of {self.budget_s:.0f} s")

    def database(self, key: str) -> TuningDatabase:
        """The records of every kernel whose default was measured, for target `key`."""
        return TuningDatabase(
            Record(st.spec.family, st.spec.signature, key,
                   Measurement(dict(st.spec.default), tuple(st.default_times)), st.measured)
            for st in self.states if st.default_times)

    def note_choices(self, db: TuningDatabase) -> None:
        """Log each kernel's chosen variant with its speed-up over the default."""
        for r in db.records():
            if r.chosen is not None:
                best = next(c for c in r.candidates if c.params == r.chosen)
                _, mid, high = ratio_bounds(best.times_us, best.default_us,
                                            sum(c.equal for c in r.candidates))
                self.note(f"  {r.kernel} {r.signature}: {show(r.chosen)} {1 / mid:.2f}x the "
                          f"default's {show(r.default.params)} (at least {1 / high:.2f}x, "
                          f"{len(best.times_us)} paired samples)")

    def report(self, db: TuningDatabase, kernels: int) -> TuneReport:
        """The run's report, after logging where its time went."""
        wall = self.clock() - self.start
        profile = self.profile
        profile["driver_cpu"] = time.process_time() - self.driver_cpu
        self.note(f"time: {wall:.1f} s wall; builds {profile['build_tasks']:.1f} s in tasks "
                  f"({profile['build_cpu']:.1f} s CPU, {profile['build']:.1f} s waited for), "
                  f"measurements {profile['measure_tasks']:.1f} s in tasks "
                  f"({profile['measure_cpu']:.1f} s CPU, {profile['measure']:.1f} s waited for)")
        return TuneReport(db, self.lines, kernels, self.measured, self.discarded,
                          self.builds_on, self.measured_on, wall, profile, self.spans)


def _measurement_due(st: _State, more: bool) -> bool:
    """Whether `st` is to be measured now: its default is built and not timed yet, or
    `PER_BUILD` candidates are ready, or some are and no more are coming (`more`:
    builds may still start)."""
    if st.default_lib is None or st.measuring or st.failed:
        return False
    if not st.default_times:
        return True
    return len(st.ready) >= PER_BUILD or (bool(st.ready) and not (
        st.building or (more and st.open())))


def _variant_outcomes(task: _Task, outcome: TaskOutcome) -> list[TaskOutcome]:
    """The outcome of each variant of build `task`: its own, or the task's failure for
    all; a library built by another kiln version fails."""

    values = [TaskOutcome(error=v["error"]) if "error" in v else TaskOutcome(v)
              for v in outcome.value] if outcome.ok else \
        [TaskOutcome(error=outcome.error)] * len(task.params)
    return [TaskOutcome(error=f"the node runs kiln {out.value['kiln']}, "
                              f"this machine {version}: install one version")
            if out.ok and out.value.get("kiln", version) != version else out
            for out in values]


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (a build's linker)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def show(params: Mapping[str, Any]) -> str:
    """`params` as compact JSON, for logs."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def _eager(run: Callable[[Sequence[tuple[Any, ...]]], list[TaskOutcome]]) -> Start:
    """A synchronous runner (a test's recorded one) as a `Start`: runs at once."""
    def start(args: Sequence[tuple[Any, ...]]) -> Pending:
        out = run(args)
        return lambda: out

    return start


def _measurer(runner: Executor, tgt: Any, target: Any, threads: int | None,
              log: Callable[[str], None]) -> tuple[Start, float, int]:
    """Starts `measure_kernel` tasks: on Ray, only on nodes offering the target's
    measurement resource (one unit: one measurement at a time per node), each holding
    as many CPUs as it runs threads (so no build shares them). Also gives those CPUs
    and how many nodes measure."""
    resource = measure_resource(tgt)
    where = runner.describe()
    ray = where.get("engine") == "ray"
    nodes = [n for n in where.get("nodes", []) if resource in n.get("resources", ())]
    if ray and not nodes:
        raise UsageError(
            f"no node of the Ray cluster measures for this CPU: start the nodes whose "
            f"CPU is the target's with `ray start --resources='{{\"{resource}\": 1}}'`")
    if not ray and resource != measure_resource(resolve("host")):
        log(f"warning: this machine's CPU ({target_key(_isa(resolve('host')))}) is not "
            f"the target's ({target_key(_isa(tgt))}): the timings are this machine's")
    most = min((float(n.get("cpus") or 1) for n in nodes), default=1.0)
    cpus = max(1.0, min(float(threads or 1), most))

    def start(args: Sequence[tuple[Any, ...]]) -> Pending:
        return runner.submit(measure_kernel, args, num_cpus=cpus,
                             resources={resource: 1.0} if ray else None)

    return start, cpus, max(1, len(nodes))


def _isa(tgt: Any) -> Any:
    return isa_for(tgt)


def _cpus(executor: Executor) -> int:
    nodes = executor.describe().get("nodes") or []
    return max(1, int(sum(float(n.get("cpus") or 0) for n in nodes))) if nodes else 1
