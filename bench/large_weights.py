"""More than 4 GiB of float32 weights: compile memory, export, load and run (issue 60).

    .venv/bin/python bench/large_weights.py [--k 16384] [--n 36864] [--rows 4]
                                            [--codegen llvm] [--skip-ort] [--keep DIR]

The model is `y = relu(x @ W0) @ W1` with W0 of shape (k, n) and W1 (n, k): at the
default sizes two 16384 x 36864 float32 MatMuls, 4.5 GiB, written as an ONNX file with
external data (the protobuf itself holds 2 GiB at most), block by block, never whole
in memory. Each step runs in a fresh process, one at a time (the host needs about
2.2x the weights free):

1. compile: `kiln.compile(model.onnx, codegen)` with the compile cache off, then the
   library exported with its weights embedded and with `weights="external"`; prints
   the compile and export seconds and the process's peak RSS (ru_maxrss) against the
   weights' size (the goal: at most 2.2x);
2. run, per library: `load_module` (verify_weights lazy) timed, the first call, a
   second call; the output saved;
3. onnxruntime (without its weight prepacking, which would copy the 4.5 GiB) on the same
   file, and the largest difference printed.

Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

COMPILE = r"""
import json, os, resource, sys, time
os.environ["KILN_CACHE"] = "0"
import kiln
model, codegen, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
ex = kiln.compile(model, codegen)
t1 = time.perf_counter()
ex.export_library(out + "/embedded.so")
t2 = time.perf_counter()
ex.export_library(out + "/external.so", weights="external")
t3 = time.perf_counter()
print(json.dumps({"compile_s": t1 - t0, "embedded_s": t2 - t1, "external_s": t3 - t2,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

RUN = r"""
import json, resource, sys, time
import numpy as np
from kiln.runtime import load_module
so, x_file, y_file = sys.argv[1:4]
x = np.load(x_file)
t0 = time.perf_counter()
lib = load_module(so)
t1 = time.perf_counter()
y = lib["main"](x)
t2 = time.perf_counter()
lib["main"](x)
t3 = time.perf_counter()
np.save(y_file, y)
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3,
                  "second_ms": (t3 - t2) * 1e3,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

ORT = r"""
import sys
import numpy as np
import onnxruntime as ort
options = ort.SessionOptions()
options.add_session_config_entry("session.disable_prepacking", "1")
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
np.save(sys.argv[3], session.run(None, {"x": np.load(sys.argv[2])})[0])
"""


def write_model(folder: Path, k: int, n: int, rows: int) -> tuple[Path, int]:
    """The ONNX file and its external data (written in blocks of rows); its weight bytes."""
    rng = np.random.default_rng(0)
    data = folder / "weights.data"
    inits = []
    with open(data, "wb") as f:
        for name, (a, b) in (("w0", (k, n)), ("w1", (n, k))):
            offset = f.tell()
            for start in range(0, a, 1024):
                block = rng.standard_normal((min(1024, a - start), b), dtype=np.float32)
                f.write((block * np.float32(a ** -0.5)).tobytes())
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[a, b])
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", str(offset)),
                               ("length", str(a * b * 4))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            inits.append(t)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["y"])]
    graph = helper.make_graph(
        nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "large.onnx"
    onnx.save(model, path)
    return path, 2 * k * n * 4


def child(code: str, *args: object) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--n", type=int, default=36864)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--codegen", default="llvm")
    parser.add_argument("--skip-ort", action="store_true")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep the files "
                        "(a model written there before is used again)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-large-", dir=Path.cwd()) as tmp:
        folder = opts.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        model, size = folder / "large.onnx", 2 * opts.k * opts.n * 4
        if not model.exists():
            model, size = write_model(folder, opts.k, opts.n, opts.rows)
        gib = size / 2**30
        print(f"weights: {gib:.2f} GiB float32 ({opts.k} x {opts.n}, twice)", flush=True)
        built = child(COMPILE, model, opts.codegen, folder)
        print(f"compile {built['compile_s']:.1f} s, export embedded {built['embedded_s']:.1f} s, "
              f"external {built['external_s']:.1f} s; peak RSS "
              f"{built['peak_kib'] / 2**20:.2f} GiB = {built['peak_kib'] * 1024 / size:.2f}x "
              "the weights", flush=True)
        for kind in ("embedded", "external"):
            so = folder / f"{kind}.so"
            print(f"{kind}: library {so.stat().st_size / 2**30:.2f} GiB on disk", flush=True)
        x = np.random.default_rng(1).standard_normal((opts.rows, opts.k), dtype=np.float32)
        np.save(folder / "x.npy", x)
        outputs = {}
        for kind in ("embedded", "external"):
            ran = child(RUN, folder / f"{kind}.so", folder / "x.npy", folder / f"{kind}.npy")
            outputs[kind] = np.load(folder / f"{kind}.npy")
            print(f"{kind}: load {ran['load_ms']:.1f} ms, first call {ran['first_ms']:.0f} ms, "
                  f"second {ran['second_ms']:.0f} ms, peak RSS "
                  f"{ran['peak_kib'] / 2**20:.2f} GiB", flush=True)
        if not opts.skip_ort:
            child(ORT, model, folder / "x.npy", folder / "ort.npy")
            ref = np.load(folder / "ort.npy")
            for kind, y in outputs.items():
                rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
                print(f"{kind} vs onnxruntime: max |diff| {np.abs(y - ref).max():.2e}, "
                      f"rel L2 {rel:.1e}")


if __name__ == "__main__":
    main()
