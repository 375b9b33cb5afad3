"""First call after load against a warm call, with the weights' check on (issue 60).

    .venv/bin/python bench/first_call.py [--width 8192] [--layers 4] [--rows 16]
                                         [--codegen llvm] [--repeat 5]
                                         [--weights embedded|external]

Compiles (once, timed and printed) `main(x) = x @ W1 @ ... @ Wn`, n float32 weights of
`width x width` (the default: 4 x 256 MiB = 1 GiB), exports one `.so`, and then, each
in a fresh process (so each load maps the library anew; the file is in the page
cache), loads it and times:

- `lazy` (the default verify_weights): the first call right after load, which waits
  for the chunks the background check has not hashed yet and hashes them itself
  (through the library's kiln.lane64 table, kiln_check.c);
- `lazy+idle`: the first call once the background check is done (a host that loads
  at start and serves later);
- `lazy sha256`, `lazy+idle sha256`: the same with $KILN_WEIGHTS_HASH=sha256 (the
  blob's SHA-256s, the check of libraries exported before the table);
- `off`: verify_weights=False, the first call (page faults only);
- the warm call: the median of `--repeat` calls after the first.

Prints the CPU, then per mode the medians of load ms, first call ms and warm ms, their
first/warm, the median of each process's own first/warm (steadier on a busy host), and
the median of each process's CPU-time first/warm (the process's CPU seconds during the
call, the check's threads included: what a shared host's other jobs do not inflate).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from doc_table import cpu_name

import kiln
from kiln import ops
from kiln.ir import IRBuilder
from kiln.ir import graph as g

CHILD = r"""
import json, statistics, sys, time
import numpy as np
from doc_table import cpu_name
from kiln.runtime import load_module
path, mode, rows, width, repeat = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
x = np.random.default_rng(1).standard_normal((rows, width)).astype(np.float32)
t0 = time.perf_counter()
lib = load_module(path, verify_weights=False if mode == "off" else "lazy")
t1 = time.perf_counter()
if mode.startswith("lazy+idle"):
    check = lib.get_function("main", query_imports=False).c_func.check
    check.join()
    t1 = time.perf_counter()
first_start, cpu_start = time.perf_counter(), time.process_time()
lib["main"](x)
first = time.perf_counter() - first_start
first_cpu = time.process_time() - cpu_start
warm, warm_cpu = [], []
for _ in range(repeat):
    s, c = time.perf_counter(), time.process_time()
    lib["main"](x)
    warm.append(time.perf_counter() - s)
    warm_cpu.append(time.process_time() - c)
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "first_ms": first * 1e3,
                  "warm_ms": statistics.median(warm) * 1e3,
                  "first_cpu_ms": first_cpu * 1e3,
                  "warm_cpu_ms": statistics.median(warm_cpu) * 1e3}))
"""


def build(folder: Path, width: int, layers: int, codegen: str, weights: str) -> Path:
    """Compile and export the MatMul chain; print the compile time."""
    rng = np.random.default_rng(0)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (ROWS, width), "float32")
        y = x
        for i in range(layers):
            w = rng.standard_normal((width, width), dtype=np.float32) * np.float32(width ** -0.5)
            y = ib.emit(ops.call("matmul", y, g.Constant(w, f"w{i}")), f"y{i}")
        ib.ret(y)
    t0 = time.perf_counter()
    ex = kiln.compile(ib.get(), codegen)
    so = Path(ex.export_library(str(folder / "chain.so"), weights=weights) or folder / "chain.so")
    print(f"compiled and exported {layers} x {width}x{width} float32 "
          f"({layers * width * width * 4 / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s")
    return so


ROWS = 16


def main() -> None:
    global ROWS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--codegen", default="llvm")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--weights", choices=("embedded", "external"), default="embedded",
                        help="export_library's weights= (external: a weights file beside)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per mode")
    opts = parser.parse_args()
    ROWS = opts.rows
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        so = build(Path(tmp), opts.width, opts.layers, opts.codegen, opts.weights)
        for file in Path(tmp).iterdir():  # the page cache holds the files, as on a host
            file.read_bytes()             # that loaded them before
        print(f"{'mode':18} {'load ms':>9} {'first ms':>9} {'warm ms':>9} {'first/warm':>11} "
              f"{'per process':>12} {'CPU first/warm':>15}")
        for mode in ("lazy", "lazy+idle", "lazy sha256", "lazy+idle sha256", "off"):
            runs = []
            env = {**os.environ, "KILN_WEIGHTS_HASH": mode.split()[-1]
                   if mode.endswith("sha256") else "lane64"}
            for _ in range(opts.rounds):
                out = subprocess.run([sys.executable, "-c", CHILD, str(so), mode, str(opts.rows),
                                      str(opts.width), str(opts.repeat)],
                                     capture_output=True, text=True, check=True, env=env)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            own = statistics.median(r["first_ms"] / r["warm_ms"] for r in runs)
            cpu = statistics.median(r["first_cpu_ms"] / r["warm_cpu_ms"] for r in runs)
            print(f"{mode:18} {med['load_ms']:9.1f} {med['first_ms']:9.1f} "
                  f"{med['warm_ms']:9.1f} {med['first_ms'] / med['warm_ms']:11.2f} {own:12.2f} "
                  f"{cpu:15.2f}")


if __name__ == "__main__":
    main()
