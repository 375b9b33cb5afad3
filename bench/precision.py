"""The target attribute `precision`: float32 vs bfloat16 or float16, latency and accuracy.

    .venv/bin/python bench/precision.py [--models float | NAME,...] [--repeat 20]
                                        [--seconds 10] [--threads 2] [--precision bf16|f16]

Each model (bench/models.py's builders; `float`, the default: the float models of
bench/peers.py's set, from the MLP to the Whisper encoder) is compiled for `host` and
for `host -precision=bf16` (the GEMMs of constant weights, the NCHWc convolutions and
attention's activation products on bfloat16 values with float32 sums,
kiln.kernels.gemm.bf16, kiln.kernels.conv.bf16, kiln.kernels.gemm.bf16_tiled;
depthwise, Winograd and NCHW convolutions, element-wise ops and normalisation stay
float32), and the two are timed in alternating blocks
(bench/harness.py; wall time, `--threads` threads through
`kiln.runtime.set_num_threads`, batch 1). `rel L2` is the
bf16 output's relative L2 distance from the float32 build's; `top-1` whether the two
agree on the output's largest entry (per row of the last axis, as a share). Prints a
table; asserts nothing. The host must have AVX512-BF16. `--precision f16` compares
`host -precision=f16` instead (the GEMMs of constant weights on float16 weights widened
as loaded, float32 arithmetic, kiln.kernels.gemm.f16; everything else float32): the host
must have F16C.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from harness import alternating_blocks_ms, calls_within, describe_target, rel_l2, short_error

import kiln
from kiln.frontend import from_onnx
from models import build

#: The float models of bench/peers.py's set.
FLOAT_SET = ["mlp", "cnn", "encoder", "resnet18", "mobilenetv2", "resnet50", "squeezenet",
             "shufflenet", "inception", "densenet121", "efficientnet", "vgg19", "bert",
             "gpt2", "vit", "whisper_encoder"]


def _top1(a: np.ndarray, b: np.ndarray) -> float:
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float(np.mean(a2.argmax(axis=1) == b2.argmax(axis=1)))


def row(name: str, args: argparse.Namespace) -> str:
    model, feed = build(name)
    inputs = list(feed.values())
    fns, compile_s = {}, {}
    low = args.precision
    for precision in ("f32", low):
        start = time.perf_counter()
        fn = kiln.compile(from_onnx(model), f"host -precision={precision}")["main"]
        fn(*inputs)  # links and loads the library
        fns[precision], compile_s[precision] = fn, time.perf_counter() - start
    f32, bf16 = (np.asarray(fns[p](*inputs)) for p in ("f32", low))
    calls = {p: (lambda f=f: f(*inputs)) for p, f in fns.items()}
    n = calls_within(calls, args.repeat, args.seconds)
    ms = alternating_blocks_ms(calls, n, clock=time.perf_counter)
    return (f"{name:<10} {ms['f32']:>9.2f} {ms[low]:>9.2f} "
            f"{ms['f32'] / ms[low]:>7.2f}x {rel_l2(bf16, f32):>9.1e} "
            f"{_top1(bf16, f32):>6.3f} {compile_s['f32']:>7.1f} {compile_s[low]:>7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="float",
                        help="comma-separated model names, or 'float' (the default set)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("bf16", "f16"), default="bf16",
                        help="the reduced precision compared with f32")
    args = parser.parse_args()
    kiln.runtime.set_num_threads(args.threads)
    low = args.precision
    target = kiln.target.Target(f"host -precision={low}")
    print(f"host: {describe_target(target)}; {args.threads} threads, batch 1")
    print(f"{'model':<10} {'f32 ms':>9} {low + ' ms':>9} {'speedup':>8} {'rel L2':>9} "
          f"{'top-1':>6} {'f32 s':>7} {low + ' s':>7}")
    names = FLOAT_SET if args.models == "float" else args.models.split(",")
    for name in names:
        try:
            print(row(name, args), flush=True)
        except Exception as exc:  # a benchmark reports what fails and goes on
            print(f"{name:<10} failed: {short_error(exc)}", flush=True)


if __name__ == "__main__":
    main()
