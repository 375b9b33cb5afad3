"""Per-op time of one model: kiln's kernel timers beside onnxruntime's node profile.

    .venv/bin/python bench/op_profile.py --model gpt2 [--calls 10] [--threads 2] [--kernels N]

The model comes from bench/models.py's builders (any name of `--models all`). kiln
compiles it with `profile=True` (docs/profiling.md) and onnxruntime runs it with
`SessionOptions.enable_profiling`; both take the same inputs for `--calls` calls
after warm-up. Rows are op kinds: a kiln kernel counts under its anchor op (the
first op of a fused kernel's name, kiln.cli.kernel_names.op_type), an onnxruntime
node under its op type (its fused nodes, e.g. FusedMatMul, under theirs).
Prints mean milliseconds per call of each; `--kernels N` adds kiln's N longest
kernels. Asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import onnx
from harness import describe_target, ort_profile_events

import kiln
import models
from kiln.cli.kernel_names import op_type
from kiln.frontend import from_onnx


def kiln_ops(model: onnx.ModelProto, args: list[np.ndarray],
             calls: int) -> tuple[dict[str, float], dict[str, float], float]:
    """kiln's mean ms per call by op kind and by kernel, and its whole call."""
    lib = kiln.compile(from_onnx(model), kiln.Target.from_host(), profile=True).jit()
    for _ in range(2):
        lib["main"](*args)
    lib.profile_reset()
    for _ in range(calls):
        lib["main"](*args)
    by_op: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, float] = defaultdict(float)
    whole = 0.0
    for row in lib.profile():
        ms = row.total_ns / 1e6 / calls
        if row.kernel is None:
            whole += ms
        else:
            by_op[op_type(row.kernel)] += ms
            by_kernel[row.kernel] += ms
    return by_op, by_kernel, whole


def ort_ops(model: onnx.ModelProto, feeds: dict[str, np.ndarray], calls: int,
            threads: int) -> tuple[dict[str, float], float]:
    """onnxruntime's mean ms per call by op type (its profile's node kernel times),
    and its whole call (the profile's model_run), warm-up calls left out."""
    events = ort_profile_events(model, feeds, threads, 2 + calls)
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    after = runs[2]["ts"] if len(runs) > 2 else 0  # the first timed call's start
    by_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= after:
            by_op[e["args"]["op_name"]] += e["dur"] / 1e3 / calls
    return by_op, sum(e["dur"] for e in runs[2:]) / 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", type=int, default=0)
    args = parser.parse_args()
    model, feeds = models.build(args.model)
    kiln.runtime.set_num_threads(args.threads)
    k_ops, k_kernels, k_whole = kiln_ops(model, list(feeds.values()), args.calls)
    o_ops, o_whole = ort_ops(model, feeds, args.calls, args.threads)
    print(f"{args.model}: ms per call, {args.threads} threads, "
          f"{describe_target(kiln.Target.from_host())}")
    print(f"{'op':<28} {'kiln':>9} {'ort':>9}")
    names = sorted(set(k_ops) | set(o_ops), key=lambda n: -max(k_ops.get(n, 0), o_ops.get(n, 0)))
    for name in names:
        print(f"{name:<28} {k_ops.get(name, 0):9.3f} {o_ops.get(name, 0):9.3f}")
    print(f"{'(whole call)':<28} {k_whole:9.3f} {o_whole:9.3f}")
    if args.kernels:
        for name, ms in sorted(k_kernels.items(), key=lambda kv: -kv[1])[:args.kernels]:
            print(f"  {name:<60} {ms:9.3f}")


if __name__ == "__main__":
    main()
