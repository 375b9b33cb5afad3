"""CBLAS or kiln's own GEMM for one float32 product (docs/tuning.md, "CBLAS or kiln's
own GEMM"):

    .venv/bin/python bench/cblas_choice.py [--threads 2] [--calls 60] [--rounds 6]
                                           [--shape 128x768x768 ...] [--model M.onnx]

For each `MxKxN` product `x[M, K] @ w[K, N]` (w a constant), builds the one-product
library both ways the tuning knob offers, on the host target with `libs: ["cblas"]`:
`{"library": "cblas"}` (the rule: one `cblas_sgemm` call, OpenBLAS here) and
`{"library": "own"}` (kiln's packed GEMM by its rule), and times them next to
onnxruntime's MatMul and numpy's `@` in alternating blocks (harness.alternating_blocks_ms,
wall time), all on `--threads` threads (OpenBLAS through OPENBLAS_NUM_THREADS, set
before it loads). With `--model`, the whole model instead: built with every product on
CBLAS (the rule), every product on kiln's own GEMM, and each product alone on kiln's
(kiln.tuning.apply.Chosen), timed likewise. Prints the medians and the ratios; asserts
nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_SHAPES = ("128x768x768", "128x768x3072", "128x3072x768", "1x768x768", "1x256x256")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--shape", action="append", help="MxKxN (default: BERT-base's "
                        "projections at 128 tokens and two batch-1 dense layers)")
    parser.add_argument("--model", help="an ONNX model (static shapes) to time as a whole")
    args = parser.parse_args(argv)
    # before OpenBLAS (numpy's or kiln's) is loaded
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import onnxruntime as ort
    from harness import alternating_blocks_ms, describe_target
    from onnx import TensorProto, helper, numpy_helper

    import kiln
    from kiln.ir import graph as g
    from kiln.ir.module import IRModule
    from kiln.ir.types import TensorType
    from kiln.ops.cblas import NAME
    from kiln.ops.registry import call
    from kiln.tuning.apply import Chosen, Forced, using

    target = kiln.Target.from_host().with_attrs(libs=["cblas"])
    print(f"CPU: {describe_target(target)}; {os.cpu_count()} CPUs; {args.threads} "
          f"thread(s); load average {os.getloadavg()[0]:.2f} at start; wall time, medians "
          f"of {args.rounds} alternating blocks of {args.calls // args.rounds} calls")
    if not args.model:
        print("| M x K x N | cblas ms | own ms | own/cblas | ort ms | numpy ms |")
        print("|---|---|---|---|---|---|")

    def measure(m: int, k: int, n: int) -> dict[str, float]:
        """Median ms of the product both ways, onnxruntime and numpy."""
        rng = np.random.default_rng(0)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        xv = g.Var("x", TensorType((m, k), "float32"))
        c = call("matmul", xv, g.Constant(w, "w"))
        out = g.Var("y", c.ret_type)
        mod = IRModule({"main": g.Function((xv,), (g.Binding(out, c),), out)})
        fns = {}
        for name, params in (("cblas", None), ("own", {"library": "own"})):
            with using(Forced(NAME, params)):
                lib = kiln.compile(mod, target).jit()
            lib.set_num_threads(args.threads)
            fns[name] = (lib, lib["main"])
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        want = x @ w
        for name, (_, fn) in fns.items():
            err = float(np.max(np.abs(np.asarray(fn(x)) - want)) / np.max(np.abs(want)))
            if err > 1e-4:
                print(f"{m}x{k}x{n}: {name} differs from numpy by {err:.2e}", file=sys.stderr)
        return alternating_blocks_ms({
            "cblas": lambda: fns["cblas"][1](x), "own": lambda: fns["own"][1](x),
            "ort": lambda: sess.run(None, {"x": x}), "numpy": lambda: x @ w},
            args.calls, args.rounds)

    def whole_model(path: str) -> None:
        from kiln.distributed.tune import discover

        mod = kiln.frontend.from_onnx(path)
        sigs = [s.signature for s in discover(mod, target) if s.family == NAME]
        own = {"library": "own"}
        builds = {"all cblas": {}, "all own": {(NAME, s): own for s in sigs},
                  **{f"own: {s}": {(NAME, s): own} for s in sigs}}
        shape = tuple(d if isinstance(d, int) else 1 for d in mod["main"].params[0].type.shape)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        libs = {}
        for name, chosen in builds.items():
            with using(Chosen(chosen)):
                libs[name] = kiln.compile(mod, target).jit()
            libs[name].set_num_threads(args.threads)
        fns = {name: lib["main"] for name, lib in libs.items()}
        ref = np.asarray(fns["all cblas"](x))
        for name, fn in fns.items():
            err = float(np.max(np.abs(np.asarray(fn(x)) - ref)) / np.max(np.abs(ref)))
            if err > 1e-4:
                print(f"{name} differs from all cblas by {err:.2e}", file=sys.stderr)
        ms = alternating_blocks_ms({n: (lambda f=f: f(x)) for n, f in fns.items()},
                                   args.calls, args.rounds)
        print("| build | ms | / all cblas |\n|---|---|---|")
        for name, v in ms.items():
            print(f"| {name} | {v:.3f} | {v / ms['all cblas']:.2f} |")

    if args.model:
        whole_model(args.model)
    for text in [] if args.model else args.shape or DEFAULT_SHAPES:
        m, k, n = (int(v) for v in text.split("x"))
        ms = measure(m, k, n)
        print(f"| {m} x {k} x {n} | {ms['cblas']:.3f} | {ms['own']:.3f} | "
              f"{ms['own'] / ms['cblas']:.2f} | {ms['ort']:.3f} | {ms['numpy']:.3f} |",
              flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
