"""`bench/models.py --as-exported`: every model of the bench set with its axes dynamic,
as an exporter writes it, timed three ways in one process (issue 59).

Each model is built (bench/nets.py, bench/zoo_set.py) or exported by torch
(bench/hf_set.py, `dynamic_axes`) with its batch (and sequence) axes symbolic; the int8
models are that file quantized by onnxruntime's quantizer (`models.quantize`: QDQ or
QOperator for CNNs, `quantize_dynamic` for BERT; calibrated at batch 1), so they keep
the axes dynamic as a user's would. At every size of `--batches` x `--seqs` (a model
without a sequence axis runs at each batch only) three callables run on the same input:

- `dynamic`: `kiln.compile(from_onnx(model))`, what `kiln.InferenceSession(path)`
  compiles: no pins;
- `pinned`: the same file with `shape_dict` pinning every symbolic axis to the size;
- `ort`: onnxruntime on the file as it is.

Each runtime is called through its fastest public path (kiln's `prepare`, ort's
IOBinding; a kiln function whose results' sizes are known only after the call is
called plainly), timed in alternating blocks (bench/harness.py); the ratios are
medians of paired rounds (`harness.paired_ratio`); a dynamic build slower than
`SLOW_CALL_S` a call is timed by `SLOW_ROUNDS` rounds of one call of each, after one
untimed call of every runtime (the prepared calls' first touch of their buffers).
The goal of issue 59 is dynamic <= 1.05x pinned and <= 1.0x onnxruntime; the `goal`
column names the bound a row misses by more than 10% (the shared machine's noise). A
model kiln cannot compile or run as exported prints one `skipped` row with the reason.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block
from harness import (
    alternating_blocks,
    calls_within,
    describe_target,
    kiln_fastest_call,
    ort_bound_run,
    paired_ratio,
    pooled_ms,
    rel_l2,
    short_error,
)
from nets import Graph, symbolic_dims

import kiln
from kiln.frontend import from_onnx

Sizes = dict[str, int]
BATCH, SEQ = "batch", "seq"
#: The goal's bounds (dynamic/pinned, dynamic/ort) and the noise allowed before a row
#: is marked as missing them.
GOAL_PINNED, GOAL_ORT, NOISE = 1.05, 1.0, 1.10
#: A dynamic build whose first call takes longer (seconds) is timed by single calls
#: (`SLOW_ROUNDS`): blocks of calls would take minutes (the Whisper encoder at batch 8:
#: about 10 s a call), which keeps the full run near 20 minutes.
SLOW_CALL_S = 2.0
#: Rounds of one call each for such a build: a single call of each is one sample of a
#: loaded machine (a dynamic ConvNeXt or Whisper encoder at batch 8 read 2.2-2.5x its
#: pinned build from one call each, 0.9-1.1x over paired rounds); the ratio is the
#: median of the rounds' ratios.
SLOW_ROUNDS = 3


@dataclass(frozen=True)
class Case:
    """A bench model as exported: `build` gives the file with its axes symbolic and the
    inputs' shapes at batch 1 (`shapes`, the sequence axis at `seq_axis` when the model
    has one), `quant` the onnxruntime quantization applied to it ("" for float)."""

    build: Callable[[], tuple[onnx.ModelProto, dict[str, list[int]]]]
    seq_axes: dict[str, int] = field(default_factory=dict)  # input -> its sequence axis
    batch_axes: dict[str, int] = field(default_factory=dict)  # input -> its batch axis
    quant: str = ""


def _built(name: str, dims: dict[int, str]) -> Callable[[], tuple[onnx.ModelProto,
                                                                      dict[str, list[int]]]]:
    """Bench model `name` (bench/models.py's set) with axes `dims` symbolic."""
    def build() -> tuple[onnx.ModelProto, dict[str, list[int]]]:
        from models import MODELS  # cycle: bench/models.py runs this module's `main`

        model, shapes = MODELS[name]()
        return symbolic_dims(model, dims), shapes
    return build


def lstm() -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """bench/nets.py's tagger (a bidirectional LSTM, 128 -> 256, and a linear head) as an
    exporter writes it with sequence and batch dynamic: x `[seq, batch, 128]`, the
    head's Reshape by `[0, 0, -1]` instead of the pinned sizes."""
    g = Graph(7)
    inp, hid = 128, 256
    w, r = g.weight(2, 4 * hid, inp), g.weight(2, 4 * hid, hid)
    y = g.op("LSTM", "x", w, r, g.const(g.rng.normal(0, 0.1, (2, 8 * hid)), "b"),
             hidden_size=hid, direction="bidirectional")  # [seq, 2, batch, hid]
    y = g.op("Transpose", y, perm=[0, 2, 1, 3])
    y = g.op("Reshape", y, g.const(np.array([0, 0, 2 * hid], np.int64), "shape"))
    y = g.op("MatMul", y, g.weight(2 * hid, 10))
    model, _ = g.model("lstm", {"x": [SEQ, BATCH, inp]}, y, [SEQ, BATCH, 10])
    return model, {"x": [50, 1, inp]}


def _hf(name: str, axes: dict[str, dict[int, str]]) -> Callable[[], tuple[onnx.ModelProto,
                                                                            dict[str, list[int]]]]:
    """Hugging Face model `name` of bench/hf_set.py exported by torch with `axes` dynamic."""
    def build() -> tuple[onnx.ModelProto, dict[str, list[int]]]:
        import hf_export  # heavy: torch
        import hf_set  # heavy: torch and transformers
        import torch  # heavy: only the Hugging Face models need it

        make, feeds, exporter = hf_set.torch_model(name)
        torch.manual_seed(0)
        example = {k: torch.from_numpy(v) for k, v in feeds(np.random.default_rng(0)).items()}
        model = hf_export.export(make().eval(), example, axes, exporter)
        return model, {k: list(v.shape) for k, v in example.items()}
    return build


def _image(name: str, quant: str = "") -> Case:
    return Case(_built(name, {0: BATCH}), batch_axes={"": 0}, quant=quant)


def _tokens(name: str, inputs: tuple[str, ...], quant: str = "") -> Case:
    axes = {x: {0: BATCH, 1: SEQ} for x in inputs}
    build = _hf(name, axes) if name in ("distilbert",) else _built(name, {0: BATCH, 1: SEQ})
    return Case(build, seq_axes={x: 1 for x in inputs}, batch_axes={x: 0 for x in inputs},
                quant=quant)


#: The bench set as exported (issue 59's list), in the table's order.
CASES: dict[str, Case] = {
    **{n: _image(n) for n in ("resnet18", "mobilenetv2", "resnet50", "squeezenet",
                              "shufflenet", "inception", "densenet121", "efficientnet",
                              "vgg19", "vit")},
    "convnext": Case(_hf("convnext", {"pixel_values": {0: BATCH}}), batch_axes={"": 0}),
    "whisper_encoder": Case(_hf("whisper_encoder", {"input_features": {0: BATCH}}),
                            batch_axes={"": 0}),
    "bert": _tokens("bert", ("x",)),
    "gpt2": _tokens("gpt2", ("hidden",)),
    "distilbert": _tokens("distilbert", ("input_ids", "attention_mask")),
    "lstm": Case(lstm, seq_axes={"x": 0}, batch_axes={"x": 1}),
    "resnet50_int8": _image("resnet50", "QDQ"),
    "resnet50_qop": _image("resnet50", "QOperator"),
    "mobilenetv2_int8": _image("mobilenetv2", "QDQ"),
    "bert_int8": _tokens("bert", ("x",), "dynamic"),
}
#: A subset that runs in a few minutes on 2 cores (`--models quick`).
QUICK = ["resnet18", "mobilenetv2", "bert", "lstm", "resnet50_int8", "bert_int8"]


def size_grid(case: Case, batches: list[int], seqs: list[int]) -> list[Sizes]:
    """The sizes a case runs at: each batch, times each sequence length if it has one."""
    if not case.seq_axes:
        return [{BATCH: b} for b in batches]
    return [{BATCH: b, SEQ: s} for b in batches for s in seqs]


def feeds(model: onnx.ModelProto, case: Case, shapes: dict[str, list[int]], sizes: Sizes
          ) -> dict[str, np.ndarray]:
    """Inputs at `sizes`: standard-normal floats; token ids and a mask of ones for
    integer inputs."""
    rng = np.random.default_rng(42)
    out: dict[str, np.ndarray] = {}
    for v in model.graph.input:
        shape = list(shapes[v.name])
        for axes, dim in ((case.batch_axes, BATCH), (case.seq_axes, SEQ)):
            axis = axes.get(v.name, axes.get(""))
            if axis is not None and dim in sizes:
                shape[axis] = sizes[dim]
        if v.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out[v.name] = (np.ones(shape, np.int64) if "mask" in v.name
                           else rng.integers(2, 1000, shape).astype(np.int64))
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def load(name: str) -> tuple[onnx.ModelProto, Case, dict[str, list[int]]]:
    """The model file of `name` as exported (quantized for an int8 case)."""
    from models import quantize  # cycle: bench/models.py runs this module's `main`

    case = CASES[name]
    model, shapes = case.build()
    if case.quant:
        float_shapes = {x: s for x, s in shapes.items()}
        model = quantize(model, float_shapes, "QOperator" if case.quant == "QOperator"
                         else "QDQ")
    return model, case, shapes


def time_size(model: onnx.ModelProto, dynamic: Any, session: Any, feed: dict[str, np.ndarray],
              sizes: Sizes, target: kiln.target.Target, repeat: int, seconds: float
              ) -> dict[str, float]:
    """dynamic vs pinned (compiled here for `sizes`) vs ort on `feed`."""
    args = list(feed.values())
    pinned = kiln.compile(from_onnx(model, shape_dict=dict(sizes)), target)["main"]
    expected = session.run(None, feed)[0]
    start = time.perf_counter()
    actual = np.asarray(dynamic(*args))
    one_call = time.perf_counter() - start
    if actual.shape != expected.shape:
        raise ValueError(f"shape {actual.shape}, onnxruntime {expected.shape}")
    ort_outs = [np.empty_like(o) for o in session.run(None, feed)]
    fns = {"pinned": kiln_fastest_call(pinned, args),
           "dynamic": kiln_fastest_call(dynamic, args),
           "ort": ort_bound_run(session, feed, ort_outs)}
    if one_call > SLOW_CALL_S:  # a few single calls: blocks of calls would take minutes
        blocks = _one_call_rounds(fns)
    else:
        calls = calls_within(fns, repeat, seconds)
        blocks = alternating_blocks(fns, calls, rounds=max(3, min(calls // 2, 8)))
    ms = pooled_ms(blocks)
    return {**ms, "dyn/pin": paired_ratio(blocks["dynamic"], blocks["pinned"]),
            "dyn/ort": paired_ratio(blocks["dynamic"], blocks["ort"]),
            "rel_l2": rel_l2(actual, expected)}


def _one_call_rounds(fns: dict[str, Callable[[], object]]) -> dict[str, list[list[float]]]:
    """Seconds of one call of each function per round (`alternating_blocks`' form), in
    `SLOW_ROUNDS` rounds after one untimed call of each: every prepared call is warmed
    alike (the dynamic build's plain call above leaves its prepared call cold)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[list[float]]] = {name: [] for name in fns}
    for _ in range(SLOW_ROUNDS):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append([time.perf_counter() - start])
    return times


def goal_note(r: dict[str, float]) -> str:
    """'ok', or the goals (pinned, ort) the row misses by more than the noise."""
    missed = [what for what, ratio, bound in (("pinned", r["dyn/pin"], GOAL_PINNED),
                                              ("ort", r["dyn/ort"], GOAL_ORT))
              if ratio > bound * NOISE]
    return "far: " + ", ".join(missed) if missed else "ok"


def rows_of(name: str, target: kiln.target.Target, batches: list[int], seqs: list[int],
            repeat: int, seconds: float, ort_session: Callable[[onnx.ModelProto], Any]
            ) -> list[list[str]]:
    """The table rows of one model, printed as they come: one per size, or one
    `skipped` row when the model cannot be built or compiled as exported."""
    try:
        model, case, shapes = load(name)
        start = time.perf_counter()
        dynamic = kiln.compile(from_onnx(model), target)["main"]
        compile_s = time.perf_counter() - start
    except Exception as exc:  # a benchmark reports what fails and goes on
        return [_skipped(name, "", f"build/compile as exported: {short_error(exc)}")]
    session = ort_session(model)
    rows = []
    for sizes in size_grid(case, batches, seqs):
        label = ",".join(f"{k}={v}" for k, v in sizes.items())
        try:
            r = time_size(model, dynamic, session, feeds(model, case, shapes, sizes),
                          sizes, target, repeat, seconds)
        except Exception as exc:  # a benchmark reports what fails and goes on
            rows.append(_skipped(name, label, short_error(exc)))
            continue
        row = [name, label, f"{r['pinned']:.3f}", f"{r['dynamic']:.3f}", f"{r['ort']:.3f}",
               f"{r['dyn/pin']:.2f}x", f"{r['dyn/ort']:.2f}x", f"{r['rel_l2']:.0e}",
               goal_note(r)]
        print(f"{row[0]:<17} {row[1]:<15} {row[2]:>10} {row[3]:>10} {row[4]:>10} "
              f"{row[5]:>8} {row[6]:>8} {row[7]:>8}  {row[8]}   (dynamic compile "
              f"{compile_s:.1f} s)", flush=True)
        rows.append(row)
    return rows


def _skipped(name: str, label: str, why: str) -> list[str]:
    print(f"{name:<17} {label:<15} skipped: {why}", flush=True)
    return [name, label, "skipped: " + why.replace("|", "/"), "", "", "", "", "", ""]


COLUMNS = ["model", "sizes", "pinned ms", "dynamic ms", "ort ms", "dyn/pinned", "dyn/ort",
           "rel L2", "goal"]


def model_names(spec: str | None) -> list[str]:
    """`--models` for this mode: names of CASES, `quick` or `all` (default)."""
    names: list[str] = []
    for item in (spec or "all").split(","):
        for name in {"all": list(CASES), "quick": QUICK}.get(item, [item]):
            if name not in CASES:
                raise SystemExit(f"unknown model {name!r} for --as-exported; choose from "
                                 f"{', '.join([*CASES, 'quick', 'all'])}")
            if name not in names:
                names.append(name)
    return names


def run_all(args: Any, target: kiln.target.Target,
            ort_session: Callable[[onnx.ModelProto], Any]) -> None:
    """Print the table of `args.models` (and write it to docs/performance.md with
    `--write-docs`, block `as-exported`)."""
    from models import DOCS  # cycle: bench/models.py runs this module's `main`

    batches = [int(b) for b in args.batches.split(",")]
    seqs = [int(s) for s in args.seqs.split(",")]
    print(f"{'model':<17} {'sizes':<15} {'pinned ms':>10} {'dyn ms':>10} {'ort ms':>10} "
          f"{'dyn/pin':>8} {'dyn/ort':>8} {'rel L2':>8}  goal")
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    for name in model_names(args.models):
        rows += rows_of(name, target, batches, seqs, args.repeat, args.seconds, ort_session)
        if args.write_docs:  # after each model: a run cut short still leaves its rows
            command = " ".join(["bench/models.py", *sys.argv[1:]])
            block = "as-exported" if args.docs_block == "models" else args.docs_block
            write_block(DOCS / "performance.md", block, [
                machine_line(command, describe_target(target), load_before,
                             os.getloadavg()[0]), "", *markdown_table(COLUMNS, rows)])
