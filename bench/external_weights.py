"""Two libraries of one model loaded together: memory with embedded vs external weights.

    .venv/bin/python bench/external_weights.py [--mb 64]

Compiles (once, untimed) `main(x) = x @ W` with W of `--mb` MiB for `llvm` and
for `c`, exports each embedded and with weights="external", then in a fresh
process per case loads both libraries, calls each once and reads the process's
proportional set size (Pss of /proc/self/smaps_rollup; a page mapped twice in
one process counts once) and its RSS, minus what the process held before
loading. Also times load_module of an external library (median of 7 loads in
that process, the mapping cached after the first). Prints a table; asserts
nothing (this is not a test). Linux only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import kiln
from kiln.ir import IRBuilder
from kiln.ir import graph as g

CHILD = r"""
import sys, time, statistics, numpy as np
from kiln.runtime import load_module

def mem():
    rows = dict(l.split(":", 1) for l in open("/proc/self/smaps_rollup").read().splitlines()[1:])
    return int(rows["Pss"].split()[0]) / 1024, int(rows["Rss"].split()[0]) / 1024

x = np.ones((1, int(sys.argv[3])), np.float32)
pss0, rss0 = mem()
t = time.perf_counter()
mods = [load_module(p) for p in sys.argv[1:3]]
load_ms = (time.perf_counter() - t) * 1e3 / 2
outs = [m["main"](x) for m in mods]
assert np.array_equal(outs[0], outs[1])
pss, rss = mem()
times = []
for _ in range(7):
    t = time.perf_counter(); m = load_module(sys.argv[1]); times.append(time.perf_counter() - t)
    m.close()
print(f"{pss - pss0:.1f} {rss - rss0:.1f} {load_ms:.2f} {statistics.median(times) * 1e3:.2f}")
"""


def build(mb: float, folder: Path) -> tuple[dict[str, Path], int]:
    k = 1024
    n = int(mb * 2**20) // (4 * k)
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, k), "float32")
        ib.ret(ib.emit(kiln.ops.call("matmul", x, g.Constant(w, "w")), "y"))
    mod = ib.get()
    out = {}
    for target in ("llvm", "c"):
        ex = kiln.compile(mod, target=target)
        out[f"{target}-embedded"] = ex.export_library(folder / f"{target}_emb.so")
        out[f"{target}-external"] = ex.export_library(folder / f"{target}_ext.so",
                                                      weights="external")
    return out, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libs, k = build(args.mb, Path(tmp))
        print(f"weights: {args.mb:.0f} MiB per library; llvm + c loaded together, one call each")
        print("| weights | PSS growth (MiB) | RSS growth (MiB) | load (ms, first) "
              "| load (ms, again) |")
        print("|---|---|---|---|---|")
        for mode in ("embedded", "external"):
            proc = subprocess.run([sys.executable, "-c", CHILD, str(libs[f"llvm-{mode}"]),
                                   str(libs[f"c-{mode}"]), str(k)],
                                  capture_output=True, text=True, check=True)
            pss, rss, first, again = proc.stdout.split()
            print(f"| {mode} | {pss} | {rss} | {first} | {again} |")


if __name__ == "__main__":
    main()
