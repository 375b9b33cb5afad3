"""Peers benchmark: kiln, onnxruntime, OpenVINO and torch on one model, in one process.

    PYTHONPATH=src:/path/to/openvino .venv/bin/python bench/peers.py
        [--models peers | NAME,...] [--seconds 12] [--repeat 40] [--threads 2]
        [--torch-compile] [--precision f32 | bf16] [--target host] [--mattr=-avx512f]
        [--cpu-time] [--write-docs] [--docs-block peers]

For each model of the set (`peers`: the small MLP, CNN and encoder, ResNet-18 and
MobileNetV2 of bench/nets.py, the CNN zoo, BERT-base, GPT-2, ViT-B/16 of
bench/zoo_set.py, the Whisper-base encoder of bench/hf_set.py, and ResNet-50 int8 (QDQ)
and BERT int8 (dynamic) from onnxruntime's quantizer, bench/models.py's `quantize`),
batch 1, the same `.onnx` file runs on:

- kiln float32: `from_onnx` + `kiln.compile` for this host (or `--target`, its
  features changed by `--mattr` as bench/models.py does) + loading the library,
  the compile cache off (a cold compile), called through `fn.prepare`; with
  `--precision bf16`, for `host -precision=bf16` instead (GEMMs, NCHWc convolutions and
  attention's products in bfloat16, docs/targets.md), to set beside OpenVINO's default;
- onnxruntime (the reference of every ratio): a CPU session, `run_with_iobinding`;
- OpenVINO fp32: `core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": n,
  "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})`;
- OpenVINO default: the same without the precision hint (bfloat16 compute on a CPU
  with AVX512-BF16 or AMX);
- torch eager, and with `--torch-compile` `torch.compile` (slow to start: its first
  call is its compile time, with inductor's on-disk cache in a new empty directory),
  where bench/hf_set.py has the model's torch module.

On a target without some of the host's features (`--mattr=-avx512f`, `--target "llvm
-mcpu=znver3"`: the AVX2 path) onnxruntime and OpenVINO see the CPU without them too
(bench/ort_isa.py hides them from their `cpuid`), so every runtime runs that path's
kernels; the header names what each sees and the kernels OpenVINO's plugin picks for a
convolution (`brgconv_avx2_f32`); torch, which would run the host's, is left out. Every
runtime gets `--threads` threads (default 2). The timed calls alternate in blocks
(harness.alternating_blocks: a pause between blocks, so no runtime's spinning threads
slow another's); each ratio is the median over rounds of one round's ratio to
onnxruntime (harness.paired_ratio). With `--cpu-time` the calls are timed by the
process's CPU time (`time.process_time`, every thread's) instead of the wall clock: time
spent descheduled by other jobs then counts for no runtime, so on a loaded host
`--threads 1` compares the kernels alone, and with more threads a ratio above the wall
clock's is CPU the runtime's threads spent waiting or spinning. Beside each ratio: the
relative L2 error of that runtime's first output against onnxruntime's. The second table
gives each runtime's compile time (kiln's cold compile, onnxruntime's session creation,
OpenVINO's `compile_model` from the file, torch.compile's first call), after one warm-up
model that loads every runtime's libraries. OpenVINO and torch are optional: without
them their columns say "absent"; a runtime that fails on a model says "failed" (the
reason is printed). Prints the tables; `--write-docs` writes them into the `peers` block
of docs/performance.md (`peers-bf16` with `--precision bf16`, or `--docs-block`).
Asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block
from harness import (
    alternating_blocks,
    calls_within,
    describe_target,
    hidden_features,
    openvino_on_target_isa,
    ort_bound_run,
    ort_on_target_isa,
    paired_ratio,
    pooled_ms,
    rel_l2,
    short_error,
)
from hf_set import HF
from peers_table import (
    RUNTIMES,
    PeerResult,
    compile_header,
    compile_row,
    geomean_row,
    latency_header,
    latency_row,
)

import kiln
from kiln.errors import UsageError
from kiln.frontend import from_onnx
from kiln.transform import PassContext
from models import MODELS, build, quantize

DOCS = Path(__file__).resolve().parents[1] / "docs"
INT8 = "_int8"
PEERS_SET = ["mlp", "cnn", "encoder", "resnet18", "mobilenetv2", "resnet50", "squeezenet",
             "shufflenet", "inception", "densenet121", "efficientnet", "vgg19", "bert",
             "gpt2", "vit", "whisper_encoder", "resnet50" + INT8, "bert" + INT8]
OV_F32 = {"INFERENCE_PRECISION_HINT": "f32"}

# A runtime's set-up: (the call timed, its first output, seconds to compile or None).
Setup = tuple[Callable[[], object], np.ndarray, float | None]


class Absent(Exception):
    """A runtime cannot run here (not installed) or has nothing to run (no torch module)."""


def load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Any]:
    """Model `name`, its inputs and its torch module (None where there is none)."""
    base = name.removesuffix(INT8)
    if base in HF and base == name:
        return _hf(base)
    model, feed = build(base)
    if name.endswith(INT8):
        model = quantize(model, {k: list(v.shape) for k, v in feed.items()}, "QDQ")
    return model, feed, None


def _hf(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Any]:
    """A Hugging Face model exported as bench/hf_set.py exports it, with the module."""
    import hf_export  # heavy: torch (bench/hf_set.py put tests/models on the path)
    import hf_set  # heavy: torch and transformers
    import torch  # heavy: only the Hugging Face models need it

    make, feeds, exporter = hf_set.torch_model(name)
    torch.manual_seed(0)  # the random weights, as bench/hf_set.py draws them
    module = make().eval()
    example = {k: torch.from_numpy(v) for k, v in feeds(np.random.default_rng(0)).items()}
    model = hf_export.export(module, example, {}, exporter)
    return model, feeds(np.random.default_rng(42)), module


def first(outputs: Any) -> np.ndarray:
    """A runtime's first output as a numpy array."""
    if isinstance(outputs, (list, tuple)):
        outputs = outputs[0]
    return np.array(outputs, copy=True)


def setup_kiln(path: str, feed: dict[str, np.ndarray], target: kiln.target.Target,
               loaded: list[Any]) -> Setup:
    """kiln's cold compile of the file (cache off) and its prepared call; the loaded
    library is appended to `loaded` (for its pool's counters)."""
    args = list(feed.values())
    start = time.perf_counter()
    with PassContext(config={"kiln.cache": False}):
        ex = kiln.compile(from_onnx(path), target)
        fn = ex["main"]  # links and loads the library
    seconds = time.perf_counter() - start
    loaded.append(ex.jit())
    out = fn(*args)
    try:
        call = fn.prepare(*args, out=out)
    except UsageError:  # results sized only by the call: the plain call
        call = lambda: fn(*args)  # noqa: E731
    return call, first(out), seconds


def setup_ort(path: str, feed: dict[str, np.ndarray], threads: int) -> Setup:
    """An onnxruntime CPU session of the file and its IOBinding call."""
    import onnxruntime as ort  # lazy: after ort_on_target_isa

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - start
    outs = session.run(None, feed)
    return ort_bound_run(session, feed, [np.empty_like(o) for o in outs]), first(outs), seconds


def setup_openvino(path: str, feed: dict[str, np.ndarray], threads: int,
                   extra: dict[str, str]) -> Setup:
    """OpenVINO's CPU plugin on the file (`compile_model` timed) with the inputs set
    once as shared tensors, as IOBinding binds them."""
    try:
        import openvino as ov  # optional: the bench extra
    except ImportError as exc:
        raise Absent("absent") from exc
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", **extra}
    start = time.perf_counter()
    compiled = ov.Core().compile_model(path, "CPU", config)
    seconds = time.perf_counter() - start
    request = compiled.create_infer_request()
    for name, array in feed.items():
        request.set_tensor(name, ov.Tensor(array, shared_memory=True))

    def call() -> object:
        return request.infer(share_inputs=True, share_outputs=True)

    call()
    return call, first(request.get_output_tensor(0).data), seconds


def setup_torch(module: Any, feed: dict[str, np.ndarray], threads: int,
                compiled: bool) -> Setup:
    """torch eager (or torch.compile, its first call timed) on the model's module."""
    if module is None:
        raise Absent("—")
    import torch  # heavy: only the Hugging Face models have a module

    torch.set_num_threads(threads)
    inputs = {k: torch.from_numpy(v) for k, v in feed.items()}
    fn = torch.compile(module) if compiled else module

    def call() -> Any:
        with torch.inference_mode():
            return fn(**inputs)[0]

    start = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - start
    return call, first(out.numpy()), seconds if compiled else None


def setups(runtimes: list[str], path: str, feed: dict[str, np.ndarray], module: Any,
           target: kiln.target.Target, threads: int, loaded: list[Any]
           ) -> dict[str, Callable[[], Setup]]:
    """Each runtime's set-up, to call in table order (kiln's library into `loaded`)."""
    table: dict[str, Callable[[], Setup]] = {
        "ort": lambda: setup_ort(path, feed, threads),
        "kiln": lambda: setup_kiln(path, feed, target, loaded),
        "ov_f32": lambda: setup_openvino(path, feed, threads, OV_F32),
        "ov_default": lambda: setup_openvino(path, feed, threads, {}),
        "torch": lambda: setup_torch(module, feed, threads, False),
        "torch_compile": lambda: setup_torch(module, feed, threads, True),
    }
    return {r: table[r] for r in runtimes}


def measure(name: str, runtimes: list[str], target: kiln.target.Target, threads: int,
            repeat: int, seconds: float, clock: Callable[[], float] = time.perf_counter
            ) -> PeerResult:
    """One model on every runtime: compile times, outputs, alternating-block timings."""
    result = PeerResult(name.removesuffix(INT8), int8=name.endswith(INT8))
    try:
        model, feed, module = load(name)
    except Exception as exc:  # a benchmark reports what fails and goes on
        print(f"{name}: build failed: {short_error(exc)}", flush=True)
        result.missing = dict.fromkeys(RUNTIMES, "failed")
        return result
    calls: dict[str, Callable[[], object]] = {}
    loaded: list[Any] = []
    outputs: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        onnx.save(model, path)
        del model
        for runtime, setup in setups(runtimes, path, feed, module, target, threads,
                                     loaded).items():
            try:
                calls[runtime], outputs[runtime], compile_s = setup()
            except Absent as exc:
                result.missing[runtime] = str(exc)
                continue
            except Exception as exc:  # a benchmark reports what fails and goes on
                print(f"{name}: {runtime} failed: {short_error(exc)}", flush=True)
                result.missing[runtime] = "failed"
                continue
            if compile_s is not None:
                result.compile_s[runtime] = compile_s
    if "ort" not in calls:
        return result
    count = calls_within(calls, repeat, seconds)
    before = [lib.pool_stats() for lib in loaded]
    blocks = alternating_blocks(calls, count, rounds=max(5, count // 2), clock=clock)
    for lib, was in zip(loaded, before, strict=True):  # the probe's verdicts meanwhile
        now = lib.pool_stats()
        alone, pooled = now.alone - was.alone, now.loops - was.loops
        result.kiln_alone = alone / (alone + pooled) if alone + pooled else math.nan
    result.ort_ms = pooled_ms(blocks)["ort"]
    for runtime in calls:
        result.ratio[runtime] = paired_ratio(blocks[runtime], blocks["ort"])
        result.rel_l2[runtime] = rel_l2(outputs[runtime], outputs["ort"])
    return result


def versions() -> str:
    """The peers' versions, for the table's header."""
    import onnxruntime  # lazy: after ort_on_target_isa

    found = [f"onnxruntime {onnxruntime.__version__}"]
    for package in ("openvino", "torch"):
        try:
            module = __import__(package)
            found.append(f"{package} {module.__version__.split('-')[0]}")  # no build tag
        except ImportError:
            found.append(f"{package} absent")
    return ", ".join(found)


def model_names(spec: str) -> list[str]:
    """Names from a comma-separated list of model names (a `_int8` suffix quantizes)
    and `peers`, the whole set."""
    names: list[str] = []
    for item in spec.split(","):
        for name in PEERS_SET if item == "peers" else [item]:
            if name.removesuffix(INT8) not in MODELS:
                raise SystemExit(f"unknown model {name!r}; choose from peers, "
                                 f"{', '.join(MODELS)} (a suffix {INT8} quantizes)")
            names.append(name)
    return names


def print_tables(results: list[PeerResult], runtimes: list[str], measure: str = "Latency"
                 ) -> list[str]:
    """Print the latency (or CPU time: `measure`) and compile tables; returns their
    Markdown lines."""
    lines = [f"{measure} relative to onnxruntime (lower is faster) and, in brackets, the "
             "relative L2 error of the first output against onnxruntime's:", "",
             *markdown_table(latency_header(runtimes),
                             [*(latency_row(r, runtimes) for r in results),
                              geomean_row(results, runtimes)]),
             "", "Seconds to compile the model, or to create the session:", "",
             *markdown_table(compile_header(runtimes),
                             [compile_row(r, runtimes) for r in results])]
    print("\n".join(lines))
    return lines


def int8_pairs_note(results: list[PeerResult], target: kiln.target.Target) -> list[str]:
    """A note where the int8 rows compare unlike sums: onnxruntime saturating u8 x s8
    pairs in int16 (its AVX2 kernels without VNNI; OpenVINO's likewise) against kiln's
    default `int8-pairs=exact` (ONNX's sums; docs/quantization.md, "Without VNNI")."""
    if not any(r.int8 for r in results) or target.get("int8-pairs", "exact") != "exact":
        return []
    from ort_isa import saturates  # heavy: runs a MatMulInteger on onnxruntime

    if not saturates():
        return []
    return ["", "The int8 rows compare unlike sums: on this instruction set onnxruntime "
            "(and OpenVINO) sum u8 x s8 pairs in saturating int16, kiln's default "
            "`int8-pairs=exact` as ONNX defines them (the rows' rel L2); a kiln target "
            "with `-int8-pairs=saturate` computes onnxruntime's sums "
            "(docs/quantization.md, \"Without VNNI\")."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="peers",
                        help="comma-separated model names (NAME_int8: onnxruntime's int8 "
                             "quantization of NAME) or 'peers', the whole set (default)")
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="time budget per model for the timed calls, all runtimes")
    parser.add_argument("--repeat", type=int, default=40, help="most timed calls per runtime")
    parser.add_argument("--threads", type=int, default=2, help="threads of every runtime")
    parser.add_argument("--torch-compile", action="store_true",
                        help="also time torch.compile where a torch module exists (slow)")
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                        help="kiln's target attribute `precision` (bf16: AVX512-BF16 hosts)")
    parser.add_argument("--target", default="host",
                        help="kiln's target (default: this host), e.g. 'llvm -mcpu=znver3'")
    parser.add_argument("--mattr", default=None,
                        help="the target's LLVM features instead of its own, comma-separated "
                             "changes to its CPU's (mcpu) set, e.g. '-avx512f': the AVX2 path "
                             "on an AVX-512 host (onnxruntime's and OpenVINO's too)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the calls by the process's CPU time (every thread's), "
                             "not the wall clock")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the tables into docs/performance.md (block 'peers', "
                             "'peers-bf16' with --precision bf16)")
    parser.add_argument("--docs-block", default=None,
                        help="the block --write-docs replaces instead, e.g. 'peers-avx2'")
    args = parser.parse_args()
    names = model_names(args.models)
    target = kiln.target.Target(f"{args.target} -precision={args.precision}")
    if args.mattr is not None:
        target = target.with_attrs(mattr=tuple(f for f in args.mattr.split(",") if f))
    kiln.runtime.set_num_threads(args.threads)
    runtimes = [r for r in RUNTIMES if r != "torch_compile" or args.torch_compile]
    if args.torch_compile:  # a cold torch.compile: inductor's on-disk cache starts empty
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor = tempfile.mkdtemp(prefix="peers-")
        atexit.register(shutil.rmtree, inductor, True)
    print(f"target: {target.kind.name} {describe_target(target)}")
    if hidden_features(target):  # torch's kernels would run the host's instructions
        runtimes = [r for r in runtimes if not r.startswith("torch")]
    print(ort_on_target_isa(target))
    if "ov_f32" in runtimes or "ov_default" in runtimes:
        print(openvino_on_target_isa(target))
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(f"{versions()}; threads: {args.threads}; batch 1; median of up to "
          f"{args.repeat} calls in {args.seconds:g} s, alternating blocks"
          f"{', process CPU time' if args.cpu_time else ''}", flush=True)
    load_before = os.getloadavg()[0]
    measure("mlp", runtimes, target, args.threads, 3, 0.1)  # load every runtime's libraries
    results = []
    for name in names:
        results.append(measure(name, runtimes, target, args.threads, args.repeat,
                               args.seconds, clock))
        alone = results[-1].kiln_alone
        print("  ".join(latency_row(results[-1], runtimes))
              + (f"  [kiln loops alone: {alone:.0%}]" if alone > 0 else ""), flush=True)
        gc.collect()
    lines = print_tables(results, runtimes, "CPU time" if args.cpu_time else "Latency")
    note = int8_pairs_note(results, target)
    if note:
        print("\n".join(note))
        lines += note
    if args.write_docs:
        command = " ".join(["bench/peers.py", *sys.argv[1:]])
        block = args.docs_block or (
            "peers" if args.precision == "f32" else f"peers-{args.precision}")
        alone = [f"{r.model}{' (int8)' if r.int8 else ''} {r.kiln_alone:.0%}"
                 for r in results if not math.isnan(r.kiln_alone)]
        state = ["", "Share of kiln's parallel loops run on the caller alone in the timed "
                 "blocks (its pool's probe found the two threads sharing a core: "
                 "docs/performance.md, \"Two threads on one core\"): "
                 + ", ".join(alone) + "."] if any(
                     r.kiln_alone > 0 for r in results) else []  # the probe went alone
        write_block(DOCS / "performance.md", block, [
            machine_line(command, describe_target(target), load_before, os.getloadavg()[0]),
            "", f"Versions: {versions()}.", "", *lines, *state])


if __name__ == "__main__":
    main()
