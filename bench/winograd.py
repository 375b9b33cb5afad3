"""Winograd convolution benchmark: the direct kernel vs the Winograd family, F(4x4) and
F(2x2), on ResNet-50's stride-1 3x3 convolutions, and the whole model with every such
convolution on Winograd.

    .venv/bin/python bench/winograd.py [--threads 1|2] [--repeat 20] [--seconds 3]
                                       [--model resnet50.onnx] [--target llvm]

Each convolution is bench/kernels.py's one-node Conv model (bias, batch 1, NCHW,
float32), compiled three times: on the direct kernel (the target with its attribute
`winograd` false; the column `rule` names the family the rule takes on the target as
given) and with the call forced to `conv_winograd` at each output tile size
(kiln.tuning.apply: what a tuned build does), plus a one-node onnxruntime session.
Times are medians of alternating blocks of calls (bench/harness.py); `--threads 1`
times each by the calling thread's CPU time (robust on a loaded machine), 2 by wall
time. `err` is the largest difference from the direct kernel's output over its largest
magnitude (kiln.distributed.tune accepts a candidate within 1e-5 of it, plus 1e-4 of
each value). With `--model`, an ONNX model is compiled direct and with every
Winograd-eligible convolution forced (F(4x4), F(2x2) below 8x8 outputs, where F(4x4)'s
16-lane panels would hold 4 tiles), and the two are timed the same way. Prints a
table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import onnx
from harness import alternating_blocks_ms, calls_within, describe_target
from kernels import CPU_TIME, Conv, one_node_model

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target.isa import ISA
from kiln.tuning.apply import Session, using

#: ResNet-50's stride-1 3x3 convolutions (13 layers of 4 shapes).
SHAPES = (Conv(64, 64, 56), Conv(128, 128, 28), Conv(256, 256, 14), Conv(512, 512, 7))
#: Outputs smaller than this take F(2x2) in `--model` (F(4x4) would fill 16-lane panels
#: with 4 tiles at 7x7).
SMALL_OUTPUT = 8


class AllWinograd(Session):
    """Every call the Winograd kernel computes, on it with F(m x m) (`m` None: F(4x4),
    F(2x2) for outputs below `SMALL_OUTPUT`); `forced` counts them."""

    def __init__(self, m: int | None = None) -> None:
        self.m = m
        self.forced = 0

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        from kiln.kernels.conv.winograd import gemm_tile
        from kiln.kernels.search import computes
        from kiln.ops.conv_geometry import conv_call_shape

        shape = conv_call_shape(call)
        if shape is None or not computes("conv_winograd", call, isa):
            return None
        m = self.m or (2 if shape.out_h < SMALL_OUTPUT else 4)
        self.forced += 1
        return {"family": "conv_winograd", "tile": [m, *gemm_tile(shape, m, isa)]}


def conv_row(kernel: Conv, target: kiln.target.Target, args: argparse.Namespace) -> str:
    import onnxruntime as ort

    from kiln.distributed.tune import discover

    model, x, _ = one_node_model(kernel, np.random.default_rng(0))
    (spec,) = discover(model, target)
    fns: dict[str, Any] = {}
    # the direct kernel: the rule's choice where the target's `winograd` is false
    fns["direct"] = kiln.compile(from_onnx(model), target.with_attrs(winograd=False))["main"]
    for m in (4, 2):  # both, also where tuning offers only F(2x2)
        with using(AllWinograd(m)):
            fns[f"F{m}"] = kiln.compile(from_onnx(model), target)["main"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    ref = np.asarray(fns["direct"](x))
    scale = float(np.abs(ref).max())
    errs = {k: float(np.abs(np.asarray(f(x)) - ref).max()) / scale for k, f in fns.items()}
    calls = {k: (lambda f=f: f(x)) for k, f in fns.items()}
    calls["ort"] = lambda: session.run(None, {"x": x})
    n = calls_within(calls, args.repeat, args.seconds)
    ms = alternating_blocks_ms(calls, n, clock=CPU_TIME if args.threads == 1
                               else time.perf_counter)
    return (f"{kernel.name:<22} {spec.family:<14} {ms['direct']:>9.3f} {ms['F4']:>8.3f} "
            f"{ms['F2']:>8.3f} {ms['ort']:>8.3f} {ms['direct'] / ms['F4']:>6.2f}x "
            f"{ms['direct'] / ms['F2']:>6.2f}x {errs['F4']:>8.1e} {errs['F2']:>8.1e}")


def model_rows(path: str, target: kiln.target.Target, args: argparse.Namespace) -> list[str]:
    model = onnx.load(path)
    untuned = kiln.compile(from_onnx(model), target.with_attrs(winograd=False))
    session = AllWinograd()
    with using(session):
        wino = kiln.compile(from_onnx(model), target)
    inputs = [np.random.default_rng(0).standard_normal(
        [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    ref = np.asarray(untuned(*inputs))
    err = float(np.abs(np.asarray(wino(*inputs)) - ref).max() / np.abs(ref).max())
    calls = {"untuned": lambda: untuned(*inputs), "winograd": lambda: wino(*inputs)}
    n = calls_within(calls, args.repeat, args.seconds)
    ms = alternating_blocks_ms(calls, n, clock=CPU_TIME if args.threads == 1
                               else time.perf_counter)
    return [f"{os.path.basename(path)}: {session.forced} convolutions on Winograd; direct "
            f"{ms['untuned']:.1f} ms, Winograd {ms['winograd']:.1f} ms "
            f"({ms['untuned'] / ms['winograd']:.3f}x), err {err:.1e}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1)
    parser.add_argument("--repeat", type=int, default=20, help="most timed calls per variant")
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per row")
    parser.add_argument("--model", default=None, help="an ONNX model to time whole")
    parser.add_argument("--target", default=None, help="kiln target (default: this host)")
    args = parser.parse_args()
    # read once per library, at its first parallel loop
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    target = (kiln.target.Target.from_host() if args.target is None
              else kiln.target.Target(args.target))
    clock = "the calling thread's CPU time" if args.threads == 1 else "wall time"
    print(f"target: {describe_target(target)}; {args.threads} thread(s), {clock}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'kernel':<22} {'rule':<14} {'direct ms':>9} {'F4 ms':>8} {'F2 ms':>8} "
          f"{'ort ms':>8} {'F4':>7} {'F2':>7} {'F4 err':>8} {'F2 err':>8}")
    for kernel in SHAPES:
        print(conv_row(kernel, target, args), flush=True)
    if args.model:
        print(*model_rows(args.model, target, args), sep="\n")


if __name__ == "__main__":
    main()
