"""Profiling timers: what they cost, and how well the kernel times add up.

    .venv/bin/python bench/profile_timers.py [--calls 2000] [--targets llvm,c]

For each model shipped in models/ and each target, the model is compiled twice
(`profile=False` and `profile=True`) and both libraries are called in
alternating blocks (bench/harness.py); printed per row: the median latency of
each, the overhead of the timers, and, from the profiled library's own counters
over the same calls, the sum of the per-kernel times against its whole-call
time (what `kiln run --profile` prints as "kernels total" and "whole call").
Prints a table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import harness
import numpy as np

import kiln

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mlp.onnx", "tiny_cnn.onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--targets", default="llvm,c")
    args = parser.parse_args()
    host = kiln.Target.from_host()
    print(f"host: {harness.describe_target(host)}; medians of {args.calls} calls")
    print(f"{'model':<14} {'target':<6} {'off ms':>9} {'on ms':>9} {'overhead':>9} "
          f"{'kernels/whole':>14}")
    for name in MODELS:
        for target in args.targets.split(","):
            plain = kiln.compile(str(ROOT / "models" / name), target).jit()
            timed = kiln.compile(str(ROOT / "models" / name), target, profile=True).jit()
            sig = plain.metadata["functions"]["main"]["params"]
            rng = np.random.default_rng(0)
            inputs = [rng.standard_normal(p["shape"]).astype(p["dtype"]) for p in sig]
            timed.profile_reset()
            ms = harness.alternating_blocks_ms(
                {"off": partial(plain["main"], *inputs), "on": partial(timed["main"], *inputs)},
                args.calls)
            rows = timed.profile()
            whole = sum(r.total_ns for r in rows if r.kernel is None)
            kernels = sum(r.total_ns for r in rows if r.kernel is not None)
            print(f"{name:<14} {target:<6} {ms['off']:9.4f} {ms['on']:9.4f} "
                  f"{100 * (ms['on'] / ms['off'] - 1):8.1f}% {kernels / whole:14.3f}")


if __name__ == "__main__":
    main()
