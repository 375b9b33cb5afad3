"""Call overhead benchmark: where a small model's call goes, in kiln and onnxruntime.

    .venv/bin/python bench/call_overhead.py [--model models/mlp.onnx | --net mlp]
                                            [--calls 20000] [--threads 2]

Compiles the model (default: the MLP of models/, batch 1; `--net` takes one of
bench/nets.py instead, e.g. `mlp`, the 784-512-512-10 MLP of bench/models.py) for
`Target.from_host()` and prints the median microseconds per call (per-call times,
every row in its own block after a pause, over `--calls` calls in 5 rounds, so a
shared machine's drift hits all rows alike) of:

- `fn(x)`: the whole Python call, results allocated (the fast path,
  docs/runtime.md "Functions");
- `fn(x, out=o)`: the same writing into a preallocated result;
- `prepared run()`: `fn.prepare(x, out=o)` run again (docs/runtime.md, "Prepared
  calls"): the C entry and the ctypes hand-off alone;
- `C entry`: the packed C entry called directly, its arguments packed beforehand;
- `C entry, 1 thread`: the same library loaded again with `num_threads=1`, so the
  difference to `C entry` is what handing the parallel loops to the pool costs
  or saves;
- `kernels`: the sum of the kernels' own times per call, from a second build with
  `profile=True` (docs/abi.md, "Profiling"); `C entry` minus it is the entry's checks;
- `ort run`, `ort IOBinding`: onnxruntime's `InferenceSession.run` and its
  preallocated-buffer `run_with_iobinding`, with `--threads` intra-op threads;
- `pack_arguments`: packing the arguments the general way (no call).

Prints a table and the pool's counters; asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from harness import alternating_blocks_ms, describe_target

import kiln
from kiln.frontend import from_onnx
from kiln.runtime import ctypes_abi

ROOT = Path(__file__).resolve().parent.parent


def load(opts: argparse.Namespace) -> onnx.ModelProto:
    if opts.net is None:
        return onnx.load(opts.model)
    from nets import MODELS

    return MODELS[opts.net]()[0]


def ort_rows(model: onnx.ModelProto, args: list[np.ndarray], outs: tuple[np.ndarray, ...],
             threads: int) -> dict[str, Callable[[], object]]:
    """onnxruntime's plain run and its IOBinding run (inputs and outputs bound once)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = dict(zip(names, args, strict=True))
    binding = session.io_binding()
    for name, array in feed.items():
        binding.bind_cpu_input(name, array)
    for o, array in zip(session.get_outputs(), outs, strict=True):
        binding.bind_output(o.name, "cpu", 0, array.dtype, list(array.shape),
                            array.ctypes.data)
    return {"ort run": lambda: session.run(None, feed),
            "ort IOBinding": lambda: session.run_with_iobinding(binding)}


def kernel_us(model: onnx.ModelProto, target: kiln.target.Target, args: list[np.ndarray],
              calls: int) -> float:
    """Microseconds per call the kernels themselves take (a profile=True build)."""
    ex = kiln.compile(from_onnx(model), target, profile=True)
    fn = ex["main"]
    for _ in range(min(calls, 200)):
        fn(*args)
    lib: Any = ex._module
    lib.profile_reset()
    for _ in range(calls):
        fn(*args)
    rows = [r for r in lib.profile() if r.function == "main" and r.kernel is not None]
    return sum(r.total_ns for r in rows) / max(calls, 1) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "mlp.onnx"))
    parser.add_argument("--net", default=None, help="a model of bench/nets.py instead")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of kiln's parallel loops and of ort (default 2)")
    opts = parser.parse_args()

    target = kiln.target.Target.from_host()
    kiln.runtime.set_num_threads(opts.threads)
    model = load(opts)
    ex = kiln.compile(from_onnx(model), target)
    fn = ex["main"]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(tuple(p["shape"])).astype(np.dtype(p["dtype"]))
            for p in fn.params]
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    values = [*args, *outs]
    packed, codes, keep = ctypes_abi.pack_arguments(values, fn._wheres)
    n = len(values)
    lib: Any = ex._module
    run = fn.prepare(*args, out=out)

    tmp = tempfile.TemporaryDirectory()
    ex.export_library(Path(tmp.name) / "one.so")
    single = kiln.runtime.load_module(Path(tmp.name) / "one.so", num_threads=1)["main"]

    rows: dict[str, Callable[[], object]] = {
        "fn(x)": lambda: fn(*args),
        "fn(x, out=o)": lambda: fn(*args, out=out),
        "prepared run()": run,
        "C entry": lambda: fn.c_func(packed, codes, n),
        "C entry, 1 thread": lambda: single.c_func(packed, codes, n),
        **ort_rows(model, args, outs, opts.threads),
        "pack_arguments": lambda: ctypes_abi.pack_arguments(values, fn._wheres),
    }
    name = opts.net or Path(opts.model).name
    print(f"model {name}, target {describe_target(target)}, {opts.threads} threads, "
          f"{opts.calls} calls per row")
    times = alternating_blocks_ms(rows, opts.calls)
    for row, ms in times.items():
        print(f"  {row:<18} {ms * 1e3:8.2f} us/call")
    print(f"  {'kernels':<18} {kernel_us(model, target, args, opts.calls // 5):8.2f} us/call "
          "(profile=True build)")
    print(f"  pool: {lib.pool_stats()}")
    del keep
    tmp.cleanup()


if __name__ == "__main__":
    main()
