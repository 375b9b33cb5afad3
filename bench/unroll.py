"""The K-unroll knob (docs/tuning.md, "K unroll") against the rule's kernel, per layer:

    .venv/bin/python bench/unroll.py [--threads 2] [--calls 200] [--rounds 10] [--cpu-time]

Compiles each layer once by rule and once per legal unroll (`{"unroll": U}` forced through
kiln.tuning.apply.Forced), checks every output is bit-identical to the rule's, then times
all of them in alternating blocks of calls (harness.alternating_blocks_ms: medians, the
libraries' idle workers asleep between blocks) and prints each unroll's time and its
ratio to the rule's (above 1: faster). Layers: a 256x256x256 product (constant B, the
`gemm` family), ResNet-18's three strided 1x1 projections (`conv_gemm` or the blocked
`conv_direct`, as the rule picks) and two of its 3x3 layers (`conv_direct`).
`--cpu-time` (one thread) times the calls by the calling thread's CPU time, which time
descheduled by other jobs does not count. Prints numbers; asserts nothing (this is not
a test).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import onnx
from harness import alternating_blocks_ms
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.distributed.tune import discover
from kiln.tuning.apply import Forced, using


def _model(name: str, node: onnx.NodeProto, x: list[int], y: list[int],
           weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        [numpy_helper.from_array(w, k) for k, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def layers() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    out = {"gemm 256x256x256": _model(
        "gemm", helper.make_node("MatMul", ["x", "w"], ["y"]), [256, 256], [256, 256],
        {"w": rng.standard_normal((256, 256)).astype(np.float32)})}
    for cin, hw in ((64, 56), (128, 28), (256, 14)):  # ResNet-18's projections
        cout = 2 * cin
        out[f"1x1/2 {cin}->{cout} @{hw}"] = _model(
            "proj", helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1],
                                     strides=[2, 2]),
            [1, cin, hw, hw], [1, cout, hw // 2, hw // 2],
            {"w": (rng.standard_normal((cout, cin, 1, 1)) * 0.1).astype(np.float32)})
    for c, hw in ((128, 28), (256, 14)):  # ResNet-18's 3x3 layers (the blocked kernel)
        out[f"3x3 {c}->{c} @{hw}"] = _model(
            "conv3", helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]),
            [1, c, hw, hw], [1, c, hw, hw],
            {"w": (rng.standard_normal((c, c, 3, 3)) * 0.05).astype(np.float32)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread, timed by its CPU time (time.thread_time)")
    args = ap.parse_args()
    if args.cpu_time:
        args.threads = 1
    target = kiln.Target.from_host()
    print(f"target {target.export().get('mcpu')}, {args.threads} thread(s), "
          f"{'CPU time' if args.cpu_time else 'wall time'}")
    for name, model in layers().items():
        (spec,) = discover(model, target)
        unrolls = [c["unroll"] for c in spec.candidates if "unroll" in c]
        libs = {"rule": kiln.compile(model, target).jit()}
        for u in unrolls:
            with using(Forced(spec.family, {**spec.default, "unroll": u})):
                libs[f"unroll {u}"] = kiln.compile(model, target).jit()
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        fns = {}
        for key, lib in libs.items():
            lib.set_num_threads(args.threads)
            fns[key] = functools.partial(lib["main"], x)
        want = np.asarray(fns["rule"]())
        same = all(np.array_equal(np.asarray(f()), want) for f in fns.values())
        ms = alternating_blocks_ms(fns, args.calls, args.rounds,
                                   time.thread_time if args.cpu_time else time.perf_counter)
        cells = ", ".join(f"{k} {v:.3f} ms ({ms['rule'] / v:.3f}x)" for k, v in ms.items()
                          if k != "rule")
        print(f"{name} [{spec.family}, tile {spec.default['tile']}]: rule "
              f"{ms['rule']:.3f} ms; {cells}; bit-identical: {same}")


if __name__ == "__main__":
    main()
