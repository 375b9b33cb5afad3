"""Load-time benchmark: a library holding ~45 MB of weights vs np.load of the same bytes.

    .venv/bin/python bench/load.py [--mb 45] [--repeat 7]

Compiles (once, untimed) a graph with a 45 MB embedding table as a constant
(`main(idx) = gather(table, idx)`) and exports it as one .so, plus a `.npy` of
the same weights. Then, in this one process, it times
`load_module` + the first call against `np.load`, and reports the resident
memory growth (VmRSS) right after loading, before anything touches the
weights. Goal: load in under 10 ms, and RSS growth far below the weight size,
because the weights are mapped from the file, not copied. Prints a table;
asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln
from kiln import ops
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.runtime import load_module

ROW = 1024  # embedding width: each lookup touches 4 KiB of the table


def build(folder: Path, megabytes: float) -> tuple[Path, Path, np.ndarray]:
    """Compile an embedding-lookup graph whose table holds `megabytes` of weights."""
    rows = int(megabytes * 2**20) // (4 * ROW)
    weights = np.random.default_rng(0).standard_normal((rows, ROW)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        idx = ib.param("idx", (3,), "int64")
        table = g.Constant(weights, "table")
        ib.ret(ib.emit(ops.call("gather", table, idx, axis=0), "rows"))
    ex = kiln.compile(ib.get(), "c")
    so = Path(ex.export_library(str(folder / "weights.so")) or folder / "weights.so")
    npy = folder / "weights.npy"
    np.save(npy, weights)
    return so, npy, weights


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=45.0, help="weight size in MiB")
    parser.add_argument("--repeat", type=int, default=7, help="timed repetitions")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        t0 = time.perf_counter()
        so, npy, weights = build(Path(tmp), opts.mb)
        build_s = time.perf_counter() - t0
        idx = np.array([0, len(weights) // 2, len(weights) - 1], dtype=np.int64)
        expected = weights[idx]
        # Warm the page cache for both files so both sides read from memory.
        so.read_bytes()
        npy.read_bytes()
        # Warm the code paths (imports, pyelftools) once, untimed.
        with load_module(so) as lib:
            lib["main"](idx)
        np.load(npy)

        load_ms, call_ms, npload_ms, rss_lib, rss_np = [], [], [], [], []
        for _ in range(opts.repeat):
            gc.collect()
            before = rss_kib()
            t0 = time.perf_counter()
            lib = load_module(so)
            t1 = time.perf_counter()
            rss_lib.append(rss_kib() - before)
            y = lib["main"](idx)
            t2 = time.perf_counter()
            assert np.array_equal(y, expected), (y, expected)
            load_ms.append((t1 - t0) * 1e3)
            call_ms.append((t2 - t1) * 1e3)
            lib.close()
            del lib

            gc.collect()
            before = rss_kib()
            t0 = time.perf_counter()
            arr = np.load(npy)
            t1 = time.perf_counter()
            rss_np.append(rss_kib() - before)
            npload_ms.append((t1 - t0) * 1e3)
            del arr

    med = statistics.median
    load_first = [a + b for a, b in zip(load_ms, call_ms)]
    size_mib = weights.nbytes / 2**20
    print(f"weights: {size_mib:.1f} MiB  (library built in {build_s:.2f} s, "
          f"median of {opts.repeat} runs)")
    print(f"{'':32} {'time (ms)':>10} {'RSS growth (MiB)':>18}")
    print(f"{'kiln load_module':32} {med(load_ms):10.2f} {med(rss_lib) / 1024:18.2f}")
    print(f"{'kiln first call':32} {med(call_ms):10.3f} {'':>18}")
    print(f"{'kiln load_module + first call':32} {med(load_first):10.2f} {'':>18}")
    print(f"{'np.load (.npy)':32} {med(npload_ms):10.2f} {med(rss_np) / 1024:18.2f}")
    print(f"kiln load + first call is {med(npload_ms) / med(load_first):.1f}x faster than "
          f"np.load; RSS grows by {100 * med(rss_lib) / 1024 / size_mib:.1f}% of the weights "
          f"(np.load: {100 * med(rss_np) / 1024 / size_mib:.0f}%)")
    goal = "met" if med(load_first) < 10 and med(rss_lib) / 1024 < size_mib / 10 else "NOT met"
    print(f"goal (load+call < 10 ms, RSS growth < 10% of weights): {goal}")


if __name__ == "__main__":
    main()
