"""Compile benchmark: cold compile time, export time, peak RSS and cache bytes.

    .venv/bin/python bench/compile.py [--models resnet50,bert] [--size full|test]
                                      [--chains 1000,2000,4000] [--target c]

For each model of tests/models/zoo.py (at its published input size by default:
224x224 images, BERT at sequence 128) plus `vgg19` (575 MB = 548 MiB of float32
weights), the model is saved as an .onnx file and compiled in a fresh Python process with
a fresh, empty `KILN_CACHE_DIR`, as a user would:

- `import s`: `kiln.frontend.from_onnx(path)`;
- `compile s`: `kiln.compile(mod, target)` (passes + codegen, cold cache);
- `export s`: `ex.export_library(model.so)` (link into one shared library);
- `peak MB`: the process's resident-set high-water mark (`VmHWM`) at the end
  (the linker is a separate process), and the same after the imports only
  (`base MB`: Python, numpy, onnx, llvmlite, kiln);
- `weights MB`: bytes of the model's initializers; `peak/w` divides the peak
  RSS by them, `RSS/w` the peak minus the base;
- `cache`: bytes under the cache directory after the compile.

One process per model keeps one model's memory out of the next one's figure.
Then compile times of elementwise chains of 1k, 2k and 4k nodes (Add / Sigmoid /
Sub / Tanh of a 64-element input), each in a process warmed up by compiling a
one-node model first, show how compile time grows with graph size (`ms/node`
stays flat when the growth is linear). A model that fails to compile
is skipped with a one-line reason. Prints a table; asserts nothing (this is not
a test).

With `--stages`, the same fresh process compiles each model under a
`TimingInstrument` and loads it (`ex["main"]`, as `kiln.InferenceSession` does), and
the table splits that cold start by stage (STAGES below): the ONNX import, the graph
passes and within them weight packing (`block-convolutions`, `block-matmuls`: the
weights rearranged into the kernels' tiles, the kernels' tiles chosen), the tensor
passes, kiln's lowering to LLVM IR, LLVM's parse, optimization and object emission,
the rest of the codegen step (the target machine, host.c's source, the bitcode), the C
compiler on host.c (the packed entries), the link, and the compile cache (the model's
fingerprint, the store into the empty cache); `other` is what the named stages leave of
the total (lazy imports, LLVM's set-up, the constant pool, the loader); `cpu` the CPU
seconds of the process and its children (LLVM's worker processes, cc, ld), which a
loaded machine disturbs less than the wall clock. On this machine's architecture the
LLVM module is compiled in parts on every core (`LLVM split`, `LLVM parts`, `LLVM
join`; kiln.codegen.llvm.parts), else as one module (`LLVM parse`, `optimize`, `emit`).
`--kernels-warm` measures each model with its kernels already in the kernel cache
(kiln.codegen.kernel_cache), as a rebuild after a change of weights finds them.

Each worker imports kiln lazily, so the figures include the import of the modules a
compile uses (the ONNX frontend in `import`, the passes and code generators mostly in
`other`). Where `PYTHONDONTWRITEBYTECODE` is set and kiln's sources have no bytecode (an
editable install, a fresh checkout; a wheel's install compiles it), every worker also
compiles those sources, about 0.3 s of a ResNet-50 build, in `import` and `other`: the
header says which, and `--bytecode` compiles kiln's bytecode first (as `make unit`
does), which an installed kiln has.

`--warm FIRST` (with `--stages`) measures a build whose whole-module cache misses but
whose kernel cache another build filled: a first fresh process compiles FIRST into the
temporary `KILN_CACHE_DIR`, then a second one is timed. FIRST is a zoo name, `resnet18`
(bench/nets.py), or `weights`: the measured model itself with other weights (each float
initializer scaled by a seeded factor near 1, as a fine-tuned copy of a model differs
from the original; the measured build is the copy).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the zoo builds its graphs with tests/support
sys.path.insert(0, str(ROOT / "tests" / "models"))

MB = 1e6
CHAIN_OPS = ("Add", "Sigmoid", "Sub", "Tanh")


def chain(nodes: int) -> onnx.ModelProto:
    """`nodes` elementwise nodes in one chain; the binary ones reuse the input."""
    from onnx import TensorProto, helper

    graph_nodes = []
    h = "x"
    for i in range(nodes):
        op = CHAIN_OPS[i % len(CHAIN_OPS)]
        inputs = [h, "x"] if op in ("Add", "Sub") else [h]
        out = "y" if i == nodes - 1 else f"h{i}"
        graph_nodes.append(helper.make_node(op, inputs, [out]))
        h = out
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(graph_nodes, f"chain{nodes}",
                              [vi("x", TensorProto.FLOAT, [1, 64])],
                              [vi("y", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def peak_rss() -> int:
    """This process's peak resident set in bytes: VmHWM (ru_maxrss survives exec
    on Linux, so in a child it can report the parent's size instead)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reweighted(model: onnx.ModelProto, seed: int = 1) -> onnx.ModelProto:
    """`model` with other weights: each float initializer scaled by a seeded factor in
    [0.9, 1.1), as a fine-tuned model differs from its original (same graph, shapes)."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    out = type(model)()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.size > 1:
            scaled = array * np.float32(rng.uniform(0.9, 1.1))
            init.CopyFrom(numpy_helper.from_array(scaled, init.name))
    return out


def worker(path: str, target_text: str, out_dir: str, warm: bool) -> None:
    """Runs in the child process: import, compile, export; prints one JSON line.
    warm: compile a one-node model first (uncached), so the figures leave out
    kiln's lazy imports and LLVM's initialisation."""
    import llvmlite.binding  # noqa: F401  (the base figure includes every library kiln uses)
    import numpy  # noqa: F401
    import onnx  # noqa: F401

    import kiln
    from kiln.frontend import from_onnx

    base = peak_rss()
    target = kiln.Target.from_host() if target_text == "host" else kiln.Target(target_text)
    if warm:
        from kiln.transform import PassContext

        with PassContext(config={"kiln.cache": False}):
            kiln.compile(from_onnx(chain(1).SerializeToString()), target)
    t0 = time.perf_counter()
    mod = from_onnx(path)
    t1 = time.perf_counter()
    ex = kiln.compile(mod, target)
    t2 = time.perf_counter()
    cache = sum(f.stat().st_size for f in Path(os.environ["KILN_CACHE_DIR"]).rglob("*")
                if f.is_file())
    library = Path(out_dir) / "model.so"
    ex.export_library(library)
    t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "compile_s": t2 - t1, "export_s": t3 - t2,
                      "base_rss": base, "peak_rss": peak_rss(), "cache_bytes": cache,
                      "library_bytes": library.stat().st_size, "cache_hit": ex.cache_hit}))


# (column, timings it sums: "pass:NAME" a top-level pass pipeline or a pass in one,
# "step:NAME" a backend step of TimingInstrument, "-..." one it subtracts) for --stages;
# outline-parallel-loops runs inside the codegen step (as codegen.outline)
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("graph passes", ("pass:graph-default",)),
    ("packing", ("pass:block-convolutions", "pass:block-matmuls")),
    ("tensor passes", ("pass:tensor-default", "pass:terminate-checks",
                       "pass:outline-parallel-loops")),
    ("cache", ("step:fingerprint", "step:cache.lookup", "step:cache.weights",
               "step:cache.store")),
    ("lower to LLVM IR", ("step:codegen.lower",)),
    # one LLVM module (KILN_CODEGEN_PARTS=0, a cross target) ...
    ("LLVM parse", ("step:codegen.parse",)),
    ("LLVM optimize", ("step:codegen.optimize",)),
    ("LLVM emit", ("step:codegen.emit_object",)),
    # ... or its parts (kiln.codegen.llvm.parts): cut, compiled on every core through the
    # kernel cache (parse, optimize, emit), joined (ld -r, bitcode link)
    ("LLVM split", ("step:codegen.split",)),
    ("LLVM parts", ("step:codegen.parts",)),
    ("LLVM join", ("step:codegen.join",)),
    # the codegen step less its named parts: the target machine, host.c's source, bitcode
    ("codegen rest", ("step:codegen", "-step:codegen.lower", "-step:codegen.parse",
                      "-step:codegen.optimize", "-step:codegen.emit_object",
                      "-step:codegen.split", "-step:codegen.parts", "-step:codegen.join",
                      "-step:codegen.constants", "-step:codegen.outline")),
    ("C compile", ("step:export.compile",)),
    ("link", ("step:export.data", "step:export.link")),
]


def bytecode_state(compile_it: bool) -> str:
    """Whether the workers find kiln's modules compiled (`__pycache__`, for this Python),
    after compiling them first when `compile_it`."""
    import compileall
    import importlib.util

    import kiln

    src = Path(kiln.__file__).resolve().parent
    if compile_it:
        compileall.compile_dir(src, quiet=1, workers=0)
    sources = list(src.rglob("*.py"))
    def fresh(source: Path) -> bool:  # a bytecode file no older than its source
        compiled = Path(importlib.util.cache_from_source(str(source)))
        return compiled.exists() and compiled.stat().st_mtime >= source.stat().st_mtime

    cached = sum(map(fresh, sources))
    if cached == len(sources) or not sys.dont_write_bytecode:
        return "kiln's bytecode cached" if cached == len(sources) else \
            "kiln's bytecode written on first import"
    return (f"kiln's bytecode: {cached} of {len(sources)} modules cached, the others "
            "compiled in each worker (PYTHONDONTWRITEBYTECODE; --bytecode compiles them)")


def stage_seconds(timing: Any) -> dict[str, float]:
    """Seconds of each of STAGES from a TimingInstrument's passes and steps."""
    def seconds(key: str) -> float:
        sign = -1.0 if key.startswith("-") else 1.0
        kind, name = key.lstrip("-").split(":", 1)
        if kind == "step":
            return sign * timing.step_seconds(name)
        return sign * sum(x.seconds for x in timing.timings if x.name == name)
    return {column: sum(seconds(k) for k in keys) for column, keys in STAGES}


def stage_worker(path: str, target_text: str) -> None:
    """Runs in the child process: import, compile and load under a TimingInstrument;
    prints one JSON line of STAGES' seconds, the import's and the total."""
    import kiln
    from kiln.frontend import from_onnx
    from kiln.transform import PassContext
    from kiln.transform.instruments import TimingInstrument

    target = kiln.Target.from_host() if target_text == "host" else kiln.Target(target_text)
    timing = TimingInstrument()
    c0 = os.times()
    with PassContext(instruments=[timing]):
        t0 = time.perf_counter()
        mod = from_onnx(path)
        t1 = time.perf_counter()
        kiln.compile(mod, target)["main"]  # links and loads the library
        t2 = time.perf_counter()
    c1 = os.times()
    # CPU seconds of this process and its children (LLVM's workers, cc, ld): a figure a
    # loaded machine disturbs less than the wall clock
    cpu = sum(getattr(c1, f) - getattr(c0, f)
              for f in ("user", "system", "children_user", "children_system"))
    print(json.dumps({"import": t1 - t0, **stage_seconds(timing), "total": t2 - t0,
                      "cpu": cpu}))


def measure(model: onnx.ModelProto, target: str, warm: bool = False,
            stages: bool = False, kernels_warm: bool = False,
            first: onnx.ModelProto | None = None) -> dict[str, Any]:
    """Save `model`, compile it in a fresh process with an empty cache; the worker's
    figures, or {"error": one line} when it fails. With `kernels_warm`, a first process
    compiles it and its compile-cache entries are removed: the measured one finds
    every kernel in the kernel cache (kiln.codegen.kernel_cache), as a rebuild after
    a weight change does. With `first`, a first process compiles `first` into the same
    cache directory (whatever its kernels share with `model` is then a hit)."""
    import onnx

    import kiln

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path)
        env = dict(os.environ, KILN_CACHE_DIR=str(Path(tmp) / "cache"))
        # the worker imports the same kiln as this process
        kiln_root = str(Path(kiln.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(
            [kiln_root, *filter(None, [os.environ.get("PYTHONPATH")])])
        command = [sys.executable, __file__, "--worker", str(path), "--target", target,
                   "--out-dir", tmp, *(["--warm-up"] if warm else []),
                   *(["--stages"] if stages else [])]
        if kernels_warm:
            subprocess.run(command, env=env, capture_output=True, check=False)
            shutil.rmtree(Path(tmp) / "cache" / "v2", ignore_errors=True)
        if first is not None:
            first_path = Path(tmp) / "first.onnx"
            onnx.save(first, first_path)
            subprocess.run([*command[:3], str(first_path), *command[4:]], env=env,
                           capture_output=True, check=False)
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or f"exit status {proc.returncode}").splitlines()
        return {"error": (lines or ["?"])[-1][:150]}
    return json.loads(proc.stdout.splitlines()[-1])


def print_stages(models: list[tuple[str, onnx.ModelProto]], target: str,
                 kernels_warm: bool = False,
                 first: Callable[[str, onnx.ModelProto], onnx.ModelProto] | None = None,
                 first_name: str = "") -> None:
    """The --stages table: each model's cold compile and load, by stage, in seconds;
    with `first` (model name and model -> the model to compile before it), the
    measured build finds that one's kernels in the cache."""
    columns = ["import", *(c for c, _ in STAGES), "other", "total", "cpu"]
    cache = ("its kernels in the kernel cache" if kernels_warm else
             f"the kernel cache filled by {first_name} first" if first else
             "empty KILN_CACHE_DIR")
    print(f"seconds; one fresh process and {cache} per model; cpu: CPU seconds of the "
          f"process and its children; load average {os.getloadavg()[0]:.1f} at the start")
    print(f"{'model':<13}" + "".join(f"{c:>{max(9, len(c) + 1)}}" for c in columns))
    for name, model in models:
        if first is not None and first_name == "weights":
            model, original = reweighted(model), model
        else:
            original = model
        r = measure(model, target, stages=True, kernels_warm=kernels_warm,
                    first=first(name, original) if first else None)
        if "error" in r:
            print(f"{name:<13}   skipped: {r['error']}")
            continue
        # packing is part of the graph passes; the others do not overlap
        named = r["import"] + sum(r[c] for c, _ in STAGES if c != "packing")
        r["other"] = r["total"] - named
        print(f"{name:<13}" + "".join(f"{r[c]:>{max(9, len(c) + 1)}.2f}" for c in columns),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated zoo names and/or vgg19 (default: all)")
    parser.add_argument("--size", default="full", choices=("full", "test", "shallow"),
                        help="input size of the zoo entries (default: published sizes)")
    parser.add_argument("--chains", default="1000,2000,4000",
                        help="node counts of the elementwise chains ('' for none)")
    parser.add_argument("--target", default="host", help="kiln target (default: this host)")
    parser.add_argument("--stages", action="store_true",
                        help="split each model's cold compile and load by stage instead")
    parser.add_argument("--kernels-warm", action="store_true",
                        help="with --stages: each model's kernels already in the kernel cache")
    parser.add_argument("--warm", metavar="FIRST", default=None,
                        help="with --stages: compile FIRST (a zoo name, resnet18, or "
                             "'weights': the same model with other weights) into the "
                             "cache first")
    parser.add_argument("--bytecode", action="store_true",
                        help="compile kiln's bytecode (__pycache__) first, as an installed "
                             "kiln has it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker and args.stages:
        stage_worker(args.worker, args.target)
        return
    if args.worker:
        worker(args.worker, args.target, args.out_dir, args.warm_up)
        return

    import zoo
    from harness import describe_target

    import kiln

    def build(name: str) -> onnx.ModelProto:
        if name == "vgg19":
            return zoo.vgg19(image=224 if args.size == "full" else 64)
        return zoo.ZOO[name].model(args.size)

    builders = [*zoo.ZOO, "vgg19"]
    names = args.models.split(",") if args.models else list(builders)
    unknown = [n for n in names if n not in builders]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(builders)}")

    host = kiln.Target.from_host()
    target = host if args.target == "host" else kiln.Target(args.target)
    print(f"host: {describe_target(host)}   target: {target.kind.name}   sizes: {args.size}   "
          f"{bytecode_state(args.bytecode)}")
    def first_model(name: str, model: onnx.ModelProto) -> onnx.ModelProto:
        if args.warm == "weights":
            return model
        if args.warm == "resnet18":
            import nets

            return nets.resnet18()[0]
        return build(args.warm)

    if args.warm and args.warm not in ("weights", "resnet18", *builders):
        parser.error(f"unknown --warm model {args.warm}; known: weights, resnet18, "
                     f"{', '.join(builders)}")
    if args.stages:
        print_stages([(name, build(name)) for name in names], args.target,
                     kernels_warm=args.kernels_warm, first=first_model if args.warm else None,
                     first_name=args.warm or "")
        return
    print("one fresh process and empty KILN_CACHE_DIR per model; "
          "RSS/w = (peak - base) / weights")
    header = (f"{'model':<13} {'weights MB':>10} {'import s':>8} {'compile s':>9} "
              f"{'export s':>8} {'total s':>7} {'peak MB':>8} {'base MB':>7} {'peak/w':>6} "
              f"{'RSS/w':>6} {'cache MB':>8}")
    print(header)
    print("-" * len(header))
    for name in names:
        model = build(name)
        weights = zoo.weight_bytes(model)
        r = measure(model, args.target)
        del model
        if "error" in r:
            print(f"{name:<13} {weights / MB:>10.1f}   skipped: {r['error']}")
            continue
        total = r["import_s"] + r["compile_s"] + r["export_s"]
        print(f"{name:<13} {weights / MB:>10.1f} {r['import_s']:>8.2f} {r['compile_s']:>9.2f} "
              f"{r['export_s']:>8.2f} {total:>7.2f} {r['peak_rss'] / MB:>8.0f} "
              f"{r['base_rss'] / MB:>7.0f} {r['peak_rss'] / weights:>6.2f} "
              f"{(r['peak_rss'] - r['base_rss']) / weights:>6.2f} "
              f"{r['cache_bytes'] / MB:>8.1f}", flush=True)

    sizes = [int(n) for n in args.chains.split(",") if n]
    if sizes:
        print()
        header = f"{'chain nodes':>11} {'import s':>8} {'compile s':>9} {'ms/node':>8}"
        print(header)
        print("-" * len(header))
    for n in sizes:
        r = measure(chain(n), args.target, warm=True)
        if "error" in r:
            print(f"{n:>11}   skipped: {r['error']}")
            continue
        total = r["import_s"] + r["compile_s"]
        print(f"{n:>11} {r['import_s']:>8.2f} {r['compile_s']:>9.2f} {total / n * 1e3:>8.2f}",
              flush=True)


if __name__ == "__main__":
    main()
