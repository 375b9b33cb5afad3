"""Data-movement benchmark: reshape/transpose chains with and without `merge-copies`.

    .venv/bin/python bench/copies.py [--calls 60] [--threads 1,2] [--cases shuffle60,...]
                                     [--models shufflenet,whisper_encoder --calls 15]

The copies of ShuffleNet's channel shuffle (Reshape -> Transpose -> Reshape) and of
Whisper-base's attention (heads split of Q and V, K^T before `Q @ K^T`, the heads
merge), each a small ONNX model at the model's shapes, compiled by kiln with its
default graph pipeline ("merged") and with the `merge-copies` pass disabled
("unmerged", each op its own copy), beside onnxruntime, in this process. One thread:
the median CPU time of a call (`time.thread_time`, alternating blocks:
bench/harness.py); more threads: the median wall time. With `--models`, whole models
of bench/models.py instead, merged and unmerged, one thread by CPU time (the figure a
loaded machine disturbs least). Prints a table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import harness
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.transform import PassContext

Case = tuple[onnx.ModelProto, dict[str, np.ndarray]]


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]],
           consts: dict[str, np.ndarray]) -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "copies",
                              [vi(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
                              [vi("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, n) for n, v in consts.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _feeds(inputs: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}


def shuffle(c: int, h: int, groups: int = 3) -> Case:
    """ShuffleNet's channel shuffle of `c` channels of h x h in `groups` groups."""
    inputs = {"x": (1, c, h, h)}
    nodes = [helper.make_node("Reshape", ["x", "view"], ["v"]),
             helper.make_node("Transpose", ["v"], ["t"], perm=(0, 2, 1, 3, 4)),
             helper.make_node("Reshape", ["t", "back"], ["y"])]
    consts = {"view": np.array((1, groups, c // groups, h, h), np.int64),
              "back": np.array((1, c, h, h), np.int64)}
    return _model(nodes, inputs, consts), _feeds(inputs)


SEQ, HEADS, DIM = 1500, 8, 64  # Whisper-base's encoder: 30 s of audio


def heads_split() -> Case:
    """[seq, heads*dim] -> [1, heads, seq, dim] (Q and V of every layer)."""
    inputs = {"x": (1, SEQ, HEADS * DIM)}
    nodes = [helper.make_node("Reshape", ["x", "split"], ["v"]),
             helper.make_node("Transpose", ["v"], ["y"], perm=(0, 2, 1, 3))]
    return _model(nodes, inputs, {"split": np.array((1, SEQ, HEADS, DIM), np.int64)}), \
        _feeds(inputs)


def heads_merge() -> Case:
    """[1, heads, seq, dim] -> [1, seq, heads*dim] (after P @ V)."""
    inputs = {"x": (1, HEADS, SEQ, DIM)}
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=(0, 2, 1, 3)),
             helper.make_node("Reshape", ["t", "merge"], ["y"])]
    return _model(nodes, inputs, {"merge": np.array((1, SEQ, HEADS * DIM), np.int64)}), \
        _feeds(inputs)


def key_scores(seq: int = SEQ) -> Case:
    """Q @ K^T with K's heads split and transposed `[seq, heads, dim] -> [heads, dim, seq]`
    (the product itself is most of the time: compare the difference)."""
    inputs = {"q": (1, HEADS, seq, DIM), "k": (1, seq, HEADS * DIM)}
    nodes = [helper.make_node("Reshape", ["k", "split"], ["v"]),
             helper.make_node("Transpose", ["v"], ["kt"], perm=(0, 2, 3, 1)),
             helper.make_node("MatMul", ["q", "kt"], ["y"])]
    return _model(nodes, inputs, {"split": np.array((1, seq, HEADS, DIM), np.int64)}), \
        _feeds(inputs)


CASES: dict[str, Callable[[], Case]] = {
    "shuffle60x56": lambda: shuffle(60, 56), "shuffle240x28": lambda: shuffle(240, 28),
    "shuffle480x14": lambda: shuffle(480, 14), "heads_split": heads_split,
    "heads_merge": heads_merge, "k_scores": key_scores,
}


def _kiln(model: onnx.ModelProto, merged: bool) -> Callable[..., object]:
    with PassContext(disabled_passes=() if merged else ("merge-copies",)):
        ex = kiln.compile(from_onnx(model), kiln.target.Target.from_host())
    return ex.jit()["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--models", default="",
                        help="models of bench/models.py, one thread by CPU time")
    args = parser.parse_args()
    import onnxruntime as ort

    print(f"host: {harness.describe_target(kiln.target.Target.from_host())}")
    if args.models:
        from models import build

        cases = {name: (lambda name=name: build(name)) for name in args.models.split(",")}
        threads_list = "1"
    else:
        cases = {name: CASES[name] for name in args.cases.split(",")}
        threads_list = args.threads
    print("| case | threads | merged ms | unmerged ms | ort ms | merged/ort | unmerged/ort |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, case in cases.items():
        model, feeds = case()
        fns = {"merged": _kiln(model, True), "unmerged": _kiln(model, False)}
        inputs = list(feeds.values())
        if not args.models:  # one output: both builds agree
            want = np.asarray(fns["unmerged"](*inputs))
            assert np.allclose(np.asarray(fns["merged"](*inputs)), want, rtol=1e-4, atol=1e-4)
        for threads in (int(t) for t in threads_list.split(",")):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            kiln.runtime.set_num_threads(threads)
            calls: dict[str, Callable[[], object]] = {
                k: (lambda f=f, a=inputs: f(*a)) for k, f in fns.items()}
            outs = [np.empty_like(o) for o in sess.run(None, feeds)]
            calls["ort"] = harness.ort_bound_run(sess, feeds, outs)
            clock = time.thread_time if threads == 1 else time.perf_counter
            ms = harness.alternating_blocks_ms(calls, args.calls, rounds=5, clock=clock)
            print(f"| {name} | {threads} | {ms['merged']:.3f} | {ms['unmerged']:.3f} | "
                  f"{ms['ort']:.3f} | {ms['merged'] / ms['ort']:.2f}x | "
                  f"{ms['unmerged'] / ms['ort']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
