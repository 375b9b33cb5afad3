"""onnxruntime's quantizer options against kiln (a tool run by hand, not a test:
docs/quantization.md, "The quantizer's options").

Each small model of bench/nets.py named in `--models` is quantized by onnxruntime's
`quantize_static` under every combination of the options users set (format, per
channel, activation and weight types, `reduce_range`, the `extra_options` that change
the graph) and by `quantize_dynamic` under its options, including the operator types
it quantizes beyond MatMul (Conv, LSTM, Gather, ...). onnxruntime runs each file, then
kiln compiles and runs it (target `--target`, default `host`: this machine's CPU, as
onnxruntime's float kernels follow it, with `int8-pairs=saturate` where this host's
onnxruntime saturates its integer products, support.reference.like_onnxruntime), each
side in worker processes that a crash or a hang costs only the file it was on
(tests/support/processes).

    python bench/quant_options.py [--models cnn,resnet,encoder,lstm] [--target T] [--limit N]

Prints each file where kiln crashed, hung, raised something other than a KilnError,
refused what onnxruntime ran, or whose outputs are further from onnxruntime's than the
issue's bound (relative L2 1e-2), then the counts per outcome and per refusal message.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from fuzz_onnx import KILN, ORT  # noqa: E402  (the workers: onnxruntime's, then kiln's)

import kiln  # noqa: E402
from support.processes import run_isolated  # noqa: E402
from support.reference import like_onnxruntime  # noqa: E402

#: The dequantized outputs' bound (issue's acceptance: rel. L2 < 1e-2 vs onnxruntime).
MAX_REL_L2 = 1e-2

STATIC_AXES: dict[str, list[Any]] = {
    "format": ["QDQ", "QOperator"],
    "per_channel": [True, False],
    "activation": ["QUInt8", "QInt8"],
    "weight": ["QInt8", "QUInt8"],
    "reduce_range": [False, True],
    "extra": [{}, {"ActivationSymmetric": True}, {"WeightSymmetric": False},
              {"AddQDQPairToWeight": True}, {"DedicatedQDQPair": True},
              {"QDQKeepRemovableActivations": True}, {"ForceQuantizeNoInputCheck": True},
              {"QuantizeBias": False}, {"EnableSubgraph": True}],
}
DYNAMIC_AXES: dict[str, list[Any]] = {
    "per_channel": [False, True],
    "weight": ["QInt8", "QUInt8"],
    "reduce_range": [False, True],
    "ops": [None, ["MatMul", "Gemm", "Conv", "LSTM", "Gather", "Attention",
                   "EmbedLayerNormalization"]],
    "extra": [{}, {"MatMulConstBOnly": True}, {"ActivationSymmetric": True},
              {"WeightSymmetric": False}],
}


def lstm_model() -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """A one-layer LSTM (seq 5, batch 1, 16 -> 32) and a MatMul on its output."""
    rng = np.random.default_rng(3)
    seq, inp, hid = 5, 16, 32
    inits = [helper.make_tensor(n, TP.FLOAT, a.shape, a.ravel()) for n, a in (
        ("W", rng.standard_normal((1, 4 * hid, inp)).astype(np.float32) * 0.2),
        ("R", rng.standard_normal((1, 4 * hid, hid)).astype(np.float32) * 0.2),
        ("B", rng.standard_normal((1, 8 * hid)).astype(np.float32) * 0.1),
        ("P", rng.standard_normal((hid, 10)).astype(np.float32) * 0.2))]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=hid),
             helper.make_node("Squeeze", ["yh", "ax"], ["h"]),
             helper.make_node("MatMul", ["h", "P"], ["out"])]
    inits.append(helper.make_tensor("ax", TP.INT64, [1], [0]))
    g = helper.make_graph(nodes, "lstm",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [seq, 1, inp])],
                          [helper.make_tensor_value_info("out", TP.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {"x": [seq, 1, inp]}


def models(names: list[str]) -> dict[str, onnx.ModelProto]:
    from nets import MODELS

    builders = {**MODELS, "lstm": lstm_model}  # each gives (model, input shapes)
    return {name: builders[name]()[0] for name in names}


class Reader(CalibrationDataReader):
    """Four batches of standard-normal inputs (onnxruntime's CalibrationDataReader)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        rng = np.random.default_rng(0)
        shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
                  for vi in model.graph.input}
        self.batches = iter([{n: rng.standard_normal(s).astype(np.float32)
                              for n, s in shapes.items()} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def quantize_all(name: str, model: onnx.ModelProto, out: Path, limit: int) -> list[Path]:
    """Every option combination's file for `model` in `out` (at most `limit` per kind)."""
    src, pre = out / f"{name}.float.onnx", out / f"{name}.pre.onnx"
    onnx.save(model, src)
    quant_pre_process(str(src), str(pre))
    files = []
    combos = list(itertools.product(*STATIC_AXES.values()))
    rng = np.random.default_rng(len(name))
    for k in rng.permutation(len(combos))[:limit]:
        fmt, per_channel, act, weight, reduce, extra = combos[k]
        path = out / f"{name}.s{k:03d}.onnx"
        try:
            quantize_static(str(pre), str(path), Reader(model),
                            quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
                            per_channel=per_channel, reduce_range=reduce,
                            activation_type=getattr(QuantType, act),
                            weight_type=getattr(QuantType, weight), extra_options=dict(extra))
        except Exception as e:  # the quantizer refuses some combinations itself
            print(f"{path.name}: quantizer refused ({type(e).__name__}: {str(e)[:80]})")
            continue
        path.with_suffix(".txt").write_text(repr(combos[k]))
        files.append(path)
    combos = list(itertools.product(*DYNAMIC_AXES.values()))
    for k in rng.permutation(len(combos))[:limit]:
        per_channel, weight, reduce, ops, extra = combos[k]
        path = out / f"{name}.d{k:03d}.onnx"
        try:
            quantize_dynamic(str(src), str(path), per_channel=per_channel, reduce_range=reduce,
                             weight_type=getattr(QuantType, weight), op_types_to_quantize=ops,
                             extra_options=dict(extra))
        except Exception as e:
            print(f"{path.name}: quantizer refused ({type(e).__name__}: {str(e)[:80]})")
            continue
        path.with_suffix(".txt").write_text(repr(combos[k]))
        files.append(path)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,resnet,encoder,lstm")
    parser.add_argument("--target", default="host")
    parser.add_argument("--limit", type=int, default=24,
                        help="option combinations per model and quantizer (drawn at random)")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="kiln-quant-options-"))
    items: list[Path] = []
    for name, model in models(args.models.split(",")).items():
        items += quantize_all(name, model, out, args.limit)
    ort_res = run_isolated(ORT, [], items, batch=40, item_s=30, batch_s=900)
    os.environ["FUZZ_TARGET"] = str(like_onnxruntime(kiln.Target.from_host())) \
        if args.target == "host" else args.target
    os.environ["FUZZ_REL_L2"] = str(MAX_REL_L2)
    kiln_res = run_isolated(KILN, [], items, batch=20, item_s=120, batch_s=1800)
    counts: Counter[tuple[str, str]] = Counter()
    refusals: Counter[str] = Counter()
    for p in items:
        o, k = ort_res.get(p, ["?"]), kiln_res.get(p, ["?"])
        counts[(o[0], k[0])] += 1
        if k[0] == "kiln-error":
            refusals[k[2].split(":")[0][:90] if len(k) > 2 else "?"] += 1
        if (o[0], k[0]) not in (("ok", "equal"), ("ok", "close"), ("err", "kiln-error")):
            print(p.name, p.with_suffix(".txt").read_text(), "onnxruntime:", o, "kiln:", k)
    print(f"files in {out}")
    for (o, k), n in sorted(counts.items()):
        print(f"{n:5d}  onnxruntime {o:8s} kiln {k}")
    for msg, n in refusals.most_common():
        print(f"{n:5d}  refused: {msg}")


if __name__ == "__main__":
    main()
