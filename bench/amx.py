"""The bf16 GEMM on AMX tiles against AVX512-BF16 and float32, on a host with AMX.

    .venv/bin/python bench/amx.py [--threads 2,16] [--models bert] [--seconds 4]

Each case (GEMMs by a constant weight at BERT-base's sizes, then bench/models.py's
models) is compiled three times for this host: `host -precision=bf16` (AMX-BF16 tiles
where the host has them: kiln.kernels.gemm.amx_bf16), `host -mattr=-amx-tile
-precision=bf16` (the AVX512-BF16 `vdpbf16ps` kernel, kiln.kernels.gemm.bf16) and
`host` (float32), and the three are timed in alternating blocks in one process
(bench/harness.py; wall time, `--threads` threads, batch 1). GFLOP/s counts 2*M*N*K
per GEMM; `rel L2` is each bf16 output's relative L2 distance from the float32
build's. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from harness import alternating_blocks_ms, calls_within, describe_target, rel_l2, short_error
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.kernels.gemm.amx_bf16 import uses_amx
from kiln.target.isa import isa_for
from models import build

TARGETS = {"amx": "host -precision=bf16", "avx512bf16": "host -mattr=-amx-tile -precision=bf16",
           "f32": "host"}
#: (M, K, N): BERT-base's projections and FFN at sequence 128, and a square GEMM.
GEMMS = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768), (512, 1024, 1024)]


def _gemm(m: int, k: int, n: int) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (m, k))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (m, n))],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((m, k)).astype(np.float32)}


def _row(name: str, model: Any, feed: dict[str, np.ndarray], args: argparse.Namespace,
         flops: float) -> str:
    inputs = list(feed.values())
    fns, compile_s = {}, {}
    for label, spec in TARGETS.items():
        start = time.perf_counter()
        fn = kiln.compile(from_onnx(model), spec)["main"]
        fn(*inputs)
        fns[label], compile_s[label] = fn, time.perf_counter() - start
    outs = {label: np.asarray(fn(*inputs)) for label, fn in fns.items()}
    calls = {label: (lambda f=f: f(*inputs)) for label, f in fns.items()}
    n = calls_within(calls, args.repeat, args.seconds)
    ms = alternating_blocks_ms(calls, n, clock=time.perf_counter)
    rate = "".join(f" {flops / ms[label] / 1e6:>8.0f}" for label in TARGETS) if flops else ""
    return (f"{name:<16} {ms['amx']:>8.3f} {ms['avx512bf16']:>8.3f} {ms['f32']:>8.3f}"
            f" {ms['avx512bf16'] / ms['amx']:>7.2f}x {ms['f32'] / ms['amx']:>7.2f}x{rate}"
            f" {rel_l2(outs['amx'], outs['f32']):>8.1e}"
            f" {rel_l2(outs['avx512bf16'], outs['f32']):>8.1e}"
            f" {compile_s['amx']:>5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="2", help="comma-separated thread counts")
    parser.add_argument("--models", default="bert", help="bench/models.py names ('' none)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    host = kiln.target.Target(TARGETS["amx"])
    print(f"host: {describe_target(host)}; AMX tiles used: {uses_amx(isa_for(host))}")
    for threads in (int(t) for t in args.threads.split(",")):
        kiln.runtime.set_num_threads(threads)
        print(f"\n{threads} threads, batch 1 (ms: median; speedups of AMX; GFLOP/s amx, "
              "avx512bf16, f32; rel L2 of amx and avx512bf16 vs f32; AMX build s)")
        for m, k, n in GEMMS:
            try:
                print(_row(f"gemm {m}x{k}x{n}", *_gemm(m, k, n), args, 2.0 * m * k * n),
                      flush=True)
            except Exception as exc:  # a benchmark reports what fails and goes on
                print(f"gemm {m}x{k}x{n} failed: {short_error(exc)}", flush=True)
        for name in filter(None, args.models.split(",")):
            try:
                print(_row(name, *build(name), args, 0.0), flush=True)
            except Exception as exc:
                print(f"{name:<16} failed: {short_error(exc)}", flush=True)


if __name__ == "__main__":
    main()
