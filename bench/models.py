"""Model benchmark: kiln vs onnxruntime on small models, batch 1, in one process.

    .venv/bin/python bench/models.py [--repeat 30] [--target llvm] [--models mlp,cnn]

Builds three small models with onnx.helper (deterministic weights):

- `mlp`: 784-512-512-10 (Gemm + Relu);
- `cnn`: three 3x3 convolutions (3->16->32->64 channels) with ReLU and 2x2
  max pooling on a 64x64 image, then global average pooling and a dense layer;
- `resnet`: a 3x3 stem (3->32) and three residual basic blocks
  (conv-relu-conv + identity, relu) at 32x32, then global average pooling and a
  dense layer.

Each is imported with `kiln.frontend.from_onnx`, compiled with
`kiln.compile(mod, target)` (default: `Target.from_host()`) and timed against
onnxruntime (`intra_op_num_threads=2`) on the same input: compile time
(import + passes + codegen + link), the median of `--repeat` calls of each
(in alternating blocks of calls: machine drift hits both alike, and neither
runtime's spinning worker threads slow the other's calls), the ratio
kiln/ort (below 1: kiln is faster) and the relative L2 error of kiln's output
against ort's. kiln's parallel loops use `KILN_NUM_THREADS` threads (default:
every online CPU); `--tensor-pipeline simplify` compiles without the
Parallelize pass (the "before" figures of docs/performance.md).
Prints a table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx

OPSET = 17


class Graph:
    """Nodes and initializers of one ONNX graph, with deterministic weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def weight(self, *shape: int) -> str:
        fan_in = int(np.prod(shape[1:]))
        return self.const(self.rng.normal(0, 1 / math.sqrt(fan_in), shape), "w")

    def bias(self, n: int) -> str:
        return self.const(self.rng.normal(0, 0.1, n), "b")

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def dense(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Gemm", x, self.weight(n_out, n_in), self.bias(n_out), transB=1)

    def conv(self, x: str, cin: int, cout: int) -> str:
        return self.op("Conv", x, self.weight(cout, cin, 3, 3), self.bias(cout),
                       kernel_shape=[3, 3], pads=[1, 1, 1, 1])

    def model(self, name: str, x: str, shape: list[int], y: str, out_shape: list[int]
              ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def mlp() -> tuple[onnx.ModelProto, list[int]]:
    g = Graph(0)
    h = g.op("Relu", g.dense("x", 784, 512))
    h = g.op("Relu", g.dense(h, 512, 512))
    y = g.dense(h, 512, 10)
    return g.model("mlp", "x", [1, 784], y, [1, 10]), [1, 784]


def cnn() -> tuple[onnx.ModelProto, list[int]]:
    g = Graph(1)
    h = "x"
    for cin, cout in ((3, 16), (16, 32), (32, 64)):
        h = g.op("Relu", g.conv(h, cin, cout))
        h = g.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, 64, 10)
    return g.model("cnn", "x", [1, 3, 64, 64], y, [1, 10]), [1, 3, 64, 64]


def resnet() -> tuple[onnx.ModelProto, list[int]]:
    g = Graph(2)
    c = 32
    h = g.op("Relu", g.conv("x", 3, c))
    for _ in range(3):
        r = g.op("Relu", g.conv(h, c, c))
        r = g.conv(r, c, c)
        h = g.op("Relu", g.op("Add", r, h))
    h = g.op("Flatten", g.op("GlobalAveragePool", h))
    y = g.dense(h, c, 10)
    return g.model("resnet", "x", [1, 3, 32, 32], y, [1, 10]), [1, 3, 32, 32]


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, list[int]]]] = {
    "mlp": mlp, "cnn": cnn, "resnet": resnet,
}


def alternating_blocks_ms(fns: dict[str, Callable[[], object]], repeat: int,
                         rounds: int = 5) -> dict[str, float]:
    """Median milliseconds per call of each function: `rounds` rounds, each running
    every function in its own block of calls (after a pause and one warm-up call),
    so slow drift of a shared machine hits all alike while each runtime's thread
    pool runs undisturbed by the other's spinning threads."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    per_block = max(1, repeat // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(0.05)  # let the other runtime's spinning threads go to sleep
            fn()
            for _ in range(per_block):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def run(name: str, target: kiln.target.Target, repeat: int,
        tensor_pipeline: str) -> dict[str, float]:
    import onnxruntime as ort

    model, shape = MODELS[name]()
    x = np.random.default_rng(42).standard_normal(shape).astype(np.float32)

    start = time.perf_counter()
    ex = kiln.compile(from_onnx(model), target, tensor_pipeline=tensor_pipeline)
    fn = ex["main"]  # links and loads the library
    compile_s = time.perf_counter() - start

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    expected = session.run(None, feed)[0]
    actual = np.asarray(fn(x))
    error = float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))

    ms = alternating_blocks_ms({"kiln": lambda: fn(x),
                                "ort": lambda: session.run(None, feed)}, repeat)
    kiln_ms, ort_ms = ms["kiln"], ms["ort"]
    return {"compile_s": compile_s, "kiln_ms": kiln_ms, "ort_ms": ort_ms,
            "ratio": kiln_ms / ort_ms, "rel_l2": error, "cache_hit": float(ex.cache_hit)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--target", default=None, help="kiln target (default: this host)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tensor-pipeline", default="default",
                        help="kiln's tensor pipeline, e.g. 'simplify' (no parallel loops)")
    args = parser.parse_args()
    target = kiln.target.Target.from_host() if args.target is None else kiln.target.Target(
        args.target)
    threads = os.environ.get("KILN_NUM_THREADS", f"all ({os.cpu_count()})")
    print(f"target: {target.kind.name} {target.get('mcpu', '') or ''}   tensor pipeline: "
          f"{args.tensor_pipeline}   KILN_NUM_THREADS: {threads}   ort threads: 2   "
          f"median of {args.repeat}, alternating blocks")
    header = (f"{'model':<8} {'compile s':>9} {'kiln ms':>9} {'ort ms':>9} {'kiln/ort':>9} "
              f"{'rel L2':>9}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        r = run(name, target, args.repeat, args.tensor_pipeline)
        cached = " (cache hit)" if r["cache_hit"] else ""
        print(f"{name:<8} {r['compile_s']:>9.2f} {r['kiln_ms']:>9.3f} {r['ort_ms']:>9.3f} "
              f"{r['ratio']:>9.2f} {r['rel_l2']:>9.1e}{cached}")


if __name__ == "__main__":
    main()
