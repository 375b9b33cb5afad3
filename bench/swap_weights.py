"""Swapping weights into a shipped library vs compiling the new weights.

    .venv/bin/python bench/swap_weights.py [--models resnet50,bert] [--target llvm]
                                           [--size full|test]

For each model of tests/models/zoo.py (ResNet-50 at 224x224, BERT-base at sequence
128) and a "fine-tuned" copy of it (every float weight scaled by 1 + 0.01 N(0, 1),
variances kept positive), in a fresh, empty `KILN_CACHE_DIR`:

- `compile s`: `kiln.compile` of the fine-tuned `.onnx` file plus `export_library` in
  a fresh process with an empty compile cache (what a user without swap_weights pays
  for a new checkpoint: the imports, the passes, the code generation, the link);
- `swap s`: in a fresh process where kiln's compiler packages cannot be imported (a
  deploy host: numpy only), `load_module` of the original model's library, then
  `module.swap_weights(path)` of the fine-tuned `.onnx` file (`onnx` s: read with
  kiln's own protobuf reader) and of an `.npz` of its weights (`npz` s), each timed
  alone (both through the library's C entry); `ratio` is the ONNX swap over the
  compile; then, the weights already in memory (a dict), `numpy s` the numpy replay
  (as a library without its swap program swaps), `dict s` Module.swap_weights with
  the library's C, and `C s` the C entry `{prefix}_swap_weights` alone (what a C host
  pays: rebuild and install);
- `cpu`: the same in CPU seconds (the compiling process and its children; the
  swapping process), which a loaded machine perturbs less than wall time;
- `equal`: the swapped library's output against the fresh compile's, bit for bit, else
  the relative L2 error.

Prints a table; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the zoo builds its graphs with tests/support
sys.path.insert(0, str(ROOT / "tests" / "models"))

CHILD = r"""
import importlib.abc, json, sys, time
import numpy as np

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if parts[0] in ("onnx", "llvmlite") or (parts[0] == "kiln" and len(parts) > 1
                and parts[1] in ("ir", "transform", "codegen", "ops", "kernels", "frontend",
                                 "driver", "export", "target")):
            raise ImportError("blocked on this deploy host: " + name)
sys.meta_path.insert(0, Block())
from kiln.runtime import load_module

lib_path, onnx_path, npz_path, feeds_path, out_path = sys.argv[1:6]
lib = load_module(lib_path, verify_weights=False)
with np.load(feeds_path) as f:
    feeds = [f[k] for k in f.files]
lib["main"](*feeds)
times = {}
for key, source in (("onnx", onnx_path), ("npz", npz_path)):
    t, cpu = time.perf_counter(), time.process_time()
    lib.swap_weights(source)
    times[key] = time.perf_counter() - t
    times[key + "_cpu"] = time.process_time() - cpu
from kiln.runtime import swap
with np.load(npz_path) as f:
    named = {k: f[k] for k in f.files}
native = swap.native_entry
entry = native(lib)
swap.native_entry = lambda _lib: None  # the numpy replay, as an older library swaps
t = time.perf_counter()
lib.swap_weights(named)
times["numpy"] = time.perf_counter() - t
swap.native_entry = native
t = time.perf_counter()
lib.swap_weights(named)
times["dict"] = time.perf_counter() - t
times["c"] = None
if entry is not None:  # the library's {prefix}_swap_weights alone, the weights in memory
    t = time.perf_counter()
    swap.native_swap(lib, entry, named)
    times["c"] = time.perf_counter() - t
out = lib["main"](*feeds)
np.save(out_path, out[0] if isinstance(out, tuple) else out)
print(json.dumps(times))
"""


def fine_tuned(model: onnx.ModelProto, seed: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """`model` with its float weights nudged, and those weights by name."""
    rng = np.random.default_rng(seed)
    new = {}
    for init in model.graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype == np.float32 and w.size > 1:
            w = (w * (1 + 0.01 * rng.standard_normal(w.shape))).astype(np.float32)
        new[init.name] = w
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(new[init.name], init.name))
    return out, new


# The fine-tuned model compiled as a user would without swap_weights: a fresh process
# with an empty compile cache.
COMPILE = """
import sys, kiln
kiln.compile(sys.argv[1], sys.argv[2]).export_library(sys.argv[3])
"""


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the C compiler, the linker)."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(name: str, target: str, work: Path, size: str) -> dict[str, object]:
    from zoo import ZOO  # lazy: found through the sys.path entries set above

    import kiln  # heavy: the compiler, imported once the model is chosen

    entry = ZOO[name]
    model = entry.build(**(entry.full if size == "full" else entry.test))
    tuned, weights = fine_tuned(model, 1)
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    np.savez(work / "feeds.npz", **feeds)
    onnx.save(tuned, work / "tuned.onnx")
    np.savez(work / "tuned.npz", **weights)
    kiln.compile(model, target).export_library(work / "model.so")
    fresh = work / "fresh.so"
    t, cpu = time.perf_counter(), _cpu()
    subprocess.run([sys.executable, "-c", COMPILE, str(work / "tuned.onnx"), target,
                    str(fresh)], check=True,
                   env={**os.environ, "KILN_CACHE_DIR": str(work / "fresh_cache")})
    compile_s, compile_cpu = time.perf_counter() - t, _cpu() - cpu
    from kiln.runtime import load_module  # heavy: with the compiler above

    with load_module(fresh) as lib:
        want = lib["main"](*feeds.values())
    want = want[0] if isinstance(want, tuple) else want
    proc = subprocess.run([sys.executable, "-c", CHILD, str(work / "model.so"),
                           str(work / "tuned.onnx"), str(work / "tuned.npz"),
                           str(work / "feeds.npz"), str(work / "out.npy")],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the deploy-host process failed:\n{proc.stderr[-3000:]}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    got = np.load(work / "out.npy")
    err = float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))
    return {"model": name, "MB": sum(w.nbytes for w in weights.values()) / 1e6,
            "compile": compile_s, "onnx": times["onnx"], "npz": times["npz"],
            "compile_cpu": compile_cpu, "onnx_cpu": times["onnx_cpu"],
            "numpy": times["numpy"], "dict": times["dict"], "c": times["c"],
            "equal": "bit for bit" if np.array_equal(got, want) else f"rel L2 {err:.1e}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--size", choices=("full", "test"), default="full",
                        help="the published input size, or the tests' smaller one")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["KILN_CACHE_DIR"] = str(Path(tmp) / "cache")
            rows.append(measure(name, args.target, Path(tmp), args.size))
    print(f"{'model':10} {'weights MB':>10} {'compile s':>10} {'onnx s':>8} {'npz s':>8} "
          f"{'ratio':>7} {'compile cpu':>11} {'onnx cpu':>9} {'cpu ratio':>9} "
          f"{'numpy s':>8} {'dict s':>8} {'C s':>8}  equal")
    for r in rows:
        c = "-" if r["c"] is None else f"{r['c']:.3f}"
        print(f"{r['model']:10} {r['MB']:10.1f} {r['compile']:10.2f} {r['onnx']:8.3f} "
              f"{r['npz']:8.3f} {r['onnx'] / r['compile']:7.3f} {r['compile_cpu']:11.2f} "
              f"{r['onnx_cpu']:9.3f} {r['onnx_cpu'] / r['compile_cpu']:9.3f} "
              f"{r['numpy']:8.3f} {r['dict']:8.3f} {c:>8}  {r['equal']}")


if __name__ == "__main__":
    main()
