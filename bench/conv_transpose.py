"""ConvTranspose layers, kiln against onnxruntime in one process.

    .venv/bin/python bench/conv_transpose.py [--threads 1] [--calls 30] [--only NAME]

Each layer is a single-node model with constant weights and bias (decoder, GAN and
segmentation shapes, grouped and depthwise, 1-D and 3-D); both runtimes run it through
their session API (`kiln.InferenceSession`, compiled for this host), in alternating
blocks of calls. Prints per layer the shortest and the median time of each, kiln's
ratio to onnxruntime and the largest difference relative to onnxruntime's largest
output (float32 ConvTranspose is a GEMM and `col2im` in both, summed in the same
order: usually 0). Asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln

# name -> (input shape, weight shape, attributes)
LAYERS: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "unet 64x56x56->32 k4s2p1": ((1, 64, 56, 56), (64, 32, 4, 4),
                                 {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "dcgan 128x28x28->64 k4s2p1": ((1, 128, 28, 28), (128, 64, 4, 4),
                                   {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "unet 256x28x28->128 k2s2": ((1, 256, 28, 28), (256, 128, 2, 2), {"strides": [2, 2]}),
    "64x56x56->64 k3p1": ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    "batch 4 256x8x8->128 k4s2p1": ((4, 256, 8, 8), (256, 128, 4, 4),
                                    {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "64x28x28->64 k3s2 output_padding": ((1, 64, 28, 28), (64, 64, 3, 3),
                                         {"strides": [2, 2], "pads": [1, 1, 0, 0],
                                          "output_padding": [1, 1]}),
    "group 4 64x28x28->64 k3s2": ((1, 64, 28, 28), (64, 16, 3, 3),
                                  {"strides": [2, 2], "pads": [1, 1, 0, 0], "group": 4,
                                   "output_padding": [1, 1]}),
    "depthwise 64x28x28 k4s2p1": ((1, 64, 28, 28), (64, 1, 4, 4),
                                  {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 64}),
    "dcgan latent 100x1x1->512 k4": ((1, 100, 1, 1), (100, 512, 4, 4), {}),
    "dcgan latent batch 16": ((16, 100, 1, 1), (100, 512, 4, 4), {}),
    "fcn32 21x7x7->21 k64s32": ((1, 21, 7, 7), (21, 21, 64, 64),
                                {"strides": [32, 32], "pads": [16, 16, 16, 16]}),
    "hifigan 1-D 512x32->256 k16s8": ((1, 512, 32), (512, 256, 16),
                                      {"strides": [8], "pads": [4, 4]}),
    "3-D 64x8x16x16->32 k2s2": ((1, 64, 8, 16, 16), (64, 32, 2, 2, 2),
                                {"strides": [2, 2, 2]}),
}


def layer_model(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any]
                ) -> tuple[onnx.ModelProto, np.ndarray]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "conv_transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal(xs).astype(np.float32)


def timed(session: Any, feeds: dict[str, np.ndarray], calls: int) -> list[float]:
    """Seconds per `session.run(None, feeds)`, after one call."""
    session.run(None, feeds)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--only", default="", help="layers whose name contains this")
    args = parser.parse_args()
    print(f"{'layer':36s} {'kiln ms':>9s} {'median':>8s} {'ort ms':>8s} {'median':>8s} "
          f"{'kiln/ort':>8s} {'rel diff':>8s}")
    for name, (xs, ws, attrs) in LAYERS.items():
        if args.only not in name:
            continue
        model, x = layer_model(xs, ws, attrs)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        reference = ort.InferenceSession(model.SerializeToString(), options,
                                         providers=["CPUExecutionProvider"])
        kiln_options = kiln.SessionOptions()
        kiln_options.intra_op_num_threads = args.threads
        session = kiln.InferenceSession(model.SerializeToString(), kiln_options)
        want = reference.run(None, {"x": x})[0]
        got = session.run(None, {"x": x})[0]
        diff = float(np.abs(got - want).max() / np.abs(want).max())
        mine: list[float] = []
        theirs: list[float] = []
        for _ in range(3):  # alternating blocks: slow drift hits both alike
            time.sleep(0.05)
            mine += timed(session, {"x": x}, max(1, args.calls // 3))
            time.sleep(0.05)
            theirs += timed(reference, {"x": x}, max(1, args.calls // 3))
        print(f"{name:36s} {min(mine) * 1e3:9.3f} {np.median(mine) * 1e3:8.3f} "
              f"{min(theirs) * 1e3:8.3f} {np.median(theirs) * 1e3:8.3f} "
              f"{min(mine) / min(theirs):8.2f} {diff:8.1e}", flush=True)


if __name__ == "__main__":
    main()
