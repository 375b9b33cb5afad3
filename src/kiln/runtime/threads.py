"""The threads of a library's parallel loops, from Python (docs/runtime.md, "Threads").

Every kiln library carries its own thread pool (docs/abi.md, "Parallel loops") and
exports its controls (docs/abi.md, "Threads"): `{prefix}_set_num_threads`,
`{prefix}_num_threads`, `{prefix}_set_spin_us` and `{prefix}_pool_stats`. This module
binds them and keeps the process-wide defaults:

    kiln.runtime.set_num_threads(2)            # every library without its own count
    lib = kiln.runtime.load_module("m.so", num_threads=1)   # this one: 1 thread
    kiln.runtime.set_spin_us(50_000)           # idle workers spin 50 ms, then sleep

A library loaded with `num_threads=` keeps that count; the others follow
`set_num_threads` (libraries loaded before the call too). `None` gives a library
back its own default: `$KILN_NUM_THREADS`, else one thread per online CPU.
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from typing import Any, NamedTuple

from kiln.errors import ArgumentTypeError, CallError, UsageError

# The pool's controls, `{prefix}_{name}`, exported by every library kiln builds.
POOL_EXPORTS = ("set_num_threads", "num_threads", "set_spin_us", "pool_stats")
# kiln_host.c's KILN_POOL_MAX_THREADS and KILN_POOL_MAX_SPIN_US.
MAX_THREADS = 256
MAX_SPIN_US = 10_000_000

_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "set_num_threads": (ctypes.c_int32, [ctypes.c_int32]),
    "num_threads": (ctypes.c_int32, []),
    "set_spin_us": (ctypes.c_int32, [ctypes.c_int32]),
    "pool_stats": (ctypes.c_int32, [ctypes.POINTER(ctypes.c_int64), ctypes.c_int32]),
}


class PoolStats(NamedTuple):
    """`{prefix}_pool_stats`: a library pool's counters, in kiln_host.c's order."""

    threads: int   # threads of parallel loops, the caller included
    started: int   # worker threads running
    sleeping: int  # workers asleep now (past the spin window)
    sleeps: int    # times a worker went to sleep
    loops: int     # loops handed to the pool
    small: int     # loops run on the caller alone: too small to hand off
    spin_us: int   # the spin window
    pinned: int    # workers pinned to a CPU (docs/abi.md, "Parallel loops")
    # Chunks of the loops handed to the pool, run by any thread; of them, those a worker
    # ran (the rest: the caller) and those a thread took from another's share (a late
    # worker's). `helped / chunks` near `1 - 1 / threads`: the workers take their part.
    chunks: int
    helped: int
    stolen: int
    # Time the threads spent running those chunks (summed over the threads) and the
    # loops' wall time from posting to return: `work_ns / (span_ns * threads)` is the
    # share of the pool's time spent working (the rest: waiting for a late thread).
    work_ns: int
    span_ns: int
    # Of the sleeps, those a worker took before its spin window ended because it found
    # it had been descheduled while it spun, or after the shorter window a worker spins
    # for while one was lately: other threads want the CPUs (docs/abi.md, "Parallel
    # loops").
    preempted: int
    # The verdict from the model's own loops (docs/abi.md "Parallel loops"; off with
    # $KILN_PROBE_MS=0): probes (loops run the other way than the verdict's, each timed
    # against its last run the verdict's way), those that ran faster on the caller alone,
    # the loops run on the caller alone (by the verdict, or as probes), the typical
    # recent probe's time alone over its time on the threads in thousandths (about
    # 1500-2000 for two threads on two cores, below 850: the loops go alone) and the
    # times the verdict changed (odd: the loops run on the caller alone now).
    probes: int
    shared: int
    alone: int
    gain: int
    switches: int


class PoolControls:
    """The thread controls of one loaded library (`cdll`, symbols `{prefix}_...`).

    Raises AttributeError when the library does not export them (built by an older
    kiln, or not by kiln)."""

    def __init__(self, cdll: ctypes.CDLL, prefix: str, last_error: Any) -> None:
        self._fns: dict[str, Any] = {}
        for name in POOL_EXPORTS:
            fn = cdll[f"{prefix}_{name}"]
            fn.restype, fn.argtypes = _SIGNATURES[name]
            self._fns[name] = fn
        self._last_error = last_error
        self.explicit = False  # num_threads given for this library: ignore the default

    def set_num_threads(self, n: int | None) -> None:
        self._check(self._fns["set_num_threads"](0 if n is None else check_num_threads(n)))

    def num_threads(self) -> int:
        return int(self._fns["num_threads"]())

    def set_spin_us(self, us: int | None) -> None:
        self._check(self._fns["set_spin_us"](-1 if us is None else check_spin_us(us)))

    def stats(self) -> PoolStats:
        out = (ctypes.c_int64 * len(PoolStats._fields))()
        count = self._fns["pool_stats"](out, len(out))
        return PoolStats(*(int(out[i]) if i < count else 0 for i in range(len(out))))

    def _check(self, status: int) -> None:
        if status != 0:  # arguments are checked above: only a changed C side gets here
            raise UsageError(self._last_error() or f"the thread pool refused (status {status})")


def _whole_number(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be an integer, got a bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(f"{what} must be an integer, got "
                                f"{type(value).__name__}") from None


def check_num_threads(n: object) -> int:
    """`n` as a thread count (the calling thread included): 1 to MAX_THREADS."""
    count = _whole_number(n, "num_threads")
    if not 1 <= count <= MAX_THREADS:
        raise UsageError(f"num_threads={count}: expected 1 to {MAX_THREADS} (threads of a "
                         "library's parallel loops, the calling thread included; None for "
                         "the default)")
    return count


def check_spin_us(us: object) -> int:
    """`us` as a spin window in microseconds: 0 to MAX_SPIN_US."""
    value = _whole_number(us, "spin_us")
    if not 0 <= value <= MAX_SPIN_US:
        raise UsageError(f"spin_us={value}: expected 0 to {MAX_SPIN_US} microseconds (None "
                         "for the default)")
    return value


# The process-wide defaults, and the libraries they apply to.
_default_threads: int | None = None
_default_spin_us: int | None = None
_libraries: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def attach(lib: Any, num_threads: int | None) -> PoolControls | None:
    """Bind the controls of `lib` (a LibraryModule with `cdll`, `prefix`, `last_error`)
    and apply `num_threads`, else the process defaults. None when the library has no
    controls; then `num_threads` raises UsageError."""
    if num_threads is not None:
        num_threads = check_num_threads(num_threads)
    try:
        controls = PoolControls(lib.cdll, lib.prefix, lib.last_error)
    except AttributeError:
        if num_threads is not None:
            raise UsageError(f"{lib.path}: this library has no thread controls "
                             f"({lib.prefix}_set_num_threads; built by an older kiln): "
                             "rebuild it, or set KILN_NUM_THREADS") from None
        return None
    controls.explicit = num_threads is not None
    threads = num_threads if num_threads is not None else _default_threads
    if threads is not None:
        controls.set_num_threads(threads)
    if _default_spin_us is not None:
        controls.set_spin_us(_default_spin_us)
    _libraries[id(lib)] = lib
    return controls


def set_num_threads(n: int | None) -> None:
    """Threads of parallel loops (the calling thread included) for every library loaded
    without `num_threads=`, now and later; None: each library's default
    ($KILN_NUM_THREADS, else one per online CPU). Takes effect from each library's next
    parallel loop. UsageError outside 1..MAX_THREADS."""
    global _default_threads
    _default_threads = None if n is None else check_num_threads(n)
    for lib in list(_libraries.values()):
        controls = getattr(lib, "pool", None)
        if controls is not None and not controls.explicit and not lib.closed:
            controls.set_num_threads(_default_threads)


def set_spin_us(us: int | None) -> None:
    """How long the idle workers of every library, loaded now or later, spin before they
    sleep, in microseconds (0: sleep at once); None: $KILN_SPIN_US, else 20000. A
    longer window answers a call after a pause sooner and burns that much CPU time."""
    global _default_spin_us
    _default_spin_us = None if us is None else check_spin_us(us)
    for lib in list(_libraries.values()):
        controls = getattr(lib, "pool", None)
        if controls is not None and not lib.closed:
            controls.set_spin_us(_default_spin_us)


def default_threads() -> int | None:
    """The count set by set_num_threads (None: each library's own default)."""
    return _default_threads


def default_spin_us() -> int | None:
    """The window set by set_spin_us (None: each library's own default)."""
    return _default_spin_us


def controls_of(lib: Any) -> PoolControls:
    """The controls of an open library, or CallError."""
    if lib.closed:
        raise CallError(f"the library {str(lib.path)!r} is closed")
    if lib.pool is None:
        raise UsageError(f"{lib.path}: this library has no thread controls (built by an older "
                         "kiln, or without native code)")
    return lib.pool
