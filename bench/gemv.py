"""Matrix-vector benchmark: ONNX `Gemm(transB=1)` at batch 1 (a dense layer's weight `[N][K]`).

    .venv/bin/python bench/gemv.py [--repeat 200] [--threads 2]

The shapes of VGG-19's and BERT's classifier layers and an MLP's. Each is a
one-node model (weight and bias initializers) compiled with
`kiln.compile(from_onnx(model), Target.from_host())` and timed in this process
(median of `--repeat` calls) against a one-node onnxruntime session and numpy
(`w @ x`). Prints GB/s of weight streamed (the product reads each weight once;
at batch 1 memory bandwidth bounds it) and which kernel kiln chose (the op the
block-matmuls pass left in the graph). Run it under two checkouts' PYTHONPATH to
compare kernels; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np

SHAPES = [(784, 512), (4096, 1000), (4096, 4096), (25088, 4096), (768, 3072), (3072, 768)]


def model(k: int, n: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((n, k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                              "gemv", [vi("x", TensorProto.FLOAT, [1, k])],
                              [vi("y", TensorProto.FLOAT, [1, n])], [w, b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import onnxruntime as ort

    import kiln
    from kiln.frontend import from_onnx
    from kiln.transform import PassContext

    target = kiln.Target.from_host()
    print(f"kiln from {kiln.__file__}; target {target.attrs.get('mcpu')}; "
          f"{args.threads} threads; median of {args.repeat} calls")
    print(f"{'K x N':>12} {'kernel':>14} {'kiln GB/s':>9} {'ort GB/s':>8} {'np GB/s':>7} "
          f"{'kiln/ort':>8}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    for k, n in SHAPES:
        data = model(k, n)
        with PassContext(config={"kiln.cache": False}):
            ex = kiln.compile(from_onnx(data), target)
        kernel = next((str(f.attrs["kiln.gemm_kernel"]) for f in ex.ir.prim_funcs().values()
                       if "kiln.gemm_kernel" in f.attrs), "other")
        x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        t_kiln = median_seconds(partial(ex["main"], x), args.repeat)
        t_ort = median_seconds(partial(sess.run, None, {"x": x}), args.repeat)
        t_np = median_seconds(partial(np.matmul, w, x[0]), args.repeat)
        gb = 4 * k * n / 1e9
        print(f"{k:>5} x {n:<5} {kernel:>14} {gb / t_kiln:>9.1f} {gb / t_ort:>8.1f} "
              f"{gb / t_np:>7.1f} {t_ort / t_kiln:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
