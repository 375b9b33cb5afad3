"""ONNX models with If, Loop and Scan, built with GraphBuilder, and their inputs.

Each builder returns `(model, feeds)`; the tests compare kiln with onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from support.graphs import GraphBuilder

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
Feeds = dict[str, np.ndarray]

_RNG = [np.random.default_rng(7)]


def _reset() -> None:
    """Each builder draws the same values whatever was built before it."""
    _RNG[0] = np.random.default_rng(7)


def _w(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (_RNG[0].normal(0, scale, shape)).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(inits)
    return b.model(inputs, outputs, opset=opset, full_check=True)


def subgraph(nodes: list[onnx.NodeProto], name: str, inputs: list[onnx.ValueInfoProto],
             outputs: list[onnx.ValueInfoProto]) -> onnx.GraphProto:
    """The body of an If branch, a Loop or a Scan."""
    b = GraphBuilder()
    b.add(*nodes)
    return b.graph(name, inputs, outputs)


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _vi(name: str, elem: int, shape: list[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def if_model(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """If on an input condition; both branches read outer values (an input and an
    initializer) and have nodes of their own; the batch axis is symbolic."""
    _reset()
    then_g = subgraph(
        [helper.make_node("Add", ["x", "y"], ["t0"]), helper.make_node("Relu", ["t0"], ["t1"]),
         helper.make_node("MatMul", ["t1", "W"], ["then_out"])],
        "then", [], [_vi("then_out", F, ["batch", 3])])
    else_g = subgraph(
        [helper.make_node("Mul", ["x", "y"], ["e0"]), helper.make_node("Sub", ["e0", "y"], ["e1"]),
         helper.make_node("MatMul", ["e1", "W"], ["e2"]),
         helper.make_node("Tanh", ["e2"], ["else_out"])],
        "else", [], [_vi("else_out", F, ["batch", 3])])
    nodes = [helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Sigmoid", ["z"], ["out"])]
    model = _model(nodes, [_vi("c", B, []), _vi("x", F, ["batch", 4]), _vi("y", F, ["batch", 4])],
                   [_vi("out", F, ["batch", 3])], {"W": _w(4, 3)}, opset)
    return model, {"c": np.array(True), "x": _w(2, 4, scale=1), "y": _w(2, 4, scale=1)}


def _loop_body(nodes: list[onnx.NodeProto], states: list[tuple[str, int, list[int | str]]],
               outs: list[tuple[str, int, list[int | str] | None]],
               cond_out: str = "cond_out") -> onnx.GraphProto:
    ins = [_vi("i", I64, []), _vi("cond_in", B, [])] + [_vi(n, e, s) for n, e, s in states]
    return subgraph(nodes, "body", ins,
                    [_vi(cond_out, B, [])] + [_vi(n, e, s) for n, e, s in outs])


def loop_static(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """A for loop (constant M, condition passed through): a loop-carried tensor that reads
    the iteration number and an outer input, and a scan output of every state."""
    _reset()
    body = _loop_body(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["s", "decay"], ["sd"]),
         helper.make_node("Add", ["sd", "x"], ["s1"]),
         helper.make_node("Add", ["s1", "fi"], ["s_out"]),
         helper.make_node("Relu", ["s_out"], ["scan_out"])],
        [("s", F, [2, 3])], [("s_out", F, [2, 3]), ("scan_out", F, [2, 3])])
    nodes = [_const("M", np.array(5, np.int64)), _const("T", np.array(True)),
             helper.make_node("Loop", ["M", "T", "s0"], ["s_final", "scans"], body=body)]
    model = _model(nodes, [_vi("s0", F, [2, 3]), _vi("x", F, [2, 3])],
                   [_vi("s_final", F, [2, 3]), _vi("scans", F, [5, 2, 3])],
                   {"decay": np.array(0.9, np.float32)}, opset)
    return model, {"s0": _w(2, 3, scale=1), "x": _w(2, 3, scale=1)}


def loop_symbolic(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """The trip count is an input (a run-time value); two loop-carried tensors, one of them
    with the symbolic batch axis, and an RNN-like cell in the body."""
    _reset()
    body = _loop_body(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h", "U"], ["hu"]),
         helper.make_node("Add", ["hu", "xw"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Add", ["n", "one"], ["n_out"])],
        [("h", F, ["batch", 8]), ("n", F, [])], [("h_out", F, ["batch", 8]), ("n_out", F, [])])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Loop", ["M", "", "h0", "n0"], ["h", "n"], body=body)]
    model = _model(nodes, [_vi("M", I64, []), _vi("x", F, ["batch", 4]),
                           _vi("h0", F, ["batch", 8]), _vi("n0", F, [])],
                   [_vi("h", F, ["batch", 8]), _vi("n", F, [])],
                   {"W": _w(4, 8), "U": _w(8, 8), "one": np.array(1, np.float32)}, opset)
    return model, {"M": np.array(4, np.int64), "x": _w(3, 4, scale=1), "h0": _w(3, 8),
                   "n0": np.array(0, np.float32)}


def loop_early_exit(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """A while loop: the body's condition stops it before the trip count (no scan
    outputs); the iteration count comes out as a loop-carried value."""
    _reset()
    body = _loop_body(
        [helper.make_node("Add", ["s", "step"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Add", ["count", "one"], ["count_out"])],
        [("s", F, [4]), ("count", I64, [])], [("s_out", F, [4]), ("count_out", I64, [])])
    nodes = [helper.make_node("Loop", ["M", "go", "s0", "c0"], ["s", "count"], body=body)]
    model = _model(nodes, [_vi("M", I64, []), _vi("go", B, []), _vi("s0", F, [4]),
                           _vi("step", F, [4]), _vi("limit", F, [])],
                   [_vi("s", F, [4]), _vi("count", I64, [])],
                   {"c0": np.array(0, np.int64), "one": np.array(1, np.int64)}, opset)
    return model, {"M": np.array(100, np.int64), "go": np.array(True),
                   "s0": np.zeros(4, np.float32), "step": np.full(4, 0.5, np.float32),
                   "limit": np.array(7.0, np.float32)}


VOCAB, DIM, EOS = 11, 6, 3


def _decode_body(with_scan: bool) -> onnx.GraphProto:
    nodes = [helper.make_node("Gather", ["E", "tok"], ["e"]),
             helper.make_node("MatMul", ["h", "U"], ["hu"]),
             helper.make_node("Add", ["e", "hu"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_out"]),
             helper.make_node("MatMul", ["h_out", "Wo"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["tok_out"], axis=0, keepdims=0)]
    outs: list[tuple[str, int, list[int | str] | None]] = [("tok_out", I64, []),
                                                           ("h_out", F, [DIM])]
    if with_scan:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
        outs.append(("tok_out_scan", I64, []))
        nodes.append(helper.make_node("Identity", ["tok_out"], ["tok_out_scan"]))
    else:
        nodes += [_const("eos", np.array(EOS, np.int64)), _const("one", np.array(1, np.int64)),
                  helper.make_node("Equal", ["tok_out", "eos"], ["is_eos"]),
                  helper.make_node("Not", ["is_eos"], ["cond_out"]),
                  helper.make_node("Add", ["steps", "one"], ["steps_out"])]
        outs.append(("steps_out", I64, []))
    states = [("tok", I64, []), ("h", F, [DIM])] + ([] if with_scan else [("steps", I64, [])])
    return _loop_body(nodes, states, outs)


def greedy_decode(with_scan: bool, opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """A greedy-decode-like loop: embed the last token (Gather), update a hidden state,
    argmax over the vocabulary. `with_scan`: 6 steps, the tokens as a scan output;
    else stop at the EOS token (at most M steps) and return the last token."""
    _reset()
    inits = {"E": _w(VOCAB, DIM, scale=1), "U": _w(DIM, DIM), "Wo": _w(DIM, VOCAB, scale=1)}
    body = _decode_body(with_scan)
    if with_scan:
        nodes = [_const("M", np.array(6, np.int64)), _const("T", np.array(True)),
                 helper.make_node("Loop", ["M", "T", "tok0", "h0"],
                                  ["tok", "h", "tokens"], body=body)]
        outs = [_vi("tok", I64, []), _vi("h", F, [DIM]), _vi("tokens", I64, [6])]
        ins = [_vi("tok0", I64, []), _vi("h0", F, [DIM])]
    else:
        nodes = [_const("T", np.array(True)), _const("zero", np.array(0, np.int64)),
                 helper.make_node("Loop", ["M", "T", "tok0", "h0", "zero"],
                                  ["tok", "h", "steps"], body=body)]
        outs = [_vi("tok", I64, []), _vi("h", F, [DIM]), _vi("steps", I64, [])]
        ins = [_vi("M", I64, []), _vi("tok0", I64, []), _vi("h0", F, [DIM])]
    model = _model(nodes, ins, outs, inits, opset)
    feeds = {"M": np.array(20, np.int64)} if not with_scan else {}
    feeds.update({"tok0": np.array(1, np.int64), "h0": _w(DIM, scale=1)})
    return model, feeds


def scan_model(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """Two Scans: a running sum forward over axis 0, and one over axis 1 in reverse whose
    output is reversed and stacked along axis 1; the sequence axis is symbolic."""
    _reset()
    body1 = subgraph(
        [helper.make_node("Add", ["acc", "xt"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "two"], ["y_t"])],
        "scan1", [_vi("acc", F, [3]), _vi("xt", F, [3])],
        [_vi("acc_out", F, [3]), _vi("y_t", F, [3])])
    body2 = subgraph(
        [helper.make_node("Mul", ["m", "zt"], ["mz"]),
         helper.make_node("Add", ["mz", "wt"], ["m_out"]),
         helper.make_node("Sigmoid", ["m_out"], ["o_t"])],
        "scan2", [_vi("m", F, [3]), _vi("zt", F, [3]), _vi("wt", F, [3])],
        [_vi("m_out", F, [3]), _vi("o_t", F, [3])])
    nodes = [helper.make_node("Scan", ["acc0", "x"], ["acc", "ys"], body=body1,
                              num_scan_inputs=1),
             helper.make_node("Transpose", ["x"], ["xt_all"], perm=[1, 0]),
             helper.make_node("Scan", ["m0", "xt_all", "w"], ["m", "os"], body=body2,
                              num_scan_inputs=2, scan_input_axes=[1, -1],
                              scan_input_directions=[1, 0], scan_output_axes=[1],
                              scan_output_directions=[1])]
    model = _model(nodes, [_vi("acc0", F, [3]), _vi("x", F, ["seq", 3]), _vi("m0", F, [3]),
                           _vi("w", F, [3, "seq"])],
                   [_vi("acc", F, [3]), _vi("ys", F, ["seq", 3]), _vi("m", F, [3]),
                    _vi("os", F, [3, "seq"])],
                   {"two": np.array(2, np.float32)}, opset)
    seq = 5
    return model, {"acc0": _w(3, scale=1), "x": _w(seq, 3, scale=1), "m0": _w(3, scale=1),
                   "w": _w(3, seq, scale=1)}


def nested_if_in_loop(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """A Loop whose body holds an If on the iteration's parity (even: add the input,
    odd: multiply by an initializer), read by a scan output."""
    _reset()
    then_g = subgraph([helper.make_node("Add", ["s", "x"], ["t_out"])], "then", [],
                      [_vi("t_out", F, [4])])
    else_g = subgraph([helper.make_node("Mul", ["s", "k"], ["e_out"])], "else", [],
                      [_vi("e_out", F, [4])])
    body = _loop_body(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mod", ["i", "two"], ["parity"]),
         helper.make_node("Equal", ["parity", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["s_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Neg", ["s_out"], ["scan_out"])],
        [("s", F, [4])], [("s_out", F, [4]), ("scan_out", F, [4])])
    nodes = [_const("M", np.array(5, np.int64)), _const("T", np.array(True)),
             helper.make_node("Loop", ["M", "T", "s0"], ["s", "scans"], body=body)]
    model = _model(nodes, [_vi("s0", F, [4]), _vi("x", F, [4])],
                   [_vi("s", F, [4]), _vi("scans", F, [5, 4])],
                   {"k": np.array(-0.5, np.float32), "two": np.array(2, np.int64),
                    "zero": np.array(0, np.int64)}, opset)
    return model, {"s0": _w(4, scale=1), "x": _w(4, scale=1)}


def nested_loops(opset: int = 17) -> tuple[onnx.ModelProto, Feeds]:
    """A Loop whose body runs another Loop (three steps adding the outer state `a` to `b`)
    and swaps its two states (`a <- inner result`, `b <- a`, a value passed through), next
    to an If whose branches return an Identity of an input and a constant."""
    _reset()
    inner = subgraph(
        [helper.make_node("Identity", ["c2"], ["cond_out2"]),
         helper.make_node("Add", ["q", "a"], ["q_out"])],
        "inner", [_vi("j", I64, []), _vi("c2", B, []), _vi("q", F, [3])],
        [_vi("cond_out2", B, []), _vi("q_out", F, [3])])
    body = _loop_body(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         _const("three", np.array(3, np.int64)),
         helper.make_node("Loop", ["three", "", "b"], ["bb"], body=inner),
         helper.make_node("Identity", ["a"], ["a_same"])],
        [("a", F, [3]), ("b", F, [3])], [("bb", F, [3]), ("a_same", F, [3])])
    then_g = subgraph([helper.make_node("Identity", ["x"], ["xo"])], "t", [],
                      [_vi("xo", F, [3])])
    else_g = subgraph([_const("k", np.ones(3, np.float32))], "e", [],
                      [_vi("k", F, [3])])
    nodes = [helper.make_node("Loop", ["M", "", "x", "y"], ["fa", "fb"], body=body),
             helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)]
    model = _model(nodes, [_vi("M", I64, []), _vi("c", B, []), _vi("x", F, [3]),
                           _vi("y", F, [3])],
                   [_vi("fa", F, [3]), _vi("fb", F, [3]), _vi("z", F, [3])], {}, opset)
    return model, {"M": np.array(5, np.int64), "c": np.array(False), "x": _w(3, scale=1),
                   "y": _w(3, scale=1)}


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "if": if_model,
    "loop_static": loop_static,
    "loop_symbolic_trip_count": loop_symbolic,
    "loop_early_exit": loop_early_exit,
    "greedy_decode_scan": lambda: greedy_decode(True),
    "greedy_decode_until_eos": lambda: greedy_decode(False),
    "scan": scan_model,
    "nested_if_in_loop": nested_if_in_loop,
    "nested_loops": nested_loops,
}
