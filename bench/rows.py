"""Row-op benchmark: Softmax, LayerNormalization, reductions, vectorized math; kiln vs onnxruntime.

    .venv/bin/python bench/rows.py [--repeat 200] [--target llvm]

Each case is a one-node ONNX model at the shapes of the bench/models.py
encoder (width 256, 4 heads) and BERT-like model (width 768, 12 heads),
sequence 128, plus the same with an elementwise producer (attention scale and
additive mask before Softmax, residual Add before LayerNormalization) that
kiln fuses into the row kernel, and the elementwise math of a BERT-base /
GPT-2 feed-forward layer (GELU in its erf and tanh forms, Tanh, Sigmoid, Exp
on 128x3072). Prints the median microseconds per call of
kiln (`fn(x, out=o)`) and of a one-node onnxruntime session
(`intra_op_num_threads=2`), in alternating blocks, and the relative L2 error.
kiln's threads: `KILN_NUM_THREADS` (default: every online CPU). Asserts
nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable

import numpy as np
import onnx
from harness import alternating_blocks_ms, describe_target, rel_l2
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import kiln
from kiln.frontend import from_onnx

F = TensorProto.FLOAT
RNG = np.random.default_rng(3)


def one_op(build: Callable[[list[onnx.NodeProto], list[onnx.TensorProto]], str],
           inputs: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    y = build(nodes, inits)
    graph = helper.make_graph(nodes, "row", [helper.make_tensor_value_info(n, F, list(s))
                                             for n, s in inputs.items()],
                              [helper.make_tensor_value_info(y, F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def const(inits: list[onnx.TensorProto], name: str, value: np.ndarray) -> str:
    inits.append(nh.from_array(value.astype(np.float32), name))
    return name


def softmax(heads: int, seq: int, masked: bool) -> onnx.ModelProto:
    def build(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
        x = "x"
        if masked:
            scale = const(inits, "scale", np.array(0.125))
            mask = const(inits, "mask", np.where(RNG.random((1, 1, 1, seq)) < 0.1, -1e4, 0))
            nodes += [helper.make_node("Mul", ["x", scale], ["s"]),
                      helper.make_node("Add", ["s", mask], ["m"])]
            x = "m"
        nodes.append(helper.make_node("Softmax", [x], ["y"], axis=-1))
        return "y"
    return one_op(build, {"x": (1, heads, seq, seq)})


def layer_norm(seq: int, dim: int, residual: bool) -> onnx.ModelProto:
    def build(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
        x = "x"
        if residual:
            nodes.append(helper.make_node("Add", ["x", "h"], ["a"]))
            x = "a"
        gamma = const(inits, "g", RNG.uniform(0.8, 1.2, dim))
        beta = const(inits, "b", RNG.normal(0, 0.1, dim))
        nodes.append(helper.make_node("LayerNormalization", [x, gamma, beta], ["y"], axis=-1))
        return "y"
    inputs = {"x": (1, seq, dim)}
    if residual:
        inputs["h"] = (1, seq, dim)
    return one_op(build, inputs)


def reduce_mean(seq: int, dim: int) -> onnx.ModelProto:
    def build(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
        nodes.append(helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1]))
        return "y"
    model = one_op(build, {"x": (1, seq, dim)})
    model.opset_import[0].version = 13
    return model


def unary(op: str, rows: int, cols: int, **attrs: object) -> onnx.ModelProto:
    def build(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
        nodes.append(helper.make_node(op, ["x"], ["y"], **attrs))
        return "y"
    model = one_op(build, {"x": (1, rows, cols)})
    model.opset_import[0].version = 20  # Gelu
    model.ir_version = 9
    return model


CASES: dict[str, Callable[[], onnx.ModelProto]] = {
    "softmax 4x128x128": lambda: softmax(4, 128, False),
    "scale+mask+softmax 4x128x128": lambda: softmax(4, 128, True),
    "softmax 12x128x128": lambda: softmax(12, 128, False),
    "layernorm 128x256": lambda: layer_norm(128, 256, False),
    "add+layernorm 128x256": lambda: layer_norm(128, 256, True),
    "layernorm 128x768": lambda: layer_norm(128, 768, False),
    "add+layernorm 128x768": lambda: layer_norm(128, 768, True),
    "reducemean 128x768": lambda: reduce_mean(128, 768),
    "gelu 128x3072": lambda: unary("Gelu", 128, 3072),
    "gelu tanh 128x3072": lambda: unary("Gelu", 128, 3072, approximate="tanh"),
    "tanh 128x3072": lambda: unary("Tanh", 128, 3072),
    "sigmoid 128x3072": lambda: unary("Sigmoid", 128, 3072),
    "exp 128x3072": lambda: unary("Exp", 128, 3072),
    "relu 128x3072 (memory bound)": lambda: unary("Relu", 128, 3072),
}


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--target", default=None)
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names")
    opts = parser.parse_args()
    target = kiln.target.Target(opts.target) if opts.target else kiln.target.Target.from_host()
    print(f"target: {describe_target(target)}   KILN_NUM_THREADS: "
          f"{os.environ.get('KILN_NUM_THREADS', 'all')}   ort threads: 2")
    print(f"{'case':<30} {'kiln us':>9} {'ort us':>9} {'kiln/ort':>9} {'rel L2':>9}")
    for name, make in CASES.items():
        if opts.cases and not any(c in name for c in opts.cases.split(",")):
            continue
        model = make()
        feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                 .astype(np.float32) for i in model.graph.input}
        fn = kiln.compile(from_onnx(model), target)["main"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        args = list(feeds.values())
        out = fn(*args)
        expected = session.run(None, feeds)[0]
        ms = alternating_blocks_ms(
            {"kiln": functools.partial(fn, *args, out=out),
             "ort": functools.partial(session.run, None, feeds)}, opts.repeat)
        print(f"{name:<30} {ms['kiln'] * 1e3:9.1f} {ms['ort'] * 1e3:9.1f} "
              f"{ms['kiln'] / ms['ort']:9.2f} {rel_l2(out, expected):9.1e}", flush=True)


if __name__ == "__main__":
    main()
