"""Load-time benchmark: a library holding ~45 MB of weights vs np.load of the same bytes.

    .venv/bin/python bench/load.py [--mb 45] [--repeat 7]

Builds (once, untimed) a hand-made kiln library whose weights are a 45 MB
`constants.bin` artifact and whose one function `peek` reads three of them,
plus a `.npy` of the same weights. Then, in this one process, it times
`load_module` + the first call against `np.load`, and reports the resident
memory growth (VmRSS) right after loading, before anything touches the
weights. Goal: load in under 10 ms, and RSS growth far below the weight size,
because the weights are mapped from the file, not copied. Prints a table;
asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from kiln.artifact import Artifact, ArtifactSet
from kiln.export import export_library
from kiln.runtime import load_module

PREFIX = "bench_"

KERNEL = r"""
#include <stdint.h>
extern const float bench__consts[];
__attribute__((visibility("hidden"))) int32_t bench__kernel_peek(float *y, int64_t n) {
  y[0] = bench__consts[0];
  y[1] = bench__consts[n / 2];
  y[2] = bench__consts[n - 1];
  return 0;
}
"""

HOST = r"""
#include <stdio.h>
#include <kiln/kiln.h>
#define EXPORT __attribute__((visibility("default")))
static __thread char err[256];
int32_t bench__kernel_peek(float *y, int64_t n);
EXPORT const char *bench__last_error(void) { return err; }
EXPORT const char *bench__metadata(void) { return "%(meta)s"; }
EXPORT int32_t bench_peek(const KilnValue *args, const int32_t *codes, int32_t n) {
  if (n != 1) { snprintf(err, sizeof err, "peek: expected 1 argument, got %%d", n); return -1; }
  if (codes[0] != KILN_ARG_DLTENSOR || !args[0].v_handle) {
    snprintf(err, sizeof err, "peek: argument 0 'y': expected a tensor (type code 7), "
             "got type code %%d", codes[0]);
    return -1;
  }
  const DLTensor *t = (const DLTensor *)args[0].v_handle;
  if (t->device.device_type != kDLCPU || t->ndim != 1 || t->shape[0] != 3 ||
      t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
    snprintf(err, sizeof err, "peek: argument 0 'y': expected float32[3]");
    return -1;
  }
  return bench__kernel_peek((float *)((char *)t->data + t->byte_offset), %(count)dLL);
}
"""


def metadata() -> dict[str, object]:
    sig = {"name": "peek", "symbol": f"{PREFIX}peek", "kind": "graph", "params": [],
           "results": [{"name": "y", "kind": "tensor", "shape": [3], "dtype": "float32"}],
           "tuple_result": False}
    return {"format": "kiln.library", "version": 1, "kiln_version": "0.1.0", "prefix": PREFIX,
            "functions": {"peek": sig}}


def build(folder: Path, megabytes: float) -> tuple[Path, Path, np.ndarray]:
    count = int(megabytes * 2**20) // 4
    weights = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    meta = metadata()
    meta_c = json.dumps(meta, separators=(",", ":")).replace("\\", "\\\\").replace('"', '\\"')
    arts = ArtifactSet([
        Artifact("bench", "native", "kernels.c", KERNEL.encode()),
        Artifact("host", "native", "host.c",
                 (HOST % {"meta": meta_c, "count": count}).encode()),
        Artifact("bench", "native", "constants.bin", weights.tobytes(),
                 {"symbol": f"{PREFIX}_consts", "align": 64}),
    ])
    so = export_library(arts, meta, folder / "weights.so", prefix=PREFIX)
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
        expected = weights[[0, weights.size // 2, weights.size - 1]]
        # Warm the page cache for both files so both sides read from memory.
        so.read_bytes()
        npy.read_bytes()
        # Warm the code paths (imports, pyelftools) once, untimed.
        with load_module(so) as lib:
            lib["peek"]()
        np.load(npy)

        load_ms, call_ms, npload_ms, rss_lib, rss_np = [], [], [], [], []
        for _ in range(opts.repeat):
            gc.collect()
            before = rss_kib()
            t0 = time.perf_counter()
            lib = load_module(so)
            t1 = time.perf_counter()
            rss_lib.append(rss_kib() - before)
            y = lib["peek"]()
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
