"""When a loop is worth the thread pool: one threshold, in time.

A parallel loop pays for its hand-off (posting it to the pool, the workers taking
their chunks, the caller waiting for the last one; bench/call_overhead.py measures
it) only when the time it saves, half its work on two threads,
exceeds that. So a loop goes parallel when its estimated work on one thread reaches
PARALLEL_MIN_NS. Every kernel family and the `parallelize` pass estimate that time
from their own measure of work (multiply-adds, row elements, IR expression nodes)
divided by the rate of the target's ISA (`kiln.target.isa.ISA`: its vector width
and FMA), and compare it with this one figure; the pool in the generated library
(kiln_host.c) uses the same figure as its default `KILN_SERIAL_NS` for the loops
it measures as they run.

The rates are a cost model, not a benchmark: a nominal clock of NOMINAL_GHZ, two
vector pipes (FMA or ALU) per core on vector targets, and SUSTAINED of that peak,
which small kernels reach (bench/nets.py's `cnn` checks it). A kernel that reads each
value once (a matrix-vector product's weights) is bound by the cache instead:
STREAM_BYTES_PER_CYCLE whatever the vector width (bench/gemv.py).

The threshold is a model-level tuning knob (`kiln tune`, docs/tuning.md "Model-level
knobs"): a tuning session may give the whole compile another one (the pseudo-kernel
`parallel_threshold` of kiln.tuning.apply, params `{"min_ns": N}`, N in
THRESHOLD_CHOICES), which the passes put on the ISA they hand down
(`ISA.parallel_min_ns`, kiln.transform.kernel_isa; `threshold_ns` reads it), for the
kernel families' rules and the `parallelize` pass alike; the runtime's
`KILN_SERIAL_NS` keeps PARALLEL_MIN_NS.
"""

from __future__ import annotations

from kiln.errors import UsageError
from kiln.ir.dtype import itemsize
from kiln.target.isa import ISA

#: Estimated one-thread work (ns) from which a loop runs on the thread pool: twice a
#: hand-off, plus a margin for a worker that is not spinning.
PARALLEL_MIN_NS = 5_000
#: The other thresholds (ns) `kiln tune` measures a model with (around the rule's).
THRESHOLD_CHOICES = (2_000, 10_000, 20_000)
#: The clock the rates assume (GHz).
NOMINAL_GHZ = 3.0
#: The fraction of the vector pipes' peak a small kernel sustains.
SUSTAINED = 0.5
#: Vector instructions a core issues per cycle (two FMA/ALU pipes on vector targets).
VECTOR_PIPES = 2
#: Bytes per cycle a kernel streaming values it reads once sustains from L2.
STREAM_BYTES_PER_CYCLE = 16
#: IR expression nodes (the `parallelize` pass's cost unit) per element operation of
#: a vectorized loop: a load with its index, the operation, the store.
NODES_PER_OPERATION = 4
#: The units of work the kernels measure: a multiply-add (one FMA lane; two
#: operations without FMA), an element of a row or a copy (one vector lane's
#: operation), an IR expression node (a fraction of one, NODES_PER_OPERATION), a
#: value streamed from cache and used once (STREAM_BYTES_PER_CYCLE).
UNITS = ("madd", "element", "node", "stream")


def rate(unit: str, isa: ISA, dtype: str = "float32") -> float:
    """Units of work of `dtype` one thread does per ns on `isa`."""
    if unit not in UNITS:
        raise UsageError(f"unit of work: expected one of {', '.join(UNITS)}, got {unit!r}")
    if unit == "stream":
        return STREAM_BYTES_PER_CYCLE / itemsize(dtype) * NOMINAL_GHZ
    lanes = isa.lanes(dtype) if isa.vector_bits else 1  # scalar pipes: one value
    per_cycle = lanes * (VECTOR_PIPES if isa.vector_bits else 1) * SUSTAINED
    if unit == "madd" and not isa.fma:
        per_cycle /= 2  # a multiply and an add
    if unit == "node":
        per_cycle *= NODES_PER_OPERATION
    return per_cycle * NOMINAL_GHZ


def work_ns(work: int, unit: str, isa: ISA, dtype: str = "float32") -> float:
    """The estimated time (ns) of `work` units of `unit` on one thread of `isa`."""
    return work / rate(unit, isa, dtype)


def threshold_ns(isa: ISA) -> int:
    """The one-thread work (ns) from which a loop goes parallel on `isa`: the tuning
    session's `parallel_threshold` the pass put on it (`ISA.parallel_min_ns`,
    kiln.transform.kernel_isa), else PARALLEL_MIN_NS."""
    return isa.parallel_min_ns or PARALLEL_MIN_NS


def min_parallel_work(unit: str, isa: ISA, dtype: str = "float32") -> int:
    """The least work (in `unit`s) worth a parallel loop on `isa`: `threshold_ns` of it
    (PARALLEL_MIN_NS unless a tuning session says otherwise)."""
    return max(1, round(threshold_ns(isa) * rate(unit, isa, dtype)))


def worth_parallel(work: int, unit: str, isa: ISA, dtype: str = "float32") -> bool:
    """Whether `work` units of `unit` pay for a parallel loop on `isa`."""
    return work >= min_parallel_work(unit, isa, dtype)


__all__ = ["NOMINAL_GHZ", "PARALLEL_MIN_NS", "SUSTAINED", "THRESHOLD_CHOICES", "UNITS",
           "min_parallel_work", "rate", "threshold_ns", "work_ns", "worth_parallel"]
