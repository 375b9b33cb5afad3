"""Per-node time, kiln against onnxruntime, grouped by op kind and shape.

    .venv/bin/python bench/compare_nodes.py --models mobilenetv2,shufflenet
                                            [--threads 1,2] [--calls 30] [--top 15]
                                            [--target "llvm -mcpu=znver3 -int8-pairs=saturate"]
                                            [--stat min|median]

For each model of bench/models.py (the same builders and inputs), kiln compiles it
with `profile=True` and `kiln.cli.profiling.record` reads every kernel call's time;
onnxruntime runs the same calls with `SessionOptions.enable_profiling` and its JSON
trace gives every node's time (the `*_kernel_time` events). Each node counts its
shortest time over the calls (what a shared machine's load disturbs least), or with
`--stat median` its median (a node whose time varies from call to call, e.g. one whose
input comes from L3 in some calls and from L2 in others, then counts what it costs in
a typical call: the shortest times of a model's nodes may add up to well below its whole
call). Both sides
are keyed by op kind (conv, depthwise conv, pool, ...; onnxruntime's fused
`FusedConv`/NCHWc convs count as conv) and the input and output activation shape
(C x H x W; kiln's blocked NCHWc tensors unblocked, onnxruntime's channel-padded ones
matched to kiln's), then summed per key. Printed per model and thread count: both
whole-call times (medians), one table by op kind and the keys with the largest
kiln - onnxruntime gap (a key on one side only is what the other fused away or split:
onnxruntime's `QuickGelu` is kiln's Swish epilogue, its `ReorderInput`/`ReorderOutput`
("layout") the NCHWc conversions). The kiln side runs with its timers on (a few
percent slower than a plain build; bench/profile_timers.py).
Prints tables; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import harness
import numpy as np

import kiln
from kiln.cli.kernel_names import kernel_ops
from kiln.cli.profiling import record
from kiln.frontend import from_onnx
from models import QOP, build, quantize

Key = tuple[str, str, str]  # (op kind, input C x H x W, output C x H x W)
GRAPH_PIPELINE = ["default"]  # kiln's graph pipeline, set by --graph-pipeline

# onnxruntime op types -> the kind kiln's op of the same computation is counted under
ORT_KINDS = {"fusedconv": "conv", "conv": "conv", "gemm": "matmul", "fusedgemm": "matmul",
             "matmul": "matmul", "fusedmatmul": "matmul", "globalaveragepool": "global_avg_pool",
             "maxpool": "max_pool2d", "averagepool": "avg_pool2d", "relu": "relu",
             "clip": "clip", "add": "add", "mul": "mul", "sigmoid": "sigmoid",
             "concat": "concat", "transpose": "transpose", "reshape": "reshape",
             "batchnormalization": "batch_norm", "softmax": "softmax", "flatten": "reshape",
             "reorderinput": "layout", "reorderoutput": "layout",
             # int8 (--int8): onnxruntime's QDQ fusions and kiln's quantized ops
             "qlinearconv": "conv", "qlinearadd": "add", "qlinearmatmul": "matmul",
             "qlinearglobalaveragepool": "global_avg_pool", "quantizelinear": "quantize",
             "dequantizelinear": "dequantize", "qlinearconcat": "concat",
             "qlinearsoftmax": "softmax", "qlinearmul": "mul", "nhwcmaxpool": "max_pool2d"}
#: kiln's quantized ops -> the kind onnxruntime's node of the same computation counts as
KILN_INT8_KINDS = {"qlinear_conv_grouped": "dwconv", "qlinear_conv_packed": "conv",
                   "qlinear_conv_dot": "conv", "qlinear_conv": "conv", "qlinear_add": "add",
                   "quantize_linear": "quantize", "dequantize_linear": "dequantize",
                   "qlinear_concat": "concat", "qlinear_softmax": "softmax",
                   "qlinear_global_average_pool": "global_avg_pool", "qlinear_mul": "mul"}


def chw(shape: list[int]) -> str:
    """'CxHxW' of an activation: NCHW as is, NCHWc [N, C/c, H, W, c] unblocked,
    anything else its dims after the batch."""
    if len(shape) == 5:
        shape = [shape[0], shape[1] * shape[4], shape[2], shape[3]]
    return "x".join(str(d) for d in shape[1:]) or "scalar"


def kiln_kind(kernel: str) -> str:
    """The op kind of a kiln kernel: its anchor op, depthwise convolutions apart."""
    first = kernel_ops(kernel)[0]
    if first in KILN_INT8_KINDS:
        return KILN_INT8_KINDS[first]
    if first.startswith("conv2d"):
        return "dwconv" if "depthwise" in kernel else "conv"
    return first


Stat = Callable[[list[float]], float]  # a node's times over the calls -> the one it counts
STATS: dict[str, Stat] = {"min": min, "median": lambda ts: float(np.median(ts))}


def kiln_times(model: Any, feed: dict[str, np.ndarray], threads: int, calls: int,
               target: kiln.target.Target, stat: Stat = min
               ) -> tuple[float, dict[Key, float]]:
    """(median whole call ms, ms per call of each key: `stat` of each node's times) of
    kiln's profiled build."""
    lib = kiln.compile(from_onnx(model), target, profile=True,
                       graph_pipeline=GRAPH_PIPELINE[0]).jit()
    kiln.runtime.set_num_threads(threads)
    args = list(feed.values())
    for _ in range(3):
        lib["main"](*args)
    rec = record(lib, "main", lambda: lib["main"](*args), calls)
    graph = lib.metadata["graphs"]["main"]
    tensors, kernels = graph["tensors"], graph["kernels"]
    per_key: dict[Key, float] = defaultdict(float)
    for site in rec.sites:
        call = kernels[site.index] if site.index < len(kernels) else {}
        ins = [tensors[t]["shape"] for t in call.get("inputs", [])
               if tensors[t]["kind"] != "weight"]
        outs = [tensors[t]["shape"] for t in call.get("outputs", [])]
        key = (kiln_kind(site.kernel), chw(ins[0]) if ins else "?",
               chw(outs[0]) if outs else "?")
        per_key[key] += stat([ns / 1e6 for ns in site.ns])
    return float(np.median(rec.whole_ns)) / 1e6, dict(per_key)


def ort_kind(op: str, inputs: list[list[int]], outputs: list[list[int]]) -> str:
    kind = ORT_KINDS.get(op.lower(), op.lower())
    if op.lower() == "qlinearconv" and inputs and outputs and len(inputs[0]) == 4:
        # its prepacked weight has no shape in the trace: a convolution keeping its
        # channels is taken for depthwise (no 1x1 of the benchmark models keeps them)
        return "dwconv" if inputs[0][1] == outputs[0][1] else "conv"
    if kind == "conv" and len(inputs) > 1 and len(inputs[1]) == 4:
        weight, x = inputs[1], inputs[0]
        channels = x[1] if len(x) == 4 else x[1] * x[4]
        if weight[1] == 1 and weight[0] >= channels > 1:
            return "dwconv"
    return kind


def nhwc(ins: list[list[int]], outs: list[list[int]]) -> bool:
    """Whether an int8 node of onnxruntime's trace runs channel-last (its NHWC
    transformer's QLinearConv/QLinearAdd/...): its 4-D activation's last dim is the
    channel count of its per-channel scale (QLinearConv), else square H x W before it."""
    x = next((s for s in ins if len(s) == 4), None)
    if x is None:
        return False
    scales = [s for s in ins[1:] if len(s) == 1]
    if scales and outs and len(outs[0]) == 4:
        return outs[0][3] == scales[0][0]
    return x[1] == x[2] != x[3]


def _shapes(arg: list[dict[str, list[int]]]) -> list[list[int]]:
    return [next(iter(t.values())) for t in arg]


def ort_times(model: Any, feed: dict[str, np.ndarray], threads: int, calls: int,
              stat: Stat = min) -> tuple[float, dict[Key, float]]:
    """(median whole call ms, ms per call of each key: `stat` of each node's times) from
    onnxruntime's profiling trace."""
    events = harness.ort_profile_events(model, feed, threads, 3 + calls)
    runs = [e for e in events if e.get("name") == "model_run"][3:]
    nodes = [e for e in events if e.get("cat") == "Node"
             and e.get("name", "").endswith("_kernel_time")]
    first = runs[0]["ts"] if runs else 0
    times: dict[str, tuple[Key, list[float]]] = {}  # node -> (key, its runs' ms)
    for e in nodes:
        if e["ts"] < first:
            continue  # a warm-up call
        args = e.get("args", {})
        ins = _shapes(args.get("input_type_shape", []))
        outs = _shapes(args.get("output_type_shape", []))
        op = args.get("op_name", "?")
        if op.startswith("QLinear") and nhwc(ins, outs):
            ins, outs = ([[s[0], s[3], s[1], s[2]] if len(s) == 4 else s for s in ts]
                         for ts in (ins, outs))
        key = (ort_kind(op, ins, outs), chw(ins[0]) if ins else "?",
               chw(outs[0]) if outs else "?")
        times.setdefault(e["name"], (key, []))[1].append(e["dur"] / 1e3)
    per_key: dict[Key, float] = defaultdict(float)
    for key, ms in times.values():
        per_key[key] += stat(ms)
    whole = float(np.median([e["dur"] for e in runs])) / 1e3 if runs else math.nan
    return whole, dict(per_key)


def unpad(a: dict[Key, float], b: dict[Key, float]) -> dict[Key, float]:
    """`b` with each key onnxruntime's NCHWc padded (channels rounded up) moved to the
    key of `a` that differs only in such channels, so both sides meet."""
    def loose(key: Key) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        return key[0], tuple(key[1].split("x")[1:]), tuple(key[2].split("x")[1:])

    def near(x: str, y: str) -> bool:
        cx, cy = int(x.split("x")[0] or 0), int(y.split("x")[0] or 0)
        return cx <= cy < cx + 16

    out: dict[Key, float] = defaultdict(float)
    for key, ms in b.items():
        if key[0] == "dwconv" and key not in a and ("conv", *key[1:]) in a:
            # onnxruntime's int8 trace has no weight shape: a 3x3 convolution keeping
            # its channels was taken for depthwise (`ort_kind`); kiln's key decides
            key = ("conv", key[1], key[2])
        match = key if key in a else next(
            (k for k in a if loose(k) == loose(key) and near(k[1], key[1])
             and near(k[2], key[2])), key)
        out[match] += ms
    return dict(out)


def report(name: str, threads: int, kiln_ms: float, ort_ms: float,
           k: dict[Key, float], o: dict[Key, float], top: int) -> None:
    print(f"\n{name}, {threads} thread(s): kiln {kiln_ms:.3f} ms (timers on), "
          f"onnxruntime {ort_ms:.3f} ms per call; kernel sums {sum(k.values()):.3f} / "
          f"{sum(o.values()):.3f}")
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for key, ms in k.items():
        kinds[key[0]][0] += ms
        kinds[key[0]][2] += 1
    for key, ms in o.items():
        kinds[key[0]][1] += ms
        kinds[key[0]][3] += 1
    print(f"  {'op kind':<18} {'kiln ms':>9} {'ort ms':>9} {'gap ms':>9} {'keys k/o':>9}")
    for kind, (km, om, kn, on) in sorted(kinds.items(), key=lambda r: -(r[1][0] - r[1][1])):
        print(f"  {kind:<18} {km:9.3f} {om:9.3f} {km - om:9.3f} {kn:>4}/{on:<4}")
    keys = sorted(set(k) | set(o), key=lambda x: -(k.get(x, 0) - o.get(x, 0)))
    print(f"  {'largest gaps: kind':<18} {'input CxHxW':>16} {'output CxHxW':>16} "
          f"{'kiln ms':>9} {'ort ms':>9} {'gap ms':>9}")
    for key in keys[:top]:
        print(f"  {key[0]:<18} {key[1]:>16} {key[2]:>16} {k.get(key, 0):9.3f} "
              f"{o.get(key, 0):9.3f} {k.get(key, 0) - o.get(key, 0):9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2,efficientnet,shufflenet")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--stat", choices=sorted(STATS), default="min",
                        help="what a node counts of its times over the calls: its "
                             "shortest (default) or its median")
    parser.add_argument("--int8", action="store_true",
                        help="each model quantized as bench/models.py --int8 does (QDQ; "
                             "QOperator for a name ending in _qop, e.g. resnet50_qop)")
    parser.add_argument("--graph-pipeline", default="default",
                        help="kiln's graph pipeline, e.g. 'nchwc' (blocked activation layout)")
    parser.add_argument("--mattr", default=None,
                        help="the target's LLVM features as changes to its CPU's, e.g. "
                             "'-avx512f' (the AVX2 path on an AVX-512 host)")
    parser.add_argument("--target", default=None,
                        help="kiln target (default: this host), e.g. "
                             "'llvm -mcpu=znver3 -int8-pairs=saturate'")
    parser.add_argument("--ort-isa", choices=("target", "host"), default="target",
                        help="target (default): onnxruntime without the CPU features the "
                             "host has and the target lacks (bench/ort_isa.py); host: all")
    args = parser.parse_args()
    GRAPH_PIPELINE[0] = args.graph_pipeline
    target = kiln.Target.from_host() if args.target is None else kiln.Target(args.target)
    if args.mattr is not None:
        target = target.with_attrs(mattr=tuple(f for f in args.mattr.split(",") if f))
    print(f"host: {harness.describe_target(target)}; {args.calls} calls each")
    print(harness.ort_on_target_isa(target, args.ort_isa))
    for name in args.models.split(","):
        model, feed = build(name.removesuffix(QOP) if args.int8 else name)
        if args.int8:
            model = quantize(model, {k: list(v.shape) for k, v in feed.items()},
                             "QOperator" if name.endswith(QOP) else "QDQ")
        for threads in [int(t) for t in args.threads.split(",")]:
            kiln_ms, k = kiln_times(model, feed, threads, args.calls, target,
                                    STATS[args.stat])
            ort_ms, o = ort_times(model, feed, threads, args.calls, STATS[args.stat])
            report(name, threads, kiln_ms, ort_ms, k, unpad(k, o), args.top)


if __name__ == "__main__":
    main()
