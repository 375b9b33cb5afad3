"""`make demo`: compile the model shipped in models/ for this host, export it as one
.so, load it back through the runtime, run it, and print the result and timings."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln
from kiln.frontend import from_onnx
from kiln.runtime import load_module

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "mlp.onnx"


def _ms(t0: float) -> str:
    return f"{(time.perf_counter() - t0) * 1e3:8.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--out", default=None, help="where to write the .so (default: temp)")
    args = parser.parse_args(argv)


    target = kiln.Target.from_host()
    print(f"host target : {target.get('mtriple')} mcpu={target.get('mcpu')}")
    print(f"model       : {args.model}")

    t0 = time.perf_counter()
    mod = from_onnx(args.model)
    print(f"import      : {_ms(t0)}")
    t0 = time.perf_counter()
    ex = kiln.compile(mod, target)
    print(f"compile     : {_ms(t0)}   ({len(ex.artifacts)} artifacts)")

    out_dir = Path(args.out).parent if args.out else Path(tempfile.mkdtemp(prefix="kiln-demo-"))
    so_path = Path(args.out) if args.out else out_dir / "model.so"
    t0 = time.perf_counter()
    ex.export_library(str(so_path))
    print(f"export      : {_ms(t0)}   -> {so_path} ({so_path.stat().st_size / 1024:.1f} KiB)")

    t0 = time.perf_counter()
    lib = load_module(str(so_path))
    print(f"load        : {_ms(t0)}")

    sig = lib.metadata["functions"]["main"]
    rng = np.random.default_rng(0)
    inputs = {p["name"]: rng.standard_normal(p["shape"]).astype(p["dtype"])
              for p in sig["params"]}
    t0 = time.perf_counter()
    out = lib["main"](**inputs)
    print(f"first call  : {_ms(t0)}")
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        lib["main"](**inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"steady call : {statistics.median(times):8.3f} ms (median of 20)")

    outs = out if isinstance(out, tuple) else (out,)
    for k, o in enumerate(outs):
        head = np.array2string(o.ravel()[:8], precision=4)
        print(f"output {k}    : shape {o.shape} {o.dtype}: {head}")
    try:
        import onnxruntime as ort  # optional: onnxruntime (the test extra)
    except ImportError:
        return 0
    sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    ref = sess.run(None, inputs)
    for o, r in zip(outs, ref):
        err = float(np.linalg.norm(o - r)) / max(float(np.linalg.norm(r)), 1e-30)
        print(f"vs onnxruntime: relative L2 error {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
