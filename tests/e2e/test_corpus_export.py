"""Every corpus module, exported as .so and .tar for llvm and c, loads in a fresh
Python process and gives results bit-for-bit equal to `jit()` (issue 5).

The corpus bundles of test_corpus_backends are reused (compiled once per
target); each executable is exported both ways, every static-shape function is
run through `jit()` on seeded inputs, and one fresh interpreter loads every file
and reruns the same calls. Results are compared as raw bytes.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_corpus_backends import CORPUS, _executable, unsupported

from kiln.errors import CallError

RUNNER = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    from kiln.runtime import load_module

    def call(fn, sig, args):
        if sig["kind"] == "graph":
            out = fn(*args[:len(sig["params"])])
            return list(out) if isinstance(out, tuple) else [out]
        fn(*args)
        return [a for a in args if isinstance(a, np.ndarray)]

    jobs = pickle.load(open(sys.argv[1], "rb"))
    libs, results = {}, []
    for path, func, args in jobs:
        if path not in libs:
            libs[path] = load_module(path)
        lib = libs[path]
        results.append(call(lib[func], lib.metadata["functions"][func], args))
    pickle.dump(results, open(sys.argv[2], "wb"))
""")


def call(fn: Any, sig: dict[str, Any], args: list[Any]) -> list[np.ndarray]:
    """Run `fn` like the runner does: graph functions return, tensor functions write."""
    if sig["kind"] == "graph":
        out = fn(*args[:len(sig["params"])])
        return list(out) if isinstance(out, tuple) else [out]
    fn(*args)
    return [a for a in args if isinstance(a, np.ndarray)]


def _copy(args: list[Any]) -> list[Any]:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_exported_corpus_reloads_bit_for_bit(target: str, tmp_path: Path) -> None:
    exported: dict[int, dict[str, str]] = {}
    jobs: list[tuple[str, str, list[Any]]] = []
    expected: list[tuple[str, list[np.ndarray]]] = []
    for case_name, case in sorted(CORPUS.items()):
        if unsupported(case.module()) is not None:
            continue
        ex = _executable(case_name, target)
        if id(ex) not in exported:
            stem = tmp_path / f"lib{len(exported)}"
            ex.export_library(f"{stem}.so")
            ex.export_library(f"{stem}.tar")
            exported[id(ex)] = {"so": f"{stem}.so", "tar": f"{stem}.tar"}
        for func_name in case.module().functions:
            seed = zlib.crc32(f"{case_name}/{func_name}".encode()) ^ 0xE4
            args = case.args(func_name, np.random.default_rng(seed))
            sig = ex.metadata["functions"][func_name]
            try:
                want = call(ex[func_name], sig, _copy(args))
            except CallError:
                continue  # inputs this function rejects (e.g. a zero divisor)
            for kind in ("so", "tar"):
                jobs.append((exported[id(ex)][kind], func_name, _copy(args)))
                expected.append((f"{case_name}.{func_name} via .{kind}", want))
    assert len(exported) >= 2 and len(jobs) >= 60, "the corpus export test ran too little"

    job_file, out_file = tmp_path / "jobs.pkl", tmp_path / "out.pkl"
    job_file.write_bytes(pickle.dumps(jobs))
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(job_file), str(out_file)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = pickle.loads(out_file.read_bytes())
    mismatches = [
        what for (what, want), got in zip(expected, results, strict=True)
        if len(want) != len(got) or not all(_same_bits(w, r) for w, r in zip(want, got))
    ]
    assert not mismatches, f"{len(mismatches)} results differ after reload: {mismatches[:10]}"
