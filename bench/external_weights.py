"""Two libraries of one model loaded together: memory with embedded vs external weights.

    .venv/bin/python bench/external_weights.py [--mb 64] [--models resnet50,bert]

Compiles (once, untimed) `main(x) = x @ W` with W of `--mb` MiB for `llvm` and
for `c`, exports each embedded and with weights="external", then in a fresh
process per case loads both libraries, calls each once and reads the process's
proportional set size (Pss of /proc/self/smaps_rollup; a page mapped twice in
one process counts once) and its RSS, minus what the process held before
loading. Also times load_module of an external library (median of 7 loads in
that process, the mapping cached after the first). Prints a table; asserts
nothing (this is not a test). Linux only.

`--models` (issue 60's goal: a batch-1 and a batch-32 build of one model loaded
together cost the weights about once): ResNet-50 (bench/zoo_set.py) and the
BERT-base-like encoder (bench/nets.py), their batch axis made symbolic and pinned
to 1 and to 32 (`shape_dict`): two builds, exported `weights="external"`, loaded
in a fresh process, each called once at its batch. The as-exported file (batch
symbolic) is ONE build serving both batches: its row loads it once and calls it at
batch 1 and 32. Memory is that of the mappings of the weights files (the Rss and
Pss of the /proc/self/smaps entries backed by a `.weights` file: the libraries'
regions and the loader's own mapping), not the activations of a batch-32 call;
"one build's file" is the bytes of one build's weights (its file's tensors), "raw"
the model's float initializers. Each figure is the median of 3 processes (a host
short of memory may reclaim clean file pages of one library while the other runs).
RSS counts a page once per mapping: two libraries' regions over the same pages
count twice there, once in PSS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from doc_table import cpu_name

import kiln
from kiln.artifact.weights_file import read_header
from kiln.ir import IRBuilder
from kiln.ir import graph as g

CHILD = r"""
import sys, time, statistics, numpy as np
from kiln.runtime import load_module

def mem():
    rows = dict(l.split(":", 1) for l in open("/proc/self/smaps_rollup").read().splitlines()[1:])
    return int(rows["Pss"].split()[0]) / 1024, int(rows["Rss"].split()[0]) / 1024

x = np.ones((1, int(sys.argv[3])), np.float32)
pss0, rss0 = mem()
t = time.perf_counter()
mods = [load_module(p) for p in sys.argv[1:3]]
load_ms = (time.perf_counter() - t) * 1e3 / 2
outs = [m["main"](x) for m in mods]
assert np.array_equal(outs[0], outs[1])
pss, rss = mem()
times = []
for _ in range(7):
    t = time.perf_counter(); m = load_module(sys.argv[1]); times.append(time.perf_counter() - t)
    m.close()
print(f"{pss - pss0:.1f} {rss - rss0:.1f} {load_ms:.2f} {statistics.median(times) * 1e3:.2f}")
"""


MODEL_CHILD = r"""
import sys, numpy as np
from kiln.runtime import load_module
from kiln.runtime.external_weights import mapped_hashes

def weights_mem():
    rss = pss = 0
    weights = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            weights = line.rstrip().endswith(".weights")
        elif weights and head[0] == "Rss:":
            rss += int(head[1])
        elif weights and head[0] == "Pss:":
            pss += int(head[1])
    return pss / 1024, rss / 1024

rng = np.random.default_rng(0)
mods = []
for arg in sys.argv[1:]:
    path, batches = arg.split("@")
    mods.append(load_module(path))
    for b in map(int, batches.split(",")):
        shape = [b] + SHAPE
        mods[-1]["main"](rng.standard_normal(shape).astype(np.float32))
pss, rss = weights_mem()
print(f"{pss:.1f} {rss:.1f} {len(mapped_hashes())}")
"""


def model_builds(name: str, folder: Path) -> tuple[dict[str, Path], list[int], float]:
    """ResNet-50 or BERT at batch 1, 32 and symbolic, exported with external weights;
    the input shape and the MiB of the model's float initializers."""
    import nets  # heavy: onnx and the bench model set, only for --models
    import zoo_set  # heavy: as above
    from onnx import numpy_helper

    from kiln.frontend.onnx import from_onnx

    model, shapes = (zoo_set.ZOO.get(name) or nets.MODELS[name])()
    (inp, shape), = shapes.items()
    raw = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer
              if t.data_type == 1) / 2**20
    model = nets.symbolic_dims(model, {0: "batch"})
    out = {}
    for label, pin in (("b1", 1), ("b32", 32), ("symbolic", None)):
        mod = from_onnx(model, shape_dict=None if pin is None else {inp: [pin, *shape[1:]]})
        out[label] = Path(kiln.compile(mod, "llvm").export_library(
            folder / f"{name}_{label}.so", weights="external"))
    return out, shape, raw


def model_rows(names: list[str], folder: Path) -> None:
    """The table of issue 60's goal: two builds of one model loaded together."""
    print("| model | builds loaded | raw float (MiB) | one build's file (MiB) | files "
          "| PSS (MiB) | RSS (MiB) | PSS / file | PSS / raw | RSS / raw |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        libs, shape, raw = model_builds(name, folder)
        fd = os.open(str(libs["b1"]) + ".weights", os.O_RDONLY)
        try:  # the tensors' bytes (the file has holes where they are aligned)
            pool = sum(t.size for t in read_header(fd, "b1").tensors) / 2**20
        finally:
            os.close(fd)
        cases = {"b1 + b32 (pinned)": [f"{libs['b1']}@1", f"{libs['b32']}@32"],
                 "symbolic (one build), b1 and b32": [f"{libs['symbolic']}@1,32"]}
        for label, args in cases.items():
            child = MODEL_CHILD.replace("SHAPE", repr(list(shape[1:])))
            runs = [subprocess.run([sys.executable, "-c", child, *args], capture_output=True,
                                   text=True, check=True).stdout.split() for _ in range(3)]
            pss, rss, files = (str(statistics.median(float(r[i]) for r in runs)).rstrip("0")
                               .rstrip(".") for i in range(3))
            print(f"| {name} | {label} | {raw:.1f} | {pool:.1f} | {files} | {pss} | {rss} "
                  f"| {float(pss) / pool:.2f} | {float(pss) / raw:.2f} "
                  f"| {float(rss) / raw:.2f} |")


def build(mb: float, folder: Path) -> tuple[dict[str, Path], int]:
    k = 1024
    n = int(mb * 2**20) // (4 * k)
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, k), "float32")
        ib.ret(ib.emit(kiln.ops.call("matmul", x, g.Constant(w, "w")), "y"))
    mod = ib.get()
    out = {}
    for target in ("llvm", "c"):
        ex = kiln.compile(mod, target=target)
        out[f"{target}-embedded"] = ex.export_library(folder / f"{target}_emb.so")
        out[f"{target}-external"] = ex.export_library(folder / f"{target}_ext.so",
                                                      weights="external")
    return out, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64)
    ap.add_argument("--models", default="",
                    help="comma-separated: resnet50, bert (batch 1 + batch 32 builds)")
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs")
    if args.models:
        with tempfile.TemporaryDirectory() as tmp:
            model_rows(args.models.split(","), Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        libs, k = build(args.mb, Path(tmp))
        print(f"weights: {args.mb:.0f} MiB per library; llvm + c loaded together, one call each")
        print("| weights | PSS growth (MiB) | RSS growth (MiB) | load (ms, first) "
              "| load (ms, again) |")
        print("|---|---|---|---|---|")
        for mode in ("embedded", "external"):
            proc = subprocess.run([sys.executable, "-c", CHILD, str(libs[f"llvm-{mode}"]),
                                   str(libs[f"c-{mode}"]), str(k)],
                                  capture_output=True, text=True, check=True)
            pss, rss, first, again = proc.stdout.split()
            print(f"| {mode} | {pss} | {rss} | {first} | {again} |")


if __name__ == "__main__":
    main()
