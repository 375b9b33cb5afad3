"""Model benchmark: kiln vs onnxruntime, batch 1, in one process.

    .venv/bin/python bench/models.py [--repeat 30] [--seconds 20] [--target llvm]
                                     [--mattr=-avx512f]
                                     [--models mlp,cnn | small | full | zoo | hf | all]
                                     [--threads 2] [--no-paced]
                                     [--call-path fast | plain]

With `--dynamic`, the table compares code compiled for symbolic dimensions
with code compiled for one static size, on the same model: the encoder with
symbolic `(batch, seq)` run at (1, 32) and (1, 128), ResNet-18 with a
symbolic batch run at batch 1, and ResNet-18, the small `resnet`, the `cnn` and
MobileNetV2 with a symbolic image height and width run at their own sizes. The
static build is the same ONNX file with `shape_dict` pinning the sizes; the goal is
dynamic/static <= 1.25.

The models (bench/nets.py, onnx.helper, deterministic weights): the small
`mlp`, `cnn` and `resnet` (the default set, `small`), and the full-size
`resnet18` and `mobilenetv2` (224x224), `encoder` (2 layers, width 256,
sequence 128), `bert` (BERT-base-like, 12 layers, width 768, sequence 128) and
`lstm` (a bidirectional LSTM, 128 -> 256, 50 steps, and a linear head), the set
`full`; `zoo` is the published architectures of tests/models/zoo.py at their
published sizes (ResNet-50, SqueezeNet, ShuffleNet, Inception, DenseNet-121,
EfficientNet-B0, VGG-19, GPT-2 small and ViT-B/16 at 12 layers; bench/zoo_set.py);
`hf` is Hugging Face `transformers` models at their published configurations
with random weights, exported with torch.onnx (DistilBERT at sequence 128,
ConvNeXt-Tiny at 224x224, the Whisper-base encoder at 30 s of audio, 3000 mel
frames; bench/hf_set.py; skipped without torch and transformers);
`all` is every set.

Each is imported with `kiln.frontend.from_onnx`, compiled with
`kiln.compile(mod, target)` (default: `Target.from_host()`; `--mattr` replaces
the target's features with changes to its CPU's own, so `--mattr=-avx512f` runs
the AVX2 path on an AVX-512 host) and timed against
onnxruntime (`intra_op_num_threads=2`) on the same input: compile time
(import + passes + codegen + link), the median of up to `--repeat` calls of
each (fewer when `--seconds` would not hold them; in alternating blocks of
calls: machine drift hits both alike, and neither runtime's spinning worker
threads slow the other's calls), the ratio kiln/ort (below 1: kiln is
faster; the median over rounds of two calls each of one round's ratio,
harness.paired_ratio) and the relative L2 error of kiln's output against ort's. Each runtime
is called through its fastest public path (`--call-path fast`, the default):
kiln's `fn.prepare(*args, out=...)` and ort's `run_with_iobinding`, the arrays
bound once; `--call-path plain` times `fn(*args)` against `session.run` (both
check the arguments and allocate the results on every call). The paced
columns are kiln/ort when each is called once every 2 ms and every 10 ms (median
of 200 calls, fewer when `--seconds` would not hold them; the caller sleeping in
between; a model slower than the period pauses that long after each call;
harness.paced_ms): the latency of a
server or a camera loop, where workers that went to sleep must be woken
(docs/runtime.md, "Threads"); `--no-paced` leaves them out. A model
kiln cannot compile or run prints one line `skipped: <reason>` and the run
goes on. Both runtimes use `--threads` threads (default 2: kiln through
`kiln.runtime.set_num_threads`, ort through `intra_op_num_threads`);
`--tensor-pipeline simplify` compiles without the
Parallelize pass (the "before" figures of docs/performance.md);
`--graph-pipeline nchwc` adds the blocked activation layout (nchwc-layout).
Prints a table; asserts nothing (this is not a test). `--write-docs` also writes
it into docs/performance.md, the block named by `--docs-block` (default `models`).

With `--int8`, each model is first quantized by onnxruntime's own quantizer
(`quantize_static`, QDQ, per-channel int8 weights, uint8 activations, calibrated
on random inputs; transformer models with `quantize_dynamic`) and the table
compares kiln's int8 build with onnxruntime's int8 run and kiln's float32 build
of the same model (docs/quantization.md). Its default set, `int8`: ResNet-50,
MobileNetV2, SqueezeNet, Inception, DenseNet-121 (the zoo set, bench/zoo_set.py),
the BERT-base-like encoder (dynamic quantization, sequence 128) and `resnet50_qop`,
ResNet-50 quantized to the QOperator form (QLinearConv, QLinearAdd, ...). Its compile
columns are CPU seconds (the C compiler included, the compile cache off) of the int8
build and their ratio to the float32 build's; the int8/ort and int8/fp32 ratios are
medians of paired rounds, as kiln/ort. `--cpu-time` times one thread's CPU time
per call (both runtimes on one thread, the best of 5 blocks) instead of the wall clock:
the figure a machine shared with other jobs barely moves.

With `--as-exported`, every model of the bench set (the CNN zoo, BERT, DistilBERT,
GPT-2, ViT, ConvNeXt, the Whisper encoder, the LSTM, and int8 ResNet-50 QDQ and
QOperator, MobileNetV2 and BERT from onnxruntime's quantizer) has its batch and
sequence axes dynamic, as exporters write them, and each is timed as exported (no
pins) against its pinned build (`shape_dict`) and onnxruntime at every size of
`--batches` x `--seqs` (default 1,8 x 16,128; `--seconds` defaults to 2 per size
here); `--models` takes its names, `quick` (a few-minute subset) or `all`
(bench/as_exported.py). `--write-docs` writes the block
`as-exported` of docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from doc_table import machine_line, markdown_table, write_block
from harness import (
    alternating_blocks,
    alternating_blocks_ms,
    calls_within,
    describe_target,
    ort_bound_run,
    ort_on_target_isa,
    paced_ms,
    paired_ratio,
    pooled_ms,
    rel_l2,
    short_error,
)
from hf_set import FEEDS, HF
from nets import FULL, MODELS, SMALL, symbolic_dims
from zoo_set import ZOO

import kiln
from kiln.frontend import from_onnx
from kiln.transform import PassContext

DOCS = Path(__file__).resolve().parents[1] / "docs"
MODELS = {**MODELS, **ZOO, **HF}
#: The int8 model set (issue 24); "_qop": the same model in onnxruntime's QOperator form.
INT8_SET = ["resnet50", "mobilenetv2", "squeezenet", "inception", "densenet121", "bert",
            "resnet50_qop"]
QOP = "_qop"
MODEL_SETS = {"small": list(SMALL), "full": list(FULL), "zoo": list(ZOO), "hf": list(HF),
              "all": list(MODELS), "int8": INT8_SET}


# Calls per paced measurement, and the periods (seconds) of the paced columns.
PACED_CALLS = 200
PACED_PERIODS = (0.002, 0.010)
ORT_THREADS = [2]  # set by --threads


def ort_session(model: onnx.ModelProto) -> Any:
    """An onnxruntime CPU session of `model` with ORT_THREADS intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = ORT_THREADS[0]
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


class Skipped(Exception):
    """kiln could not compile or run a model; the message says why."""


def build(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Model `name` and its inputs (standard-normal float32 unless bench/hf_set.py gives
    the model's own, e.g. token ids); Skipped when the model cannot be built here (the
    Hugging Face models without torch or transformers)."""
    try:
        model, shapes = MODELS[name]()
    except ImportError as exc:
        raise Skipped(f"build: {short_error(exc)}") from exc
    rng = np.random.default_rng(42)
    if name in FEEDS:
        return model, FEEDS[name](rng)
    return model, {x: rng.standard_normal(shape).astype(np.float32)
                   for x, shape in shapes.items()}


def run(name: str, target: kiln.target.Target, repeat: int, seconds: float,
        tensor_pipeline: str, graph_pipeline: str = "default",
        paced: bool = True, call_path: str = "fast") -> dict[str, float]:
    """Compile and time one model; raises Skipped when kiln fails on it."""
    model, feed = build(name)
    args = list(feed.values())

    start = time.perf_counter()
    try:
        ex = kiln.compile(from_onnx(model), target, graph_pipeline=graph_pipeline,
                          tensor_pipeline=tensor_pipeline)
        fn = ex["main"]  # links and loads the library
    except Exception as exc:  # a benchmark reports what fails and goes on
        raise Skipped(f"compile: {short_error(exc)}") from exc
    compile_s = time.perf_counter() - start

    session = ort_session(model)
    expected = session.run(None, feed)[0]
    try:
        actual = np.asarray(fn(*args))
    except Exception as exc:
        raise Skipped(f"run: {short_error(exc)}") from exc

    fns = call_paths(call_path, fn, args, session, feed)
    calls = calls_within(fns, repeat, seconds)
    # rounds of two calls each: the ratio is the median of the rounds' ratios
    blocks = alternating_blocks(fns, calls, rounds=max(5, calls // 2))
    ms = pooled_ms(blocks)
    kiln_ms, ort_ms = ms["kiln"], ms["ort"]
    result = {"compile_s": compile_s, "kiln_ms": kiln_ms, "ort_ms": ort_ms,
              "ratio": paired_ratio(blocks["kiln"], blocks["ort"]),
              "rel_l2": rel_l2(actual, expected),
              "calls": calls, "cache_hit": float(ex.cache_hit)}
    for period in PACED_PERIODS if paced else ():
        # up to PACED_CALLS, as many as `seconds` holds for both runtimes (at least 5)
        per_call = (kiln_ms + ort_ms) / 1e3 + 2 * period
        paced_times = paced_ms(fns, period, max(5, min(PACED_CALLS, int(seconds / per_call))))
        result[f"paced_{period * 1e3:g}ms"] = paced_times["kiln"] / paced_times["ort"]
    return result


def call_paths(path: str, fn: Any, args: list[np.ndarray], session: Any,
               feed: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    """The calls timed for kiln and ort: "fast", each runtime's fastest public call
    path, arrays bound once (kiln's `fn.prepare(*args, out=...)`, ort's IOBinding);
    "plain", each one's everyday call (`fn(*args)`, `session.run`), which also
    allocates the results and checks the arguments on every call."""
    if path == "plain":
        return {"kiln": lambda: fn(*args), "ort": lambda: session.run(None, feed)}
    ort_outs = [np.empty_like(o) for o in session.run(None, feed)]
    return {"kiln": fn.prepare(*args, out=fn(*args)),
            "ort": ort_bound_run(session, feed, ort_outs)}


def quantize(model: onnx.ModelProto, shapes: dict[str, list[int]], fmt: str = "QDQ"
             ) -> onnx.ModelProto:
    """`model` quantized by onnxruntime: static (`fmt` "QDQ" or "QOperator") for models
    with convolutions, dynamic for the others (transformers)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.feeds = iter([{n: rng.standard_normal(s).astype(np.float32)
                                for n, s in shapes.items()} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        # per-channel DequantizeLinear (its `axis`) is opset 13; the quantizer writes it
        # into the model's own opset, which the checker then refuses (SqueezeNet: 12)
        model = onnx.version_converter.convert_version(model, 13)
    with tempfile.TemporaryDirectory() as tmp:
        src, pre, out = (os.path.join(tmp, n) for n in ("f.onnx", "p.onnx", "q.onnx"))
        onnx.save(model, src)
        if any(n.op_type == "Conv" for n in model.graph.node):
            quant_pre_process(src, pre)
            quantize_static(pre, out, Reader(), quant_format=getattr(QuantFormat, fmt),
                            per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
        else:
            quantize_dynamic(src, out, weight_type=QuantType.QInt8)
        return onnx.load(out)


def cpu_seconds() -> float:
    """CPU seconds this process and its finished children (the C compiler) have used."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def thread_cpu_ms(fns: dict[str, Callable[[], object]], calls: int,
                  rounds: int = 5) -> dict[str, float]:
    """Milliseconds of the calling thread's CPU time per call of each function (the best
    of `rounds` blocks of `calls` calls): on a machine shared with other jobs, the
    one-thread figure the load barely moves (a wall clock counts the time the thread
    waits for a core)."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            start = time.thread_time()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / calls * 1e3)
    return best


def run_int8(name: str, target: kiln.target.Target, repeat: int, seconds: float,
             cpu_time: bool = False) -> dict[str, float]:
    """kiln int8 vs onnxruntime int8 vs kiln float32 on one model (Skipped on failure);
    with `cpu_time`, one thread's CPU time per call (`thread_cpu_ms`). The compile
    times are CPU seconds (the C compiler's included) of a build that skips the cache."""
    base = name.removesuffix(QOP)
    model, shapes = MODELS[base]()
    qmodel = quantize(model, shapes, "QOperator" if name.endswith(QOP) else "QDQ")
    rng = np.random.default_rng(42)
    feed = {x: rng.standard_normal(shape).astype(np.float32) for x, shape in shapes.items()}
    args = list(feed.values())
    compile_s: dict[str, float] = {}
    fns: dict[str, Callable[..., Any]] = {}
    try:
        with PassContext(config={"kiln.cache": False}):
            for kind, onnx_model in (("int8", qmodel), ("fp32", model)):
                start = cpu_seconds()
                fns[kind] = kiln.compile(from_onnx(onnx_model), target)["main"]
                compile_s[kind] = cpu_seconds() - start
        actual = np.asarray(fns["int8"](*args))
    except Exception as exc:  # a benchmark reports what fails and goes on
        raise Skipped(short_error(exc)) from exc
    session = ort_session(qmodel)
    expected = session.run(None, feed)[0]
    timed = {"int8": lambda: fns["int8"](*args), "ort": lambda: session.run(None, feed),
             "fp32": lambda: fns["fp32"](*args)}
    calls = calls_within(timed, repeat, seconds)
    if cpu_time:
        ms = thread_cpu_ms(timed, max(1, calls // 5))
        ratios = {"int8/ort": ms["int8"] / ms["ort"], "int8/fp32": ms["int8"] / ms["fp32"]}
    else:  # as `run`: the ratios are medians of paired rounds of two calls
        blocks = alternating_blocks(timed, calls, rounds=max(5, calls // 2))
        ms = pooled_ms(blocks)
        ratios = {"int8/ort": paired_ratio(blocks["int8"], blocks["ort"]),
                  "int8/fp32": paired_ratio(blocks["int8"], blocks["fp32"])}
    return {"compile_s": compile_s["int8"], "compile_ratio": compile_s["int8"] / compile_s[
        "fp32"], **ms, **ratios, "rel_l2": rel_l2(actual, expected), "calls": calls}


def print_int8(names: list[str], target: kiln.target.Target, repeat: int,
               seconds: float, cpu_time: bool = False) -> None:
    header = (f"{'model':<12} {'compile s':>9} {'c int/fp':>9} {'int8 ms':>9} {'ort ms':>9} "
              f"{'fp32 ms':>9} {'int8/ort':>9} {'int8/fp32':>9} {'rel L2':>9}")
    print(header)
    print("-" * len(header))
    for name in names:
        try:
            r = run_int8(name, target, repeat, seconds, cpu_time)
        except Skipped as exc:
            print(f"{name:<12} skipped: {exc}", flush=True)
            continue
        print(f"{name:<12} {r['compile_s']:>9.2f} {r['compile_ratio']:>9.2f} {r['int8']:>9.3f} "
              f"{r['ort']:>9.3f} {r['fp32']:>9.3f} {r['int8/ort']:>9.2f} "
              f"{r['int8/fp32']:>9.2f} {r['rel_l2']:>9.1e}", flush=True)


# (model, its symbolic dims by axis, the sizes to run at) for --dynamic
DYNAMIC_CASES = [
    ("encoder", {0: "batch", 1: "seq"}, {"batch": 1, "seq": 32}),
    ("encoder", {0: "batch", 1: "seq"}, {"batch": 1, "seq": 128}),
    ("resnet18", {0: "batch"}, {"batch": 1}),
    ("resnet18", {2: "height", 3: "width"}, {"height": 224, "width": 224}),
    ("resnet", {2: "height", 3: "width"}, {"height": 32, "width": 32}),
    ("cnn", {2: "height", 3: "width"}, {"height": 64, "width": 64}),
    ("mobilenetv2", {2: "height", 3: "width"}, {"height": 224, "width": 224}),
]


def run_dynamic(name: str, dims: dict[int, str], sizes: dict[str, int],
                target: kiln.target.Target, repeat: int, seconds: float) -> dict[str, float]:
    """Time code compiled for symbolic dims against code compiled for `sizes`, and ort."""
    model, shapes = MODELS[name]()
    model = symbolic_dims(model, dims)
    rng = np.random.default_rng(42)
    feed = {}
    for x, shape in shapes.items():
        shape = [sizes[dims[k]] if k in dims else n for k, n in enumerate(shape)]
        feed[x] = rng.standard_normal(shape).astype(np.float32)
    args = list(feed.values())
    try:
        static = kiln.compile(from_onnx(model, shape_dict=dict(sizes)), target)["main"]
        dynamic = kiln.compile(from_onnx(model), target)["main"]
        actual = np.asarray(dynamic(*args))
    except Exception as exc:  # a benchmark reports what fails and goes on
        raise Skipped(short_error(exc)) from exc
    session = ort_session(model)
    expected = session.run(None, feed)[0]
    fns = {"static": lambda: static(*args), "dynamic": lambda: dynamic(*args),
           "ort": lambda: session.run(None, feed)}
    ms = alternating_blocks_ms(fns, calls_within(fns, repeat, seconds))
    return {"static_ms": ms["static"], "dynamic_ms": ms["dynamic"], "ort_ms": ms["ort"],
            "ratio": ms["dynamic"] / ms["static"], "rel_l2": rel_l2(actual, expected)}


def print_dynamic(target: kiln.target.Target, repeat: int, seconds: float) -> None:
    header = (f"{'model':<10} {'sizes':<18} {'static ms':>9} {'dyn ms':>9} {'dyn/stat':>8} "
              f"{'ort ms':>9} {'rel L2':>9}")
    print(header)
    print("-" * len(header))
    for name, dims, sizes in DYNAMIC_CASES:
        label = ",".join(f"{k}={v}" for k, v in sizes.items())
        try:
            r = run_dynamic(name, dims, sizes, target, repeat, seconds)
        except Skipped as exc:
            print(f"{name:<10} {label:<18} skipped: {exc}", flush=True)
            continue
        print(f"{name:<10} {label:<18} {r['static_ms']:>9.3f} {r['dynamic_ms']:>9.3f} "
              f"{r['ratio']:>8.2f} {r['ort_ms']:>9.3f} {r['rel_l2']:>9.1e}", flush=True)


def model_names(spec: str) -> list[str]:
    """Model names from a comma-separated list of names and set names."""
    names: list[str] = []
    for item in spec.split(","):
        for name in MODEL_SETS.get(item, [item]):
            if name.removesuffix(QOP) not in MODELS:
                raise SystemExit(f"unknown model {name!r}; choose from "
                                 f"{', '.join([*MODELS, *MODEL_SETS])}")
            if name not in names:
                names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="most timed calls per runtime")
    parser.add_argument("--seconds", type=float, default=None,
                        help="time budget per model for the timed calls (both runtimes; "
                             "default 20, with --as-exported 2 per size)")
    parser.add_argument("--target", default=None, help="kiln target (default: this host)")
    parser.add_argument("--mattr", default=None,
                        help="the target's LLVM features instead of its own, comma-separated "
                             "changes to its CPU's (mcpu) set, e.g. '-avx512f': the AVX2 path "
                             "on an AVX-512 host")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated names ({', '.join(MODELS)}) or sets "
                             f"({', '.join(MODEL_SETS)}); default: small (int8 with --int8)")
    parser.add_argument("--graph-pipeline", default="default",
                        help="kiln's graph pipeline, e.g. 'nchwc' (blocked activation layout)")
    parser.add_argument("--tensor-pipeline", default="default",
                        help="kiln's tensor pipeline, e.g. 'simplify' (no parallel loops)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of kiln's parallel loops and of ort (default 2)")
    parser.add_argument("--call-path", choices=("fast", "plain"), default="fast",
                        help="fast (default): each runtime's fastest public call, arrays "
                             "bound once (kiln's prepare(), ort's IOBinding); plain: "
                             "fn(*args) against session.run")
    parser.add_argument("--no-paced", action="store_true",
                        help="leave out the paced columns (a call every 2 ms and 10 ms)")
    parser.add_argument("--dynamic", action="store_true",
                        help="compare symbolic-shape builds with static ones instead")
    parser.add_argument("--as-exported", action="store_true",
                        help="the bench set with its axes dynamic: as exported vs pinned vs "
                             "ort (bench/as_exported.py)")
    parser.add_argument("--batches", default="1,8", help="with --as-exported: the batch sizes")
    parser.add_argument("--seqs", default="16,128",
                        help="with --as-exported: the sequence lengths")
    parser.add_argument("--write-docs", action="store_true",
                        help="also write the table into docs/performance.md (block 'models')")
    parser.add_argument("--docs-block", default="models",
                        help="the block of docs/performance.md --write-docs replaces, e.g. "
                             "'models-avx2' for a table made with --mattr=-avx512f")
    parser.add_argument("--int8", action="store_true",
                        help="quantize each model with onnxruntime's quantizer and compare "
                             "kiln int8 with onnxruntime int8 and kiln float32")
    parser.add_argument("--cpu-time", action="store_true",
                        help="with --int8: time one thread's CPU time per call (both "
                             "runtimes on one thread) instead of the wall clock")
    parser.add_argument("--ort-isa", choices=("target", "host"), default="target",
                        help="target (default): hide from onnxruntime the CPU features the "
                             "host has and kiln's target lacks (bench/ort_isa.py); host: "
                             "onnxruntime on all of the host's")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 2.0 if args.as_exported else 20.0
    names = [] if args.as_exported else model_names(
        args.models or ("int8" if args.int8 else "small"))
    target = kiln.target.Target(args.target or "host")
    if args.mattr is not None:
        target = target.with_attrs(mattr=tuple(f for f in args.mattr.split(",") if f))
    if args.cpu_time:
        args.threads = 1  # a thread's CPU time: every call on the calling thread
    kiln.runtime.set_num_threads(args.threads)
    ORT_THREADS[0] = args.threads
    spin = os.environ.get("KILN_SPIN_US", "default")
    print(f"target: {target.kind.name} {describe_target(target)}")
    print(ort_on_target_isa(target, args.ort_isa))
    print(f"graph pipeline: {args.graph_pipeline}   tensor pipeline: {args.tensor_pipeline}   "
          f"threads: {args.threads} (kiln and ort)   KILN_SPIN_US: {spin}   "
          f"call path: {args.call_path}   "
          + ("one thread's CPU time per call, best of 5 blocks" if args.cpu_time else
             f"median of up to {args.repeat} calls in {args.seconds:g} s, alternating blocks"))
    if args.as_exported:
        import as_exported  # cycle: it imports this module's builders and quantize

        as_exported.run_all(args, target, ort_session)
        return
    if args.dynamic:
        print_dynamic(target, args.repeat, args.seconds)
        return
    if args.int8:
        print_int8(names, target, args.repeat, args.seconds, args.cpu_time)
        return
    paced = not args.no_paced
    header = (f"{'model':<12} {'compile s':>9} {'kiln ms':>9} {'ort ms':>9} {'kiln/ort':>9} "
              + "".join(f"{f'{p * 1e3:g}ms k/o':>10}" for p in PACED_PERIODS if paced)
              + f" {'rel L2':>9} {'calls':>5}")
    print(header)
    print("-" * len(header))
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    for name in names:
        try:
            r = run(name, target, args.repeat, args.seconds, args.tensor_pipeline,
                    args.graph_pipeline, paced, args.call_path)
        except Skipped as exc:
            print(f"{name:<12} skipped: {exc}", flush=True)
            rows.append([name, "skipped: " + str(exc).replace("|", "/"), *[""] * (
                5 + paced * len(PACED_PERIODS))])
            continue
        cached = " (cache hit)" if r["cache_hit"] else ""
        paced_ratios = [r[f"paced_{p * 1e3:g}ms"] for p in PACED_PERIODS if paced]
        paced_cols = "".join(f"{x:>10.2f}" for x in paced_ratios)
        print(f"{name:<12} {r['compile_s']:>9.2f} {r['kiln_ms']:>9.3f} {r['ort_ms']:>9.3f} "
              f"{r['ratio']:>9.2f}{paced_cols} {r['rel_l2']:>9.1e} {r['calls']:>5.0f}{cached}",
              flush=True)
        rows.append([name, f"{r['compile_s']:.2f}{'*' if cached else ''}",
                     f"{r['kiln_ms']:.3f}", f"{r['ort_ms']:.3f}", f"{r['ratio']:.2f}x",
                     *(f"{x:.2f}x" for x in paced_ratios), f"{r['rel_l2']:.0e}"])
    if args.write_docs:
        columns = ["model", "compile s", "kiln ms", "ort ms", "kiln/ort",
                   *(f"paced {p * 1e3:g} ms" for p in PACED_PERIODS if paced), "rel L2"]
        command = " ".join(["bench/models.py", *sys.argv[1:]])
        write_block(DOCS / "performance.md", args.docs_block, [
            machine_line(command, describe_target(target), load_before, os.getloadavg()[0]),
            "", *markdown_table(columns, rows)])


if __name__ == "__main__":
    main()
