"""Running an exported library in a fresh interpreter, with a chosen thread count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import kiln

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from kiln.runtime import load_module

    lib = load_module(sys.argv[1])
    feeds = np.load(sys.argv[2], allow_pickle=True).item()
    out = lib["main"](*feeds.values())
    out = out if isinstance(out, tuple) else (out,)
    np.save(sys.argv[3], {k: np.asarray(o) for k, o in enumerate(out)}, allow_pickle=True)
    lib.close()
""")


def outputs_in_fresh_process(ex: kiln.driver.Executable, feeds: dict[str, np.ndarray],
                             tmp_path: Path, threads: int) -> list[np.ndarray]:
    """`ex`'s `main` on `feeds`, exported and run by a new process with
    `KILN_NUM_THREADS=threads` (the pool reads it once per process)."""
    lib, inputs, result = tmp_path / "lib.so", tmp_path / "in.npy", tmp_path / "out.npy"
    ex.export_library(lib)
    np.save(inputs, feeds, allow_pickle=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), KILN_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(lib), str(inputs), str(result)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    got = np.load(result, allow_pickle=True).item()
    return [got[k] for k in range(len(got))]
