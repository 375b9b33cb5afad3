"""Session start: `kiln.InferenceSession(path)` on a compile-cache miss and hit against
`onnxruntime.InferenceSession(path)`, for BERT-base (`bert` of bench/nets.py) and
ViT-B/16 (`vit` of bench/zoo_set.py).

    .venv/bin/python bench/session_start.py [--models bert vit] [--repeat 3]

Each model is saved as an .onnx file in a temporary folder, with an empty compile cache
of its own ($KILN_CACHE_DIR there). In this process, kiln.session and onnxruntime
imported before any timing, 2 threads each:

- `ort`: onnxruntime's session creation (best of --repeat);
- `miss`: kiln's first session (import, passes, codegen, link, store);
- `hit`: kiln's session again, the previous one closed (best of --repeat): the model
  file is not hashed again (the cache remembers its digest with its stat identity);
- `hit, hashed`: the same with the remembered digest deleted first, so the 340 MB model
  file is hashed again (what the first session after an edit, or in a new cache, pays);
- `hit, new process` / `ort, new process`: the same in a fresh interpreter (module import
  not timed; the lazy imports inside the constructor are), the first session there;
- `1st run`: the first `run` after a hit and after onnxruntime's creation (a cached
  library checks its weights against its hashes before its first call, kiln.runtime.weights).

Prints a table with the ratio hit / ort; asserts nothing (this is not a test).
`--write-docs` also writes it into the block `session-start` of docs/performance.md, under
a line naming the CPU, the date and the load average (bench/doc_table.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block

import kiln.session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
THREADS = 2

_CHILD = """
import sys, time
import {module}
t = time.perf_counter()
{create}
print(time.perf_counter() - t)
"""


def builders() -> dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, list[int]]]]]:
    import nets
    import zoo_set

    return {"bert": nets.bert, "vit": zoo_set.ZOO["vit"]}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def kiln_session(path: Path) -> kiln.InferenceSession:
    options = kiln.SessionOptions()
    options.intra_op_num_threads = THREADS
    return kiln.InferenceSession(path, options)


def timed(make: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t = time.perf_counter()
    made = make()
    return time.perf_counter() - t, made


def first_run(session: Any, feed: dict[str, np.ndarray]) -> float:
    t = time.perf_counter()
    session.run(None, feed)
    return time.perf_counter() - t


def in_new_process(module: str, create: str) -> float:
    done = subprocess.run([sys.executable, "-c", _CHILD.format(module=module, create=create)],
                          capture_output=True, text=True, check=True, env=os.environ)
    return float(done.stdout.strip().splitlines()[-1])


def measure(name: str, folder: Path, repeat: int) -> dict[str, float]:
    model, shapes = builders()[name]()
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    del model
    rng = np.random.default_rng(0)
    feed = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    out: dict[str, float] = {}
    out["ort"] = min(timed(lambda: ort_session(path))[0] for _ in range(repeat))
    out["ort 1st run"] = first_run(ort_session(path), feed)
    out["miss"], sess = timed(lambda: kiln_session(path))
    assert not sess.cache_hit
    del sess
    hits = []
    for _ in range(repeat):
        seconds, sess = timed(lambda: kiln_session(path))
        assert sess.cache_hit
        hits.append(seconds)
        if len(hits) < repeat:
            del sess
    out["hit"] = min(hits)
    out["hit 1st run"] = first_run(sess, feed)
    del sess
    hashed = []
    for _ in range(repeat):
        shutil.rmtree(Path(os.environ["KILN_CACHE_DIR"]) / "v2" / "digests",
                      ignore_errors=True)
        seconds, sess = timed(lambda: kiln_session(path))
        assert sess.cache_hit
        hashed.append(seconds)
        del sess
    out["hit, hashed"] = min(hashed)
    child = (f"o = kiln.SessionOptions(); o.intra_op_num_threads = {THREADS}; "
             f"s = kiln.InferenceSession({str(path)!r}, o); assert s.cache_hit")
    out["hit, new process"] = min(in_new_process("kiln.session; import kiln", child)
                                  for _ in range(repeat))
    ort_child = (f"o = onnxruntime.SessionOptions(); o.intra_op_num_threads = {THREADS}; "
                 f"onnxruntime.InferenceSession({str(path)!r}, o, "
                 "providers=['CPUExecutionProvider'])")
    out["ort, new process"] = min(in_new_process("onnxruntime", ort_child)
                                  for _ in range(repeat))
    return out


COLUMNS = ["ort", "miss", "hit", "hit/ort", "hit, hashed", "hashed/ort", "ort, new process",
           "hit, new process", "new/new", "ort 1st run", "hit 1st run"]


def cell(r: dict[str, float], column: str) -> str:
    """A ratio as `0.08x`, seconds with three decimals."""
    return f"{r[column]:.2f}x" if "/" in column else f"{r[column]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert", "vit"],
                        choices=sorted(builders()))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true",
                        help="write the table to docs/performance.md (block 'session-start')")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; {THREADS} threads; seconds (best of {args.repeat})")
    print(f"{'model':8}" + "".join(f"{c:>18}" for c in COLUMNS))
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-session-start-") as tmp:
        os.environ["KILN_CACHE_DIR"] = str(Path(tmp) / "cache")
        for name in args.models:
            r = measure(name, Path(tmp), args.repeat)
            r["hit/ort"] = r["hit"] / r["ort"]
            r["hashed/ort"] = r["hit, hashed"] / r["ort"]
            r["new/new"] = r["hit, new process"] / r["ort, new process"]
            print(f"{name:8}" + "".join(f"{cell(r, c):>18}" for c in COLUMNS), flush=True)
            rows.append([name, *(cell(r, c) for c in COLUMNS)])
    if args.write_docs:
        command = " ".join(["bench/session_start.py", *sys.argv[1:]])
        isa = f"{THREADS} threads each, seconds (best of {args.repeat})"
        write_block(ROOT / "docs" / "performance.md", "session-start", [
            machine_line(command, isa, load_before, os.getloadavg()[0]), "",
            *markdown_table(["model", *COLUMNS], rows)])


if __name__ == "__main__":
    main()
