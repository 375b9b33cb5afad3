"""Checks shared by the hand-written kernel tests (convolution, GEMM): one ONNX model of
independent cases, compared with onnxruntime here and in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import kiln

FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    from kiln.runtime import load_module

    lib = load_module(sys.argv[1])
    feeds = np.load(sys.argv[2], allow_pickle=True).item()
    out = lib["main"](*feeds.values())
    np.save(sys.argv[3], {k: np.asarray(o) for k, o in enumerate(out)}, allow_pickle=True)
    lib.close()
""")


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                 cases: Sequence[Any], tol: float) -> None:
    """Every output within relative L2 error `tol` of the reference (naming the case)."""
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (k, cases[k])
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        assert err < tol, (k, cases[k], err)


def run_in_fresh_process(ex: kiln.driver.Executable, feeds: dict[str, np.ndarray],
                         tmp_path: Path, threads: int) -> list[np.ndarray]:
    """The outputs of `ex`'s exported library run in a new interpreter with
    KILN_NUM_THREADS=`threads`."""
    lib, inputs, result = tmp_path / "kernels.so", tmp_path / "in.npy", tmp_path / "out.npy"
    ex.export_library(lib)
    np.save(inputs, feeds, allow_pickle=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), KILN_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", FRESH, str(lib), str(inputs), str(result)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    got = np.load(result, allow_pickle=True).item()
    return [got[k] for k in range(len(got))]
