"""Compile time of the CUDA target next to the host-only build (print-only, no GPU needed).

    .venv/bin/python bench/cuda_compile.py [--arch sm_90]

For bench/nets.py's `cnn` and `encoder`, compiles for `llvm` and for
`{"kind": "cuda", "arch": ..., "host": {"kind": "llvm"}}` with the compile cache off
(split builds never use it), best of three, and prints the seconds, the kernels'
launch shapes (how many run as one thread) and the sizes of kernels.cu and
kernels.ptx. Asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

os.environ["KILN_CACHE"] = "0"

import nets

import kiln


def best_of(n: int, fn: Callable[[], object]) -> tuple[float, object]:
    """Seconds of the fastest of `n` calls, and the last call's result."""
    best, result = float("inf"), None
    for _ in range(n):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    cuda = {"kind": "cuda", "arch": args.arch, "host": {"kind": "llvm"}}
    print(f"{'model':8} {'llvm s':>7} {'cuda s':>7} {'kernels':>7} {'1-thread':>8} "
          f"{'.cu KB':>7} {'.ptx KB':>8}")
    for name in ("cnn", "encoder"):
        model, _ = {**nets.SMALL, **nets.FULL}[name]()
        host_s, _ = best_of(3, lambda m=model: kiln.compile(m, "llvm"))
        cuda_s, ex = best_of(3, lambda m=model: kiln.compile(m, cuda))
        assert isinstance(ex, kiln.Executable)
        size = {a.file_name.split("_", 1)[1]: a.size for a in ex.artifacts if a.target_key}
        table = json.loads(next(bytes(a.content) for a in ex.artifacts
                                if a.file_name.endswith("kernels.json")))
        serial = sum(k["grid"][0] * k["block"][0] == 1 for k in table["kernels"])
        print(f"{name:8} {host_s:7.2f} {cuda_s:7.2f} {len(table['kernels']):7} {serial:8} "
              f"{size['kernels.cu'] / 1024:7.1f} {size['kernels.ptx'] / 1024:8.1f}")


if __name__ == "__main__":
    main()
