"""`build_many`: every (model, target) cell of a build matrix as one task.

A cell imports the model, compiles it for the target and exports one file
with the suffix `kiln compile` is given for it (`cell_suffix`): `.so` for a
target with an operating system, this machine's or another's (linked by its
cross compiler, as `kiln compile -o model.so` links it), `.wasm` for wasm32,
`.tar` (objects and sources, linked on the deploy side) for a bare-metal target
and for a cross target whose C compiler the building node lacks. The file's
bytes come back through the executor (Ray's object store on a cluster) and are
written to `out_dir` as
`MODEL--TARGET.EXT`; nothing else needs a shared filesystem. A shared
`cache_dir` makes the cells share kiln's compile cache (kiln.driver.cache
locks its entries, so nodes may write it at once).

A cell that fails is reported with its error; the others go on.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import kiln
from kiln.distributed.executor import Executor, make_executor, task_node
from kiln.distributed.matrix import BuildMatrix
from kiln.errors import MissingDependencyError
from kiln.export.wasm import export_wasm
from kiln.frontend import from_onnx
from kiln.frontend.onnx.file_limits import read_model_file
from kiln.target import Target
from kiln.target.host import host_triple, triple_arch

SUMMARY_VERSION = 1
SUMMARY_FILE = "build-summary.json"


@dataclass(frozen=True)
class CellResult:
    """The outcome of one (model, target) cell."""

    model: str
    target: str
    ok: bool
    file: str | None = None
    bytes: int = 0
    seconds: float = 0.0
    cache_hit: bool = False
    node: str = ""
    error: str | None = None


def target_label(spec: Any) -> str:
    """A file-name-safe name for a matrix target: a string with every other character
    run made "_" ("web/wasm32" -> "web_wasm32", "llvm -mcpu=znver4" ->
    "llvm_-mcpu_znver4"), else (JSON, or longer than 64) kind + a short hash."""
    if isinstance(spec, str):
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec).strip("_.")
        if 0 < len(label) <= 64:
            return label

    target = Target(spec)
    return f"{target.kind.name}-{target.fingerprint()[:10]}"


def cell_suffix(triple: str) -> str:
    """The file a cell for `triple` writes, as `kiln compile` writes it (docs/cli.md):
    `.wasm` for wasm32, `.tar` for a bare-metal triple (`-none`: no loader for a
    shared library there), `.so` for any other, cross targets included."""
    if triple_arch(triple).startswith("wasm"):
        return ".wasm"
    return ".tar" if "-none" in triple else ".so"


def build_cell(model: bytes, shape: dict[str, Any], spec: Any, cache_dir: str | None
               ) -> dict[str, Any]:
    """Compile and export one cell; runs where the executor puts it. Returns the
    output's suffix and bytes, the time, whether the cache served it, the node and
    the kiln version that built it."""
    if cache_dir is not None:
        os.environ["KILN_CACHE_DIR"] = cache_dir

    start = time.perf_counter()
    target = kiln.Target.from_host() if spec == "host" else kiln.Target(spec)
    ex = kiln.compile(from_onnx(model, shape or None), target)
    suffix = cell_suffix(str(target.attrs.get("mtriple") or host_triple()))
    with tempfile.TemporaryDirectory(prefix="kiln-cell-") as tmp:
        out = Path(tmp) / f"model{suffix}"
        if suffix == ".wasm":
            export_wasm(ex, out)
        else:
            try:
                ex.export_library(out)
            except MissingDependencyError:  # no cross compiler on this node: link later
                suffix, out = ".tar", out.with_suffix(".tar")
                ex.export_library(out)
        data = out.read_bytes()
    return {"suffix": suffix, "data": data, "seconds": time.perf_counter() - start,
            "cache_hit": bool(ex.cache_hit), "node": task_node(),
            "kiln": kiln.__version__}


def build_many(matrix: BuildMatrix, out_dir: str | Path, *, executor: Executor | None = None,
               cache_dir: str | Path | None = None) -> list[CellResult]:
    """Build every cell of `matrix` into `out_dir`; one CellResult per cell, in the
    matrix's order, and `out_dir/build-summary.json` (with where the work ran)."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    own = executor is None
    runner = make_executor() if executor is None else executor
    try:
        # each file's size checked before it is read (docs/security.md, "Limits")
        models = {m.path: runner.put(read_model_file(m.path)) for m in matrix.models}
        cells = matrix.cells()
        cache = None if cache_dir is None else str(Path(cache_dir).resolve())
        outcomes = runner.run(build_cell, [(models[m.path], m.shape, t, cache)
                                           for m, t in cells])
        where = runner.describe()
    finally:
        if own:
            runner.close()
    results = []
    for (model, spec), outcome in zip(cells, outcomes, strict=True):
        label = target_label(spec)
        value = outcome.value
        if outcome.ok and value["kiln"] != kiln.__version__:
            outcome = type(outcome)(error=f"the node runs kiln {value['kiln']}, this "
                                          f"machine {kiln.__version__}: install one version")
        if not outcome.ok:
            results.append(CellResult(model.name, label, False, error=outcome.error))
            continue
        name = f"{model.name}--{label}{value['suffix']}"
        (out / name).write_bytes(value["data"])
        results.append(CellResult(model.name, label, True, name, len(value["data"]),
                                  round(value["seconds"], 3), value["cache_hit"],
                                  value["node"]))
    summary = {"version": SUMMARY_VERSION, "where": where,
               "cells": [asdict(r) for r in results]}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return results


def summary_table(results: Sequence[CellResult], where: dict[str, Any] | None = None) -> str:
    """The results as an aligned text table, then one line per failure."""
    rows = [("model", "target", "result", "seconds", "size", "cache", "node")]
    for r in results:
        rows.append((r.model, r.target, "ok" if r.ok else "FAILED",
                     f"{r.seconds:.2f}" if r.ok else "-",
                     f"{r.bytes / 1024:.0f} KiB" if r.ok else "-",
                     ("hit" if r.cache_hit else "miss") if r.ok else "-",
                     r.node[:12] if r.ok else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failed = [r for r in results if not r.ok]
    lines.append(f"{len(results) - len(failed)} of {len(results)} cells built")
    lines += [f"FAILED {r.model} for {r.target}: {r.error}" for r in failed]
    if where is not None:
        nodes = where.get("nodes") or []
        lines.append(f"ran on: {where.get('engine')}"
                     + (f" at {where.get('address')}, {len(nodes)} node(s)" if nodes else ""))
    return "\n".join(lines)
