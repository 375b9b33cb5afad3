"""Per-kernel A/B of one model built by several kiln source trees, in one process.

    .venv/bin/python bench/kernel_ab.py --model cnn --src /tmp/main/src,src
                                        [--threads 2] [--blocks 6] [--calls 300]
                                        [--int8] [--target "llvm -mcpu=znver3 -int8-pairs=saturate"]
                                        [--cpu-time] [--graph-pipeline default,nchwc]

For an A/B of two commits: check the old one out in a detached worktree
(`git worktree add --detach /tmp/main main`) and name both trees' `src`. Each tree
compiles the model of bench/nets.py (or bench/zoo_set.py) with `profile=True` in a
subprocess of its own (`PYTHONPATH` at that tree, the compile cache off) and exports a
library; this process loads all of them and calls each in turn, in blocks of `--calls`
calls (after a 50 ms pause, so that the other libraries' spinning workers have gone to
sleep, and a warm-up), reading every kernel's time after every call. Printed: the
median per call of each kernel and of the whole call (`perf_counter`, Python's call
included) per library, and the share of the chunks the library's workers ran
(`PoolStats.helped / chunks`: near `1 - 1/threads` the second thread took part; near 0
it was off its core and the run says nothing about splitting; the share of the loops
the pool ran on the caller alone because its probe found the threads sharing a core,
docs/abi.md "Parallel loops") and the share of the
pool's time its threads spent in chunks (`work_ns / (span_ns * threads)`; the rest they
waited for a thread still in its last chunk of a loop). Medians of single calls
are what a shared machine disturbs least; on a loaded one, raise the process's priority
for the run (docs/performance.md, "The 2-thread split on Zen 3"). Prints a table;
asserts nothing (this is not a test).

`--int8` quantizes the model once as bench/models.py --int8 does (QDQ; QOperator for a
name ending in `_qop`) and every tree compiles that file; `--target` is the kiln target of
every build; `--cpu-time` times the calling thread's CPU time per call instead of the
wall clock (meaningful with `--threads 1`: robust on a loaded machine);
`--onnx FILE` times an ONNX file of your own (one layer, a block) instead of a model of
the set; `--graph-pipeline` names kiln's graph pipeline, one for every tree or one per tree in
`--src`'s order (`--src src,src --graph-pipeline default,nchwc`: one tree, two layouts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent

BUILD = """
import sys
sys.path.insert(0, {bench!r})
import kiln
import onnx
from kiln.frontend import from_onnx
from models import MODELS
model = onnx.load({onnx_file!r}) if {onnx_file!r} else MODELS[{model!r}]()[0]
target = kiln.Target.from_host() if {target!r} == "host" else {target!r}
kiln.compile(from_onnx(model), target, profile=True,
             graph_pipeline={pipeline!r}).export_library({out!r})
"""


def build(src: str, model: str, out: Path, target: str = "host", onnx_file: str = "",
          pipeline: str = "default") -> None:
    """Compile `model` (or the ONNX file `onnx_file`) for `target` with the kiln of source
    tree `src` and graph pipeline `pipeline` into the library `out`."""
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()), KILN_CACHE="0")
    code = BUILD.format(bench=str(BENCH), model=model, out=str(out), target=target,
                        onnx_file=onnx_file, pipeline=pipeline)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def quantized_file(name: str, directory: Path) -> str:
    """Model `name` quantized as bench/models.py --int8 does, saved in `directory`."""
    import onnx

    from models import QOP, quantize
    from models import build as build_model

    model, feed = build_model(name.removesuffix(QOP))
    model = quantize(model, {k: list(v.shape) for k, v in feed.items()},
                     "QOperator" if name.endswith(QOP) else "QDQ")
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--src", required=True, help="kiln source trees, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--onnx", default="",
                        help="an ONNX file every tree compiles instead of --model")
    parser.add_argument("--int8", action="store_true",
                        help="the model quantized as bench/models.py --int8 does")
    parser.add_argument("--target", default="host",
                        help="kiln target of every build (host: this machine's CPU)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="the calling thread's CPU time per call (with --threads 1)")
    parser.add_argument("--graph-pipeline", default="default",
                        help="kiln's graph pipeline: one, or one per tree of --src")
    args = parser.parse_args()
    clock = time.thread_time if args.cpu_time else time.perf_counter

    from kiln.runtime import load_module

    sources = args.src.split(",")
    pipelines = args.graph_pipeline.split(",")
    if len(pipelines) == 1:
        pipelines *= len(sources)
    if len(pipelines) != len(sources):
        parser.error(f"--graph-pipeline names {len(pipelines)} pipelines for "
                     f"{len(sources)} source trees")
    labels = [s if p == "default" else f"{s}@{p}" for s, p in zip(sources, pipelines,
                                                                   strict=True)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"lib{i}.so" for i in range(len(sources))]
        onnx_file = quantized_file(args.model, Path(tmp)) if args.int8 else args.onnx
        for src, path, pipeline in zip(sources, paths, pipelines, strict=True):
            build(src, args.model, path, args.target, onnx_file, pipeline)
        libs = [load_module(path) for path in paths]
        for lib in libs:
            lib.set_num_threads(args.threads)
        params = libs[0].metadata["functions"]["main"]["params"]
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(p["shape"]).astype(p["dtype"]) for p in params]
        times: list[dict[str, list[float]]] = [{} for _ in libs]
        helped = [[0, 0, 0, 0, 0, 0] for _ in libs]  # helped, chunks, work, span, loops, alone
        for _ in range(args.blocks):
            for lib, per, share in zip(libs, times, helped, strict=True):
                fn = lib["main"]
                time.sleep(0.05)
                for _ in range(20):
                    fn(*inputs)
                before = lib.pool_stats()
                for _ in range(args.calls):
                    lib.profile_reset()
                    start = clock()
                    fn(*inputs)
                    per.setdefault("call", []).append((clock() - start) * 1e6)
                    for row in lib.profile():
                        if row.function == "main" and row.kernel is not None:
                            per.setdefault(row.kernel, []).append(row.total_ns / 1e3)
                after = lib.pool_stats()
                share[0] += after.helped - before.helped
                share[1] += after.chunks - before.chunks
                share[2] += after.work_ns - before.work_ns
                share[3] += after.span_ns - before.span_ns
                share[4] += after.loops - before.loops
                share[5] += after.alone - before.alone
    print(f"{args.onnx or args.model}, {args.threads} thread(s): median us per call, "
          f"{args.blocks} blocks of {args.calls} calls per library")
    names = sorted(times[0], key=lambda k: -statistics.median(times[0][k]))
    for t in times[1:]:  # the kernels the first library does not have (renamed, new)
        names += sorted((k for k in t if k not in names), key=lambda k: -statistics.median(t[k]))
    print(f"{'kernel':<32}" + "".join(f"{s[-24:]:>26}" for s in labels))
    for name in names:
        print(f"{name:<32}" + "".join(
            f"{statistics.median(t[name]) if name in t else float('nan'):26.2f}"
            for t in times))
    print(f"{'helped / chunks':<32}" + "".join(
        f"{h / max(c, 1):26.2f}" for h, c, *_ in helped))
    print(f"{'work / (span * threads)':<32}" + "".join(
        f"{w / max(span * args.threads, 1):26.3f}" for _, _, w, span, *_ in helped))
    print(f"{'alone / (loops + alone)':<32}" + "".join(  # the probe: threads sharing a core
        f"{a / max(n + a, 1):26.2f}" for *_, n, a in helped))


if __name__ == "__main__":
    main()
