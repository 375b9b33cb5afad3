"""Call overhead benchmark: what a graph function call costs above its kernels.

    .venv/bin/python bench/call_overhead.py [--model models/mlp.onnx] [--calls 20000]

Compiles the model (default: the MLP of models/, batch 1) for `Target.from_host()`
and prints the median microseconds per call, over `--calls` calls in 5 blocks, of:

- `fn(x)`: the whole Python call, results allocated;
- `fn(x, out=o)`: the same writing into a preallocated result;
- `C entry`: the packed C entry alone, its arguments packed once beforehand
  (the kernels plus the entry's own checks);
- `pack_arguments`: packing the arguments alone (no call).

The difference between the first two rows and the third is the Python call
overhead. Prints a table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from harness import describe_target

import kiln
from kiln.frontend import from_onnx
from kiln.runtime import ctypes_abi

ROOT = Path(__file__).resolve().parent.parent


def median_us(fn: Callable[[], object], calls: int, blocks: int = 5) -> float:
    """Median over `blocks` blocks of the mean microseconds per call in each block."""
    per_block = max(1, calls // blocks)
    means = []
    for _ in range(blocks):
        fn()
        start = time.perf_counter()
        for _ in range(per_block):
            fn()
        means.append((time.perf_counter() - start) / per_block * 1e6)
    return statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "mlp.onnx"))
    parser.add_argument("--calls", type=int, default=20000)
    opts = parser.parse_args()

    target = kiln.target.Target.from_host()
    model = onnx.load(opts.model)
    fn = kiln.compile(from_onnx(model), target)["main"]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(tuple(p["shape"])).astype(np.dtype(p["dtype"]))
            for p in fn.params]
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    values = [*args, *outs]
    packed, codes, keep = ctypes_abi.pack_arguments(values, fn._wheres)
    n = len(values)

    def c_entry() -> object:
        return fn.c_func(packed, codes, n)

    rows = {
        "fn(x)": lambda: fn(*args),
        "fn(x, out=o)": lambda: fn(*args, out=out),
        "C entry": c_entry,
        "pack_arguments": lambda: ctypes_abi.pack_arguments(values, fn._wheres),
    }
    print(f"model {Path(opts.model).name}, target {describe_target(target)}, "
          f"{opts.calls} calls per row")
    for name, call in rows.items():
        print(f"  {name:<16} {median_us(call, opts.calls):8.2f} us/call")
    del keep


if __name__ == "__main__":
    main()
