"""Differential fuzzing of kiln against onnxruntime on mutated small models (a tool
run by hand, not a test: docs/onnx.md, "Errors").

Each of `--count` mutants changes one or two integer attributes, integer initializer
elements, small float initializers (scales, bounds: 0, NaN, inf, huge) or input
dimensions of a small valid model. onnxruntime runs every mutant, then kiln compiles and
runs it against onnxruntime's outputs, each side in worker processes that a crash or a
hang costs only the mutant it was on (tests/support/processes.run_isolated). `--zero`
instead sets each input dimension of each model to 0 in turn (empty tensors).
`--models DIR` mutates the ONNX files of DIR instead (exporters' output: symbolic
dimensions run at 3, integer inputs hold 0 and 1).

    python bench/fuzz_onnx.py --count 500 --rng 1 [--quantized | --models DIR] [--target c] [--zero]

Prints every mutant where kiln crashed, hung, raised something other than a KilnError,
differed from onnxruntime, or where the two disagree on accepting it, then the counts.
Quantized models differ from onnxruntime by design on an x86 host without VNNI
(docs/quantization.md, "onnxruntime's AVX2 pairs"), so read their differences with that.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.graphs import GraphBuilder  # noqa: E402
from support.processes import run_isolated  # noqa: E402

F = TP.FLOAT
I64 = TP.INT64


def vi(name, shape, t=F):
    return h.make_tensor_value_info(name, t, shape)


def model(nodes, ins, outs, inits=(), opset=17):
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(list(inits))
    return b.model(ins, outs, opset=opset, check=False)


def c64(name, vals):
    return nh.from_array(np.asarray(vals, np.int64), name)


def cf(name, arr):
    return nh.from_array(np.asarray(arr, np.float32), name)


rng = np.random.default_rng(0)


def float_models() -> dict[str, onnx.ModelProto]:
    """Small graphs of shape-sensitive float ops."""
    out = {}
    x4 = vi("x", [1, 4, 7, 7])
    out["conv"] = model(
        [
            h.make_node(
                "Conv",
                ["x", "w", "b"],
                ["y"],
                pads=[1, 1, 1, 1],
                strides=[1, 1],
                dilations=[1, 1],
                group=1,
                kernel_shape=[3, 3],
            )
        ],
        [x4],
        [vi("y", None)],
        [cf("w", rng.standard_normal((8, 4, 3, 3))), cf("b", rng.standard_normal(8))],
    )
    out["conv_group"] = model(
        [h.make_node("Conv", ["x", "w"], ["y"], pads=[0, 1, 2, 1], strides=[2, 1], group=2)],
        [x4],
        [vi("y", None)],
        [cf("w", rng.standard_normal((6, 2, 3, 2)))],
    )
    out["convT"] = model(
        [
            h.make_node(
                "ConvTranspose",
                ["x", "w"],
                ["y"],
                pads=[1, 1, 1, 1],
                strides=[2, 2],
                output_padding=[1, 1],
            )
        ],
        [x4],
        [vi("y", None)],
        [cf("w", rng.standard_normal((4, 3, 3, 3)))],
    )
    out["maxpool"] = model(
        [
            h.make_node(
                "MaxPool",
                ["x"],
                ["y"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[2, 2],
                ceil_mode=1,
                dilations=[1, 1],
            )
        ],
        [x4],
        [vi("y", None)],
    )
    out["avgpool"] = model(
        [
            h.make_node(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[3, 2],
                pads=[1, 0, 1, 1],
                strides=[2, 1],
                count_include_pad=0,
                ceil_mode=0,
            )
        ],
        [x4],
        [vi("y", None)],
    )
    out["reshape"] = model(
        [h.make_node("Reshape", ["x", "s"], ["y"])], [x4], [vi("y", None)], [c64("s", [1, -1, 7])]
    )
    out["transpose"] = model(
        [h.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], [x4], [vi("y", None)]
    )
    out["slice"] = model(
        [h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
        [x4],
        [vi("y", None)],
        [c64("st", [1, -2]), c64("en", [4, 0]), c64("ax", [1, 3]), c64("sp", [2, -1])],
    )
    out["gather"] = model(
        [h.make_node("Gather", ["x", "i"], ["y"], axis=2)],
        [x4],
        [vi("y", None)],
        [c64("i", [[0, -1], [3, 2]])],
    )
    out["gather_el"] = model(
        [h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
        [vi("x", [3, 4])],
        [vi("y", None)],
        [c64("i", [[0, 3], [2, -1], [1, 1]])],
    )
    out["concat"] = model(
        [h.make_node("Concat", ["x", "x2"], ["y"], axis=1)],
        [x4, vi("x2", [1, 2, 7, 7])],
        [vi("y", None)],
    )
    out["split"] = model(
        [h.make_node("Split", ["x", "s"], ["y1", "y2"], axis=1)],
        [x4],
        [vi("y1", None), vi("y2", None)],
        [c64("s", [1, 3])],
    )
    out["pad"] = model(
        [h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
        [x4],
        [vi("y", None)],
        [c64("p", [0, 0, 2, 1, 0, 0, 1, 3])],
    )
    out["pad_edge"] = model(
        [h.make_node("Pad", ["x", "p", "v"], ["y"], mode="constant")],
        [x4],
        [vi("y", None)],
        [c64("p", [0, 1, -1, 2, 0, 0, 1, 0]), cf("v", 2.5)],
    )
    out["reduce"] = model(
        [h.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)],
        [x4],
        [vi("y", None)],
        [c64("a", [1, -1])],
    )
    out["reducemax"] = model(
        [h.make_node("ReduceMax", ["x"], ["y"], axes=[2], keepdims=1)], [x4], [vi("y", None)]
    )
    out["squeeze"] = model(
        [h.make_node("Squeeze", ["x", "a"], ["y"])],
        [vi("x", [1, 3, 1, 5])],
        [vi("y", None)],
        [c64("a", [0, 2])],
    )
    out["unsqueeze"] = model(
        [h.make_node("Unsqueeze", ["x", "a"], ["y"])],
        [vi("x", [3, 5])],
        [vi("y", None)],
        [c64("a", [0, -1])],
    )
    out["expand"] = model(
        [h.make_node("Expand", ["x", "s"], ["y"])],
        [vi("x", [3, 1])],
        [vi("y", None)],
        [c64("s", [2, 3, 4])],
    )
    out["tile"] = model(
        [h.make_node("Tile", ["x", "r"], ["y"])],
        [vi("x", [2, 3])],
        [vi("y", None)],
        [c64("r", [2, 3])],
    )
    out["flatten"] = model([h.make_node("Flatten", ["x"], ["y"], axis=2)], [x4], [vi("y", None)])
    out["softmax"] = model([h.make_node("Softmax", ["x"], ["y"], axis=-2)], [x4], [vi("y", None)])
    out["logsoftmax"] = model(
        [h.make_node("LogSoftmax", ["x"], ["y"], axis=1)], [x4], [vi("y", None)]
    )
    out["layernorm"] = model(
        [h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
        [vi("x", [2, 3, 8])],
        [vi("y", None)],
        [cf("g", rng.standard_normal(8)), cf("b", rng.standard_normal(8))],
    )
    out["gemm"] = model(
        [h.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=0, alpha=0.5, beta=2.0)],
        [vi("a", [5, 3])],
        [vi("y", None)],
        [cf("b", rng.standard_normal((5, 4))), cf("c", rng.standard_normal(4))],
    )
    out["matmul"] = model(
        [h.make_node("MatMul", ["a", "b"], ["y"])],
        [vi("a", [2, 1, 3, 5]), vi("b", [4, 5, 6])],
        [vi("y", None)],
    )
    out["depth2space"] = model(
        [h.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")],
        [vi("x", [1, 8, 3, 3])],
        [vi("y", None)],
    )
    out["space2depth"] = model(
        [h.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)],
        [vi("x", [1, 2, 4, 6])],
        [vi("y", None)],
    )
    out["resize"] = model(
        [
            h.make_node(
                "Resize",
                ["x", "", "sc"],
                ["y"],
                mode="linear",
                coordinate_transformation_mode="half_pixel",
            )
        ],
        [x4],
        [vi("y", None)],
        [cf("sc", [1, 1, 2.0, 1.5])],
    )
    out["resize_sizes"] = model(
        [h.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest", nearest_mode="floor")],
        [x4],
        [vi("y", None)],
        [c64("sz", [1, 4, 5, 11])],
    )
    out["topk"] = model(
        [h.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=1)],
        [vi("x", [3, 6])],
        [vi("v", None), vi("i", None, I64)],
        [c64("k", [3])],
    )
    out["cumsum"] = model(
        [h.make_node("CumSum", ["x", "a"], ["y"], exclusive=1, reverse=1)],
        [vi("x", [3, 6])],
        [vi("y", None)],
        [c64("a", 1)],
    )
    out["onehot"] = model(
        [h.make_node("OneHot", ["i", "d", "v"], ["y"], axis=-1)],
        [vi("x", [1])],
        [vi("y", None)],
        [c64("i", [0, 2, -1, 4]), c64("d", [5]), cf("v", [0.0, 1.0])],
    )
    out["scatternd"] = model(
        [h.make_node("ScatterND", ["x", "i", "u"], ["y"])],
        [vi("x", [4, 3])],
        [vi("y", None)],
        [c64("i", [[1], [3]]), cf("u", rng.standard_normal((2, 3)))],
    )
    out["scatter_el"] = model(
        [h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)],
        [vi("x", [3, 4])],
        [vi("y", None)],
        [c64("i", [[0, 3], [2, -1], [1, 1]]), cf("u", rng.standard_normal((3, 2)))],
    )
    out["range"] = model(
        [
            h.make_node("Range", ["s", "l", "d"], ["r"]),
            h.make_node("Cast", ["r"], ["rf"], to=F),
            h.make_node("Add", ["x", "rf"], ["y"]),
        ],
        [vi("x", [5])],
        [vi("y", None)],
        [c64("s", 2), c64("l", 12), c64("d", 2)],
    )
    out["cos"] = model(
        [
            h.make_node("ConstantOfShape", ["s"], ["c"], value=h.make_tensor("v", F, [1], [1.5])),
            h.make_node("Mul", ["x", "c"], ["y"]),
        ],
        [vi("x", [2, 3])],
        [vi("y", None)],
        [c64("s", [2, 3])],
    )
    out["einsum"] = model(
        [h.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")],
        [vi("a", [2, 3, 4]), vi("b", [2, 4, 5])],
        [vi("y", None)],
    )
    out["lrn"] = model(
        [h.make_node("LRN", ["x"], ["y"], size=3, alpha=1e-3, beta=0.75, bias=1.0)],
        [x4],
        [vi("y", None)],
    )
    out["globalpool"] = model(
        [h.make_node("GlobalAveragePool", ["x"], ["y"])], [x4], [vi("y", None)]
    )
    out["argmax"] = model(
        [h.make_node("ArgMax", ["x"], ["y"], axis=2, keepdims=0, select_last_index=1)],
        [x4],
        [vi("y", None, I64)],
    )
    out["shape_slice"] = model(
        [
            h.make_node("Shape", ["x"], ["s"], start=1, end=-1),
            h.make_node("Cast", ["s"], ["sf"], to=F),
            h.make_node("ReduceSum", ["sf"], ["y"], keepdims=1),
        ],
        [x4],
        [vi("y", None)],
    )
    out["instnorm"] = model(
        [h.make_node("InstanceNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)],
        [x4],
        [vi("y", None)],
        [cf("g", rng.standard_normal(4)), cf("b", rng.standard_normal(4))],
    )
    out["batchnorm"] = model(
        [h.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])],
        [x4],
        [vi("y", None)],
        [
            cf("g", rng.standard_normal(4)),
            cf("b", rng.standard_normal(4)),
            cf("m", rng.standard_normal(4)),
            cf("v", rng.random(4) + 0.5),
        ],
    )
    out["where"] = model(
        [h.make_node("Greater", ["x", "t"], ["c"]), h.make_node("Where", ["c", "x", "z"], ["y"])],
        [vi("x", [2, 5])],
        [vi("y", None)],
        [cf("t", 0.1), cf("z", rng.standard_normal((1, 5)))],
    )
    out["clip"] = model(
        [h.make_node("Clip", ["x", "lo", "hi"], ["y"])],
        [vi("x", [2, 5])],
        [vi("y", None)],
        [cf("lo", -0.5), cf("hi", 0.7)],
    )
    out["gathernd"] = model(
        [h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
        [vi("x", [2, 3, 4])],
        [vi("y", None)],
        [c64("i", [[[1], [2]], [[0], [-1]]])],
    )
    out["trilu"] = model(
        [h.make_node("Trilu", ["x", "k"], ["y"], upper=0)],
        [vi("x", [4, 5])],
        [vi("y", None)],
        [c64("k", 1)],
    )
    out["compress"] = model(
        [h.make_node("Compress", ["x", "c"], ["y"], axis=1)],
        [vi("x", [3, 4])],
        [vi("y", None)],
        [nh.from_array(np.array([True, False, True, True]), "c")],
    )
    out["lstm"] = model(
        [h.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=3, direction="bidirectional")],
        [vi("x", [4, 2, 5])],
        [vi("y", None)],
        [
            cf("w", rng.standard_normal((2, 12, 5)) * 0.3),
            cf("r", rng.standard_normal((2, 12, 3)) * 0.3),
        ],
    )
    return out


def quantized_models() -> dict[str, onnx.ModelProto]:
    """Small QDQ, QOperator and integer graphs."""
    out = {}

    def u8(name, vals):
        return nh.from_array(np.asarray(vals, np.uint8), name)

    def i8(name, vals):
        return nh.from_array(np.asarray(vals, np.int8), name)

    x4 = vi("x", [1, 4, 6, 6])
    w = rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8)
    out["qdq_conv"] = model(
        [
            h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
            h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
            h.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
            h.make_node("Relu", ["c"], ["r"]),
            h.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
            h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
        ],
        [x4],
        [vi("y", None)],
        [
            cf("xs", 0.02),
            u8("xz", 128),
            i8("wq", w),
            cf("ws", rng.random(8) * 0.01 + 0.001),
            i8("wz", np.zeros(8)),
            cf("ys", 0.05),
            u8("yz", 3),
        ],
    )
    out["qlinearconv"] = model(
        [
            h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            h.make_node(
                "QLinearConv",
                ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz", "b"],
                ["yq"],
                pads=[1, 1, 1, 1],
                strides=[1, 1],
            ),
            h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
        ],
        [x4],
        [vi("y", None)],
        [
            cf("xs", 0.02),
            u8("xz", 120),
            i8("wq", w),
            cf("ws", rng.random(8) * 0.01 + 0.001),
            i8("wz", np.zeros(8)),
            cf("ys", 0.05),
            u8("yz", 10),
            nh.from_array(rng.integers(-500, 500, 8).astype(np.int32), "b"),
        ],
    )
    out["qlinearmatmul"] = model(
        [
            h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            h.make_node("QLinearMatMul", ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz"], ["yq"]),
            h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
        ],
        [vi("x", [3, 16])],
        [vi("y", None)],
        [
            cf("xs", 0.02),
            u8("xz", 120),
            i8("wq", rng.integers(-100, 100, (16, 5))),
            cf("ws", 0.01),
            i8("wz", 0),
            cf("ys", 0.05),
            u8("yz", 10),
        ],
    )
    out["matmulinteger"] = model(
        [
            h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            h.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"]),
            h.make_node("Cast", ["acc"], ["accf"], to=F),
            h.make_node("Mul", ["xs", "ws"], ["s"]),
            h.make_node("Mul", ["accf", "s"], ["y"]),
        ],
        [vi("x", [3, 16])],
        [vi("y", None)],
        [i8("wq", rng.integers(-100, 100, (16, 5))), i8("wz", 0), cf("ws", 0.01)],
    )
    out["convinteger"] = model(
        [
            h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            h.make_node(
                "ConvInteger", ["xq", "wq", "xz", "wz"], ["acc"], pads=[0, 1, 1, 0], strides=[2, 1]
            ),
            h.make_node("Cast", ["acc"], ["y"], to=F),
        ],
        [x4],
        [vi("y", None)],
        [
            cf("xs", 0.02),
            u8("xz", 120),
            nh.from_array(rng.integers(0, 255, (8, 4, 3, 3)).astype(np.uint8), "wq"),
            u8("wz", 128),
        ],
    )
    return out


def values(v: int, r: np.random.Generator) -> list[int]:
    """What an integer becomes: its neighbours, 0, -1, its negation, three times it,
    huge values and a small random one, clamped to int64."""
    near = [v - 1, v + 1, v - 2, v + 2, 0, -1, -v, v * 3, 2**31, -(2**63), 2**62,
            int(r.integers(-9, 10))]
    return [max(-(2**63), min(2**63 - 1, x)) for x in near]


def sites(m: onnx.ModelProto) -> list[tuple[str, int, int, int | None]]:
    """Every place `mutate` may change: (kind, index, index, element)."""
    s: list[tuple[str, int, int, int | None]] = []
    for ni, n in enumerate(m.graph.node):
        for ai, a in enumerate(n.attribute):
            if a.type == AttributeProto.INT:
                s.append(("attr", ni, ai, None))
            elif a.type == AttributeProto.INTS:
                for k in range(len(a.ints)):
                    s.append(("attr", ni, ai, k))
    for ii, t in enumerate(m.graph.initializer):
        if t.data_type == onnx.TensorProto.INT64:
            for k in range(max(1, int(np.prod(t.dims)) if len(t.dims) else 1)):
                s.append(("init", ii, k, None))
        elif t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) <= 8:
            s.append(("finit", ii, 0, None))
        elif t.data_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8, onnx.TensorProto.INT32):
            s.append(("qinit", ii, 0, None))
    for gi, v in enumerate(m.graph.input):
        for k in range(len(v.type.tensor_type.shape.dim)):
            s.append(("dim", gi, k, None))
    return s


def mutate(m: onnx.ModelProto, r: np.random.Generator) -> onnx.ModelProto:
    """A copy of `m` with one or two of its `sites` changed."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    ss = sites(m2)
    for _ in range(int(r.integers(1, 3))):
        kind, a, b, c = ss[int(r.integers(len(ss)))]
        if kind == "attr":
            at = m2.graph.node[a].attribute[b]
            if c is None:
                at.i = int(r.choice(values(at.i, r)))
            else:
                at.ints[c] = int(r.choice(values(at.ints[c], r)))
        elif kind == "init":
            t = m2.graph.initializer[a]
            arr = nh.to_array(t).copy()
            flat = arr.reshape(-1)
            flat[b] = int(r.choice(values(int(flat[b]), r)))
            m2.graph.initializer[a].CopyFrom(nh.from_array(flat.reshape(arr.shape), t.name))
        elif kind in ("finit", "qinit"):
            t = m2.graph.initializer[a]
            arr = nh.to_array(t).copy()
            flat = arr.reshape(-1)
            k = int(r.integers(flat.size))
            if kind == "finit":
                flat[k] = r.choice([0.0, -flat[k], np.nan, np.inf, 1e-45, 1e30, flat[k] * 1000])
            else:
                info = np.iinfo(flat.dtype)
                flat[k] = r.choice([info.min, info.max, 0, 1])
            m2.graph.initializer[a].CopyFrom(nh.from_array(flat.reshape(arr.shape), t.name))
        else:
            d = m2.graph.input[a].type.tensor_type.shape.dim[b]
            d.dim_value = int(
                r.choice([max(0, d.dim_value - 1), d.dim_value + 1, 1, 0, d.dim_value * 2])
            )
    return m2


ORT = r"""
import json, sys, zlib
import numpy as np, onnx, onnxruntime as ort
item_s = float(sys.argv[1])
for p in sys.argv[2:]:
    watch(item_s)
    try:
        m = onnx.load(p)
        r = np.random.default_rng(zlib.crc32(p.encode()))
        feeds = {}
        for v in m.graph.input:
            tt = v.type.tensor_type
            # a named (symbolic) dimension runs at 3; integer inputs (token ids, masks)
            # are drawn from {0, 1}, valid ids for any vocabulary
            shape = [d.dim_value if d.HasField("dim_value") else 3 for d in tt.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            if dtype.kind in "iub":
                feeds[v.name] = r.integers(0, 2, shape).astype(dtype)
            else:
                feeds[v.name] = r.standard_normal(shape).astype(dtype)
        so = ort.SessionOptions()
        so.log_severity_level = 4
        outs = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        np.savez(p + ".ort.npz", *outs, **{"feed_" + k: v for k, v in feeds.items()})
        res = ["ok"]
    except Exception as e:
        res = ["err", type(e).__name__, str(e)[:200]]
    unwatch()
    print(json.dumps([p, *res]), flush=True)
"""

KILN = r"""
import json, sys, os
import numpy as np, onnx
import kiln
from kiln.errors import KilnError
item_s = float(sys.argv[1])
target = os.environ.get("FUZZ_TARGET", "llvm")
# FUZZ_REL_L2: compare by relative L2 ("equal" < 1e-6, "close" below the bound)
rel_l2_bound = float(os.environ.get("FUZZ_REL_L2", "0"))
for p in sys.argv[2:]:
    watch(item_s)
    try:
        ref = np.load(p + ".ort.npz") if os.path.exists(p + ".ort.npz") else None
        m = onnx.load(p)
        mod = kiln.frontend.from_onnx(m)
        ex = kiln.compile(mod, target)
        feeds = [ref["feed_" + v.name] for v in m.graph.input] if ref is not None else None
        if feeds is None:
            res = ["kiln-ok-ort-err"]
        else:
            out = ex.jit()["main"](*feeds)
            out = out if isinstance(out, tuple) else (out,)
            bad, worst = [], 0.0
            for k, o in enumerate(out):
                o = np.asarray(o); e = ref[f"arr_{k}"]
                if o.shape != e.shape:
                    bad.append(f"out{k} shape {o.shape} vs {e.shape}")
                elif rel_l2_bound:  # quantized models: the relative L2 of every output
                    d = o.astype(np.float64) - e
                    worst = max(worst, float(np.linalg.norm(d) / max(np.linalg.norm(e), 1e-30)))
                elif not np.allclose(o, e, rtol=1e-4, atol=1e-5, equal_nan=True):
                    bad.append(f"out{k} maxdiff {np.max(np.abs(o.astype(np.float64) - e)):.3g}")
            if rel_l2_bound and not bad:
                res = ["equal" if worst < 1e-6 else "close" if worst < rel_l2_bound
                       else "differ", worst]
            else:
                res = ["differ", *bad] if bad else ["equal"]
    except KilnError as e:
        res = ["kiln-error", type(e).__name__, str(e)[:240]]
    except Exception as e:
        res = ["OTHER", type(e).__name__, str(e)[:300]]
    unwatch()
    print(json.dumps([p, *res]), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="mutants to try")
    parser.add_argument("--rng", type=int, default=1, help="the mutations' random seed")
    parser.add_argument("--quantized", action="store_true", help="mutate the int8 models")
    parser.add_argument(
        "--zero",
        action="store_true",
        help="each input dimension set to 0 in turn, no random mutants",
    )
    parser.add_argument("--target", default="llvm", help="kiln target")
    parser.add_argument("--models", type=Path, metavar="DIR",
                        help="mutate every .onnx file in DIR (exporters' output, say) "
                             "instead of the built-in models")
    args = parser.parse_args()
    if args.models:
        models = {p.stem: onnx.load(p) for p in sorted(args.models.glob("*.onnx"))}
        if not models:
            parser.error(f"no .onnx file in {args.models}")
    else:
        models = quantized_models() if args.quantized else float_models()
    out = Path(tempfile.mkdtemp(prefix="kiln-fuzz-"))
    rng = np.random.default_rng(args.rng)
    items: list[Path] = []
    names = sorted(models)
    if args.zero:
        for name in names:
            for gi, v in enumerate(models[name].graph.input):
                for k in range(len(v.type.tensor_type.shape.dim)):
                    m = onnx.ModelProto()
                    m.CopyFrom(models[name])
                    m.graph.input[gi].type.tensor_type.shape.dim[k].dim_value = 0
                    items.append(out / f"z{len(items):04d}_{name}.onnx")
                    onnx.save(m, items[-1])
    else:
        for i in range(args.count):
            name = names[i % len(names)]
            items.append(out / f"{args.rng}_{i:04d}_{name}.onnx")
            onnx.save(mutate(models[name], rng), items[-1])
    ort_res = run_isolated(ORT, [], items, batch=50, item_s=20, batch_s=600)
    os.environ["FUZZ_TARGET"] = args.target
    os.environ["MALLOC_CHECK_"] = "3"  # heap damage aborts the worker at once
    kiln_res = run_isolated(KILN, [], items, batch=25, item_s=60, batch_s=900)
    counts: Counter[tuple[str, str]] = Counter()
    for p in items:
        o, k = ort_res.get(p, ["?"]), kiln_res.get(p, ["?"])
        counts[(o[0], k[0])] += 1
        if (o[0], k[0]) not in (("ok", "equal"), ("err", "kiln-error")):
            print(p.name, "onnxruntime:", o, "kiln:", k)
    print(f"mutants in {out}")
    for (o, k), n in sorted(counts.items()):
        print(f"{n:5d}  onnxruntime {o:8s} kiln {k}")


if __name__ == "__main__":
    main()
