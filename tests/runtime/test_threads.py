"""The thread pool's controls (docs/runtime.md, "Threads"; docs/abi.md, "Threads").

One small kernel with a parallel loop, exported once; every test loads its own copy
of the `.so` (a library's pool is static state of that file, read once per load):
the thread count from `load_module(num_threads=)`, `kiln.runtime.set_num_threads`
and `$KILN_NUM_THREADS`, bad values, the spin-then-sleep policy seen through the
pool's counters (`pool_stats`), small loops run on the caller, opt-in pinning, and
the same controls from a C program in a fresh process. Results are identical bit
for bit with 1 and 2 threads. Nothing is timed: waits have generous timeouts only.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import runtime
from kiln.errors import ArgumentTypeError, UsageError
from kiln.ir import IRBuilder, IRModule
from kiln.runtime import LibraryModule, PoolStats, include_dir, load_module
from kiln.transform import PassContext

ROWS, COLS = 64, 33
TIMEOUT = 60  # seconds: far beyond any real wait (no timing is asserted)
POOL_ENV = ("KILN_NUM_THREADS", "KILN_SPIN_US", "KILN_SERIAL_NS", "KILN_PIN_THREADS",
            "KILN_PROBE_MS")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def pool_module() -> IRModule:
    """`affine(X, Y)`: Y = X * 1.5 - 0.25, rows in parallel."""
    ib = IRBuilder()
    with ib.prim_func("affine"):
        x = ib.arg("X", (ROWS, COLS), "float32")
        y = ib.arg("Y", (ROWS, COLS), "float32")
        with ib.for_range(ROWS, name="i", kind="parallel") as i, \
                ib.for_range(COLS, name="j") as j:
            ib.store(y, [i, j], x[i, j] * 1.5 - 0.25)
    return ib.get()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with PassContext(config={"kiln.cache": False}):
        ex = kiln.compile(pool_module(), "llvm", graph_pipeline=None, tensor_pipeline=None)
    path = tmp_path_factory.mktemp("pool") / "pool.so"
    ex.export_library(path)
    return path


@pytest.fixture
def fresh(exported: Path, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., LibraryModule]]:
    """Load a private copy of the library (its own pool), with a clean environment and
    no probe (the counters below count hand-offs whatever the host's cores do)."""
    for name in POOL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KILN_PROBE_MS", "0")
    opened: list[LibraryModule] = []

    def load(**kwargs: object) -> LibraryModule:
        copy = tmp_path / f"pool{len(opened)}.so"
        shutil.copyfile(exported, copy)
        lib = load_module(copy, **kwargs)  # type: ignore[arg-type]
        assert isinstance(lib, LibraryModule)
        opened.append(lib)
        return lib

    yield load
    for lib in opened:
        lib.close()
    runtime.set_num_threads(None)
    runtime.set_spin_us(None)


X = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)


def run(lib: LibraryModule) -> np.ndarray:
    y = np.empty_like(X)
    lib["affine"](X, y)
    return y


def wait_for(lib: LibraryModule, done: Callable[[PoolStats], bool]) -> PoolStats:
    """The pool's counters once `done` holds (a worker's state changes on its own time)."""
    deadline = time.monotonic() + TIMEOUT
    stats = lib.pool_stats()
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.005)
        stats = lib.pool_stats()
    return stats


def test_workers_spin_for_the_window_then_sleep(fresh: Callable[..., LibraryModule],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle worker spins for its window, then sleeps; one that another process
    takes its CPU from sleeps then, before its window ends (a spinning thread is charged
    for its spin, so it would be the last to run its share of the next loop)."""
    monkeypatch.setenv("KILN_SERIAL_NS", "0")  # every loop goes to the pool
    monkeypatch.setenv("KILN_PIN_THREADS", "1")  # the worker's CPU, for the other process
    lib = fresh(num_threads=2)
    lib.set_spin_us(runtime.threads.MAX_SPIN_US)  # 10 s
    want = X * np.float32(1.5) - np.float32(0.25)
    before = _thread_cpus()
    np.testing.assert_array_equal(run(lib), want)
    stats = lib.pool_stats()
    assert (stats.threads, stats.started, stats.loops, stats.small) == (2, 1, 1, 0)
    # Within its window the worker spins: it has not slept once, unless another thread
    # took its CPU (a loaded machine).
    assert stats.spin_us == 10_000_000 and (stats.sleeps == 0 or stats.preempted > 0)
    if _can_pin():  # Linux, 2 CPUs or more
        wait_for(lib, lambda s: s.pinned == 1)
        (cpu,) = (c for t, c in _thread_cpus().items() if t not in before)  # the worker's
        busy = subprocess.Popen([sys.executable, "-S", "-c", "import os, time\n"
                                 f"os.sched_setaffinity(0, {{{cpu}}})\n"
                                 f"end = time.monotonic() + {TIMEOUT}\n"
                                 "while time.monotonic() < end: pass"])
        try:
            stats = wait_for(lib, lambda s: s.sleeping == 1)  # long before the 10 s
        finally:
            busy.kill()
            busy.wait()
        assert stats.preempted >= 1 and stats.loops == 1
    # A window of 0 applies at once: the worker goes to sleep.
    np.testing.assert_array_equal(run(lib), want)
    lib.set_spin_us(0)
    stats = wait_for(lib, lambda s: s.sleeping == 1)
    slept = stats.sleeps
    assert stats.sleeping == 1 and slept >= 1
    # The next loop wakes it (or the caller does the work); it sleeps again after.
    np.testing.assert_array_equal(run(lib), want)
    stats = wait_for(lib, lambda s: s.sleeps == slept + 1 and s.sleeping == 1)
    assert (stats.loops, stats.sleeps, stats.sleeping) == (3, slept + 1, 1)
    lib.set_spin_us(None)  # the default window: 20 ms without KILN_SPIN_US
    assert lib.pool_stats().spin_us == 20_000


def test_thread_count_per_library_and_process_default(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_NUM_THREADS", "3")
    monkeypatch.setenv("KILN_SERIAL_NS", "0")
    runtime.set_num_threads(1)
    follows = fresh()
    own = fresh(num_threads=2)
    assert (follows.num_threads, own.num_threads) == (1, 2)
    one = run(follows)
    assert follows.pool_stats().started == 0  # one thread: no worker at all
    runtime.set_num_threads(2)  # applies to libraries loaded before it too
    assert (follows.num_threads, own.num_threads) == (2, 2)
    runtime.set_num_threads(1)  # ...but not to those given their own count
    assert (follows.num_threads, own.num_threads) == (1, 2)
    two = run(own)
    assert own.pool_stats().started == 1
    np.testing.assert_array_equal(one, two)  # the same chunks of work: the same bits
    runtime.set_num_threads(None)  # each library's own default: $KILN_NUM_THREADS
    assert follows.num_threads == 3
    own.set_num_threads(None)  # follows the process default again
    assert own.num_threads == 3
    own.set_num_threads(1)  # the pool shrinks at its next loop
    np.testing.assert_array_equal(run(own), two)
    assert own.pool_stats().started == 0


@pytest.mark.parametrize(("value", "error"), [
    (0, UsageError), (-1, UsageError), (257, UsageError), (10**12, UsageError),
    (True, ArgumentTypeError), ("2", ArgumentTypeError), (2.0, ArgumentTypeError)])
def test_bad_thread_counts_are_refused(fresh: Callable[..., LibraryModule], value: object,
                                       error: type[Exception]) -> None:
    with pytest.raises(error, match="num_threads"):
        runtime.set_num_threads(value)  # type: ignore[arg-type]
    with pytest.raises(error, match="num_threads"):
        fresh(num_threads=value)
    lib = fresh()
    with pytest.raises(error, match="num_threads"):
        lib.set_num_threads(value)  # type: ignore[arg-type]
    assert lib.num_threads >= 1


def test_bad_spin_windows_are_refused(fresh: Callable[..., LibraryModule]) -> None:
    lib = fresh()
    for value, error in ((-5, UsageError), (10**9, UsageError), (0.5, ArgumentTypeError)):
        with pytest.raises(error, match="spin_us"):
            runtime.set_spin_us(value)  # type: ignore[arg-type]
        with pytest.raises(error, match="spin_us"):
            lib.set_spin_us(value)  # type: ignore[arg-type]
    assert lib.pool_stats().spin_us == 20_000


def test_the_c_controls_refuse_bad_values_with_a_message(
        fresh: Callable[..., LibraryModule]) -> None:
    lib = fresh()
    set_threads = lib.cdll["kiln__set_num_threads"]
    set_spin = lib.cdll["kiln__set_spin_us"]
    assert set_threads(-2) == -1
    assert "set_num_threads: -2 threads: expected 1 to 256" in lib.last_error()
    assert set_threads(100_000) == -1 and set_spin(-7) == -1
    assert "set_spin_us: -7 microseconds" in lib.last_error()
    assert set_threads(0) == 0  # 0: back to the default


@pytest.mark.parametrize(("variable", "value", "field", "want"), [
    ("KILN_NUM_THREADS", "abc", "threads", "cpus"),
    ("KILN_NUM_THREADS", "0", "threads", "cpus"),
    ("KILN_NUM_THREADS", "-2", "threads", "cpus"),
    ("KILN_NUM_THREADS", "100000", "threads", 256),
    ("KILN_SPIN_US", "soon", "spin_us", 20_000),
    ("KILN_SPIN_US", "-1", "spin_us", 20_000),
    ("KILN_SPIN_US", "99999999999", "spin_us", 10_000_000),
    ("KILN_SPIN_US", "0", "spin_us", 0),
])
def test_bad_environment_values_fall_back(fresh: Callable[..., LibraryModule],
                                          monkeypatch: pytest.MonkeyPatch, variable: str,
                                          value: str, field: str, want: object) -> None:
    """Documented: a malformed or non-positive value is ignored, a huge one clamped."""
    monkeypatch.setenv(variable, value)
    lib = fresh()
    cpus = min(os.sysconf("SC_NPROCESSORS_ONLN"), 256)
    assert getattr(lib.pool_stats(), field) == (cpus if want == "cpus" else want)
    if want != 256:  # (not 255 workers on a small CI machine)
        np.testing.assert_array_equal(run(lib), X * np.float32(1.5) - np.float32(0.25))


@pytest.mark.parametrize("serial_ns", ["0", "2000000000"])
def test_loops_too_small_to_hand_off_run_on_the_caller(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch,
        serial_ns: str) -> None:
    """The first run of a loop measures its work; below KILN_SERIAL_NS (here: 0, never;
    2 s, always) the next runs stay on the calling thread."""
    monkeypatch.setenv("KILN_SERIAL_NS", serial_ns)
    lib = fresh(num_threads=2)
    first = run(lib)
    for _ in range(3):
        np.testing.assert_array_equal(run(lib), first)
    stats = lib.pool_stats()
    assert (stats.loops, stats.small) == ((4, 0) if serial_ns == "0" else (1, 3))


def test_the_pool_counts_the_chunks_and_who_ran_them(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch) -> None:
    """64 rows on 3 threads: shares of 21, 21 and 22 rows (the caller's first), each in
    11 chunks of at most 2 rows (22 / 16 rounded up). Every chunk is counted once,
    whoever ran it; the chunks of the workers' shares that no worker ran, the caller
    took from them (stolen)."""
    monkeypatch.setenv("KILN_SERIAL_NS", "0")  # every loop goes to the pool
    lib = fresh(num_threads=3)
    for _ in range(5):
        run(lib)
    stats = lib.pool_stats()
    assert (stats.loops, stats.chunks) == (5, 165) and stats.probes == 0
    assert 0 <= stats.helped <= 165 and 0 <= stats.stolen <= 165
    caller = stats.chunks - stats.helped
    assert stats.stolen >= caller - 5 * 11  # beyond its own share: other shares' chunks
    single = fresh(num_threads=1)  # no pool: its loops run directly, nothing counted
    run(single)
    assert (single.pool_stats().chunks, single.pool_stats().helped) == (0, 0)
    assert (single.pool_stats().work_ns, single.pool_stats().span_ns) == (0, 0)


def test_the_pool_times_its_loops_and_the_work_in_them(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch) -> None:
    """`span_ns` adds up the handed-off loops' wall time, posting to return; `work_ns`
    the time each thread spent in chunks. Every chunk runs inside its loop's span on one
    of the threads, so the work is at most span x threads; it is more than nothing,
    and a second run adds to both."""
    monkeypatch.setenv("KILN_SERIAL_NS", "0")  # every loop goes to the pool
    lib = fresh(num_threads=2)
    run(lib)
    first = lib.pool_stats()
    assert first.loops == 1 and 0 < first.work_ns <= first.span_ns * 2
    for _ in range(4):
        run(lib)
    stats = lib.pool_stats()
    assert stats.loops == 5 and 0 < stats.work_ns <= stats.span_ns * 2
    assert stats.work_ns > first.work_ns and stats.span_ns > first.span_ns


def _thread_cpus() -> dict[str, str]:
    """Each thread of this process and the CPUs it may run on (`Cpus_allowed_list`)."""
    return {tid: Path(f"/proc/self/task/{tid}/status").read_text()
            .split("Cpus_allowed_list:\t")[1].split("\n")[0]
            for tid in os.listdir("/proc/self/task")}


def _pinned_cpus() -> set[int]:
    """The CPUs that threads of this process are pinned to, one each."""
    return {int(allowed) for allowed in _thread_cpus().values() if allowed.isdigit()}


def _can_pin() -> bool:
    """Linux, 2 CPUs or more, and the OS lets this process set its threads' CPUs."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        return False
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("setting", [None, "1"])
def test_workers_pin_when_the_pool_fills_the_cpus_or_when_asked(
        setting: str | None, fresh: Callable[..., LibraryModule],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a pool with as many threads as the CPUs the process may use pins each
    worker to one of them; KILN_PIN_THREADS=1 pins a smaller pool too, 0 never pins.
    The results are the same either way."""
    if not _can_pin():
        pytest.skip("needs Linux, 2 CPUs or more and leave to set a thread's CPUs")
    monkeypatch.setenv("KILN_SERIAL_NS", "0")
    allowed = os.sched_getaffinity(0)
    threads = len(allowed) if setting is None else 2
    monkeypatch.setenv("KILN_PIN_THREADS", "0")
    plain = fresh(num_threads=threads)
    want = run(plain)
    assert plain.pool_stats().pinned == 0
    if setting is None:
        monkeypatch.delenv("KILN_PIN_THREADS")
    else:
        monkeypatch.setenv("KILN_PIN_THREADS", setting)
    pinned = fresh(num_threads=threads)
    np.testing.assert_array_equal(run(pinned), want)
    stats = wait_for(pinned, lambda s: s.started > 0 and s.pinned == s.started)
    assert stats.pinned == stats.started == threads - 1
    assert _pinned_cpus() and _pinned_cpus() <= allowed


def test_a_pool_smaller_than_the_machine_stays_unpinned(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch) -> None:
    """Other processes' pools of the same size would pin to the same CPUs."""
    monkeypatch.setenv("KILN_SERIAL_NS", "0")
    monkeypatch.delenv("KILN_PIN_THREADS", raising=False)
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 3:
        pytest.skip("needs 3 CPUs or more: a 2-thread pool on 2 CPUs fills the machine")
    small = fresh(num_threads=2)
    run(small)
    assert small.pool_stats().pinned == 0


C_PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <kiln/kiln.h>

typedef int32_t (*IntFn)(int32_t);
typedef int32_t (*CountFn)(void);
typedef int32_t (*StatsFn)(int64_t*, int32_t);

int main(int argc, char** argv) {
  float x[ROWS * COLS], y[ROWS * COLS];
  int64_t shape[2] = {ROWS, COLS}, stats[8];
  KilnValue args[2];
  int32_t codes[2];
  DLTensor tx, ty;
  struct timespec pause = {0, 5000000};
  int k, waited;
  void* lib = argc == 2 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  KilnPackedFunc affine = lib ? (KilnPackedFunc)dlsym(lib, "kiln_affine") : NULL;
  IntFn set_threads = lib ? (IntFn)dlsym(lib, "kiln__set_num_threads") : NULL;
  CountFn threads = lib ? (CountFn)dlsym(lib, "kiln__num_threads") : NULL;
  IntFn set_spin = lib ? (IntFn)dlsym(lib, "kiln__set_spin_us") : NULL;
  StatsFn pool_stats = lib ? (StatsFn)dlsym(lib, "kiln__pool_stats") : NULL;
  KilnStringFunc err = lib ? (KilnStringFunc)dlsym(lib, "kiln__last_error") : NULL;
  if (!affine || !set_threads || !threads || !set_spin || !pool_stats || !err) return 2;
  printf("bad %d %s\n", (int)set_threads(-1), err());
  if (set_threads(2) != 0 || set_spin(0) != 0) return 3;
  printf("threads %d\n", (int)threads());
  for (k = 0; k < ROWS * COLS; ++k) x[k] = (float)(k % 13) - 6.0f;
  tx = kiln_tensor(x, 2, shape, KILN_FLOAT32);
  ty = kiln_tensor(y, 2, shape, KILN_FLOAT32);
  kiln_set_tensor(args, codes, 0, &tx);
  kiln_set_tensor(args, codes, 1, &ty);
  if (affine(args, codes, 2) != 0) { fprintf(stderr, "%s\n", err()); return 4; }
  for (waited = 0; waited < 12000; ++waited) { /* 60 s at most */
    if (pool_stats(stats, 8) == 8 && stats[2] == 1) break;
    nanosleep(&pause, NULL);
  }
  printf("stats %lld %lld %lld %lld\n", (long long)stats[0], (long long)stats[1],
         (long long)stats[2], (long long)stats[3]);
  printf("y %.9g %.9g\n", y[0], y[ROWS * COLS - 1]);
  return 0;
}
"""


def test_the_controls_from_a_c_program(exported: Path, tmp_path: Path) -> None:
    """A plain C program (no Python) sets the count and the window, and sees the worker
    go to sleep; the environment would say one thread."""
    source = tmp_path / "main.c"
    source.write_text(C_PROGRAM.replace("ROWS", str(ROWS)).replace("COLS", str(COLS)))
    exe = tmp_path / "main"
    subprocess.run(["cc", "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra",
                    "-Werror", f"-I{include_dir()}", str(source), "-o", str(exe), "-ldl"],
                   check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k not in POOL_ENV}
    proc = subprocess.run([str(exe), str(exported)], capture_output=True, text=True,
                          timeout=2 * TIMEOUT, env=dict(env, KILN_NUM_THREADS="1",
                                                        KILN_SERIAL_NS="0", KILN_PROBE_MS="0"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bad -1 set_num_threads: -1 threads: expected 1 to 256")
    assert lines[1] == "threads 2"
    # 2 threads, 1 worker, asleep now, slept at least once (also before the first job,
    # when the worker starts before the caller posts it: the count is timing's)
    threads, workers, asleep, slept = (int(v) for v in lines[2].split()[1:])
    assert (threads, workers, asleep) == (2, 1, 1) and slept >= 1, lines[2]
    xs = ((np.arange(ROWS * COLS) % 13) - 6).astype(np.float32)
    want = xs[[0, -1]] * np.float32(1.5) - np.float32(0.25)
    assert lines[3] == f"y {want[0]:.9g} {want[1]:.9g}"


POOL_PROGRAM = r"""
#define _GNU_SOURCE
#define KILN_HOST_PARALLEL
#define KILN_POOL_PROBE_LOOPS 4 /* a probe every fourth loop at most (else 128th) */
#include <kiln/kiln_host.c>

enum { N = 64 };
static float data[N];
static pthread_t caller;
static int slow; /* 1: chunks on a worker wait 1 ms; 2: the whole loop on one thread does */

static void wait_ms(void) {
  struct timespec ms = {0, 1000000};
  nanosleep(&ms, NULL);
}

static int32_t scale(int64_t begin, int64_t end, void* context) {
  int64_t i;
  int r;
  (void)context;
  if ((slow == 1 && !pthread_equal(pthread_self(), caller))
      || (slow == 2 && end - begin == N)) {
    wait_ms();
  }
  for (i = begin; i < end; ++i) {
    for (r = 0; r < 4000; ++r) data[i] = data[i] * 0.5f + 1.0f; /* ~5 us */
  }
  return 0;
}

/* Two units of work at once over one alone, in thousandths: about 1000 on idle cores. */
static void* unit(void* out) {
  float own[256];
  int i, r;
  for (i = 0; i < 256; ++i) own[i] = (float)i;
  for (r = 0; r < 2000; ++r) for (i = 0; i < 256; ++i) own[i] = own[i] * 0.5f + 1.0f;
  *(float*)out = own[7];
  return NULL;
}

static int64_t pair_over_one(void) {
  int64_t alone = INT64_MAX, pair = INT64_MAX, start;
  pthread_t other;
  float sink[2];
  int k;
  for (k = 0; k < 5; ++k) {
    start = kiln_pool_now_ns();
    unit(&sink[0]);
    if (kiln_pool_now_ns() - start < alone) alone = kiln_pool_now_ns() - start;
    start = kiln_pool_now_ns();
    if (pthread_create(&other, NULL, unit, &sink[1]) != 0) return INT64_MAX;
    unit(&sink[0]);
    pthread_join(other, NULL);
    if (kiln_pool_now_ns() - start < pair) pair = kiln_pool_now_ns() - start;
  }
  return 1000 * pair / alone;
}

static int64_t chunks[1024][2];
static int count;

static int32_t record(int64_t begin, int64_t end, void* context) {
  int k = __atomic_fetch_add(&count, 1, __ATOMIC_SEQ_CST);
  (void)context;
  chunks[k][0] = begin;
  chunks[k][1] = end;
  return 0;
}

/* The chunks of a loop of n iterations on t threads, for each pair `n t` of args. */
static int split(int argc, char** argv) {
  int a, k;
  for (a = 0; a + 1 < argc; a += 2) {
    int64_t n = atoll(argv[a]);
    count = 0;
    if (kiln_set_num_threads(atoi(argv[a + 1])) != 0 || kiln_parallel_for(n, record, 0) != 0) {
      return 2;
    }
    printf("%lld %s:", (long long)n, argv[a + 1]);
    for (k = 0; k < count; ++k) {
      printf(" %lld-%lld", (long long)chunks[k][0], (long long)chunks[k][1]);
    }
    printf("\n");
  }
  return 0;
}

/* Loops until the verdict has changed `switches` times in all (at most `most` loops). */
static int run_until(int64_t switches, int most) {
  int64_t stats[KILN_POOL_STAT_COUNT];
  int k;
  for (k = 0; k < most; ++k) {
    if (KILN_PARALLEL_FOR(N, scale, NULL) != 0) return -1;
    kiln_pool_stats(stats, KILN_POOL_STAT_COUNT);
    if (stats[KILN_POOL_STAT_SWITCHES] >= switches) break;
  }
  return k;
}

/* argv[1]: `split` (then pairs `n threads`: the chunks), `one` (held to one CPU),
   `follow` (loops slow on the threads, then slow alone) or `two` (two idle CPUs; exit
   77 where they are not). Prints the counters. */
int main(int argc, char** argv) {
  cpu_set_t allowed, chosen;
  int64_t stats[KILN_POOL_STAT_COUNT];
  int cpus = strcmp(argv[1], "one") == 0 ? 1 : 2, cpu, k, bad = 0, taken = 0;
  if (strcmp(argv[1], "split") == 0) return split(argc - 2, argv + 2);
  caller = pthread_self();
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < cpus) return 77;
  CPU_ZERO(&chosen);
  for (cpu = 0; cpu < CPU_SETSIZE && taken < cpus; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) CPU_SET(cpu, &chosen), ++taken;
  }
  if (sched_setaffinity(0, sizeof chosen, &chosen) != 0 || kiln_set_num_threads(2) != 0) return 2;
  if (strcmp(argv[1], "follow") == 0) {
    slow = 1;
    printf("%d ", run_until(1, 1000)); /* goes alone */
    slow = 2;
    printf("%d ", run_until(2, 1000)); /* back to the threads */
  } else {
    if (cpus == 2 && pair_over_one() > 1150) return 77;
    for (k = 0; k < 200; ++k) {
      if (KILN_PARALLEL_FOR(N, scale, NULL) != 0) return 3;
    }
    if (cpus == 2 && pair_over_one() > 1150) return 77;
  }
  for (k = 0; k < N; ++k) bad += data[k] != 2.0f; /* 1, 1.5, 1.75, ... rounds to 2 */
  kiln_pool_stats(stats, KILN_POOL_STAT_COUNT);
  printf("%lld %lld %lld %lld %lld %lld %d\n", (long long)stats[KILN_POOL_STAT_PROBES],
         (long long)stats[KILN_POOL_STAT_SHARED], (long long)stats[KILN_POOL_STAT_ALONE],
         (long long)stats[KILN_POOL_STAT_LOOPS], (long long)stats[KILN_POOL_STAT_GAIN],
         (long long)stats[KILN_POOL_STAT_SWITCHES], bad);
  return 0;
}
"""


@pytest.fixture(scope="module")
def pool_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """POOL_PROGRAM, built against kiln_host.c."""
    source = tmp_path_factory.mktemp("pool_program") / "pool.c"
    source.write_text(POOL_PROGRAM)
    exe = source.with_suffix("")
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Werror", f"-I{include_dir()}",
                    str(source), "-o", str(exe), "-pthread"],
                   check=True, capture_output=True, text=True)
    return exe


def run_pool_program(exe: Path, *args: str, probe_ms: str = "1"
                     ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in POOL_ENV}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env=dict(env, KILN_SERIAL_NS="0", KILN_PROBE_MS=probe_ms))


def test_each_thread_gets_an_equal_share_of_the_iterations(pool_program: Path) -> None:
    """The split rule (docs/abi.md, "Parallel loops"): n iterations on T threads are T
    contiguous shares whose sizes differ by at most one, each in at most 16 chunks that
    stay inside it, so the threads get equal work whatever n is (chunks of ceil(n / 8)
    dealt out whole gave 100 iterations on 2 threads as shares of 52 and 48). The
    chunks are the same whoever runs them, so the program's record of them is exact."""
    cases = [(100, 2), (9, 2), (64, 3), (3, 2), (1001, 2), (12, 2), (130, 4)]
    proc = run_pool_program(pool_program, "split", *(str(v) for case in cases for v in case),
                            probe_ms="0")
    assert proc.returncode == 0, proc.stderr
    for line, (n, threads) in zip(proc.stdout.splitlines(), cases, strict=True):
        head, _, ranges = line.partition(":")
        assert head == f"{n} {threads}"
        got = sorted(tuple(int(v) for v in r.split("-")) for r in ranges.split())
        assert [b for b, _ in got] == [0] + [e for _, e in got[:-1]] and got[-1][1] == n
        bounds = [n * t // threads for t in range(threads + 1)]  # the shares
        for lo, hi in itertools.pairwise(bounds):
            inside = [(b, e) for b, e in got if lo <= b < hi]
            assert sum(e - b for b, e in inside) == hi - lo  # no chunk crosses a share
            assert 1 <= len(inside) <= 16 or hi == lo


def test_the_verdict_follows_the_loops_own_times(pool_program: Path) -> None:
    """The pool's verdict (docs/abi.md, "Parallel loops"), from the loops' own times:
    a loop whose chunks wait 1 ms on a worker runs alone once a few probes timed it
    alone (results exact either way); made slow alone instead, it goes back to the
    threads. A process held to one CPU runs every loop on the caller, no probe needed."""
    proc = run_pool_program(pool_program, "follow")
    if proc.returncode == 77:
        pytest.skip("fewer than two CPUs")
    assert proc.returncode == 0, proc.stderr
    to_alone, to_threads, probes, shared, alone, loops, gain, switches, bad = (
        int(v) for v in proc.stdout.split())
    assert to_alone < 1000 and to_threads < 1000 and switches == 2 and bad == 0, proc.stdout
    assert 1 <= shared < probes and alone > 0 and loops > 0 and gain >= 1000, proc.stdout
    proc = run_pool_program(pool_program, "one")
    assert proc.returncode == 0, proc.stderr
    probes, shared, alone, loops, gain, switches, bad = (int(v) for v in proc.stdout.split())
    assert (probes, alone, loops, switches, bad) == (0, 200, 0, 1, 0), proc.stdout


def test_two_idle_cpus_keep_the_loops_on_the_threads(pool_program: Path) -> None:
    """On two CPUs that run two threads at once as fast as one (checked before and
    after; skipped where they do not: a loaded host, or two vCPUs on one core), the
    probes find the loops faster on the threads and the verdict never changes."""
    proc = run_pool_program(pool_program, "two")
    if proc.returncode == 77:
        pytest.skip("no two idle CPUs of their own here")
    assert proc.returncode == 0, proc.stderr
    probes, shared, alone, loops, gain, switches, bad = (int(v) for v in proc.stdout.split())
    assert probes >= 5 and shared < probes and switches == 0 and gain >= 1000, proc.stdout
    assert alone >= probes and loops == 200 - alone and bad == 0, proc.stdout


def test_a_pinned_worker_leaves_the_cpu_its_caller_came_to(
        fresh: Callable[..., LibraryModule], monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker pinned away from its caller's CPU moves to the CPU the caller left once
    the caller posts loops from the worker's CPU (here: the calling thread pinned there
    after the pool started;
    two libraries in one process, their workers pinned while the caller ran on
    different CPUs, kept one of them sharing its caller's CPU), and the results stay the
    same."""
    if not _can_pin():
        pytest.skip("needs Linux, 2 CPUs or more and leave to set a thread's CPUs")
    monkeypatch.setenv("KILN_SERIAL_NS", "0")
    monkeypatch.setenv("KILN_PIN_THREADS", "1")
    allowed = os.sched_getaffinity(0)
    before = set(_thread_cpus())
    lib = fresh(num_threads=2)
    want = run(lib)
    wait_for(lib, lambda s: s.started == 1 and s.pinned == 1)
    (worker,) = set(_thread_cpus()) - before - {str(threading.get_native_id())}
    held = _thread_cpus()[worker]
    assert held.isdigit() and int(held) in allowed
    os.sched_setaffinity(0, {int(held)})  # this thread, the caller, to the worker's CPU
    try:
        for _ in range(3):
            np.testing.assert_array_equal(run(lib), want)
        # the worker takes the CPU when this thread blocks (the loops are short: the
        # caller may have run them all before the worker looked at them)
        deadline = time.monotonic() + TIMEOUT
        while _thread_cpus()[worker] == held and time.monotonic() < deadline:
            time.sleep(0.01)
        now = _thread_cpus()[worker]
        assert now.isdigit() and now != held and int(now) in allowed
    finally:
        os.sched_setaffinity(0, allowed)
