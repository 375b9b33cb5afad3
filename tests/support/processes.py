"""Fresh interpreters: a child Python that imports what this process imports (kiln,
the test support, the test folders) without editing its sys.path, an exported
library run in one with a chosen thread count, and hostile files tried in batches of
workers that a crash or a hang costs only the file it was on (`run_isolated`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


def child_env(*paths: str | Path, **variables: str) -> dict[str, str]:
    """This process's environment for a child interpreter: PYTHONPATH is `paths`
    followed by this process's sys.path, then `variables` are set."""
    search = [str(p) for p in paths] + [p for p in sys.path if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(search), **variables)


def run_python(code: str | Path, *args: str, paths: tuple[str | Path, ...] = (),
               env: dict[str, str] | None = None, timeout: float = 300,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` (source text, or a script file) in a fresh interpreter with `args`;
    the child imports as this process does (child_env), plus `paths` first. Output is
    captured as text; the caller checks the return code."""
    command = [str(code)] if isinstance(code, Path) else ["-c", code]
    return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=cwd,
                          env=child_env(*paths, **(env or {})))


#: A worker's watchdog for one item (`run_isolated`): arm it before trying the item,
#: cancel it after. faulthandler's timer thread exits the process (printing "Timeout
#: (") while the main thread spins in native code, e.g. a damaged library's loop.
WATCHDOG = """
import faulthandler

def watch(seconds):
    faulthandler.dump_traceback_later(seconds, exit=True)

def unwatch():
    faulthandler.cancel_dump_traceback_later()
"""


def run_isolated(worker: str, args: list[str], items: list[Path], *, batch: int,
                 item_s: float, batch_s: float) -> dict[Path, list[Any]]:
    """Try each of `items` in worker processes, `batch` per worker: `worker` (Python
    source, run after WATCHDOG's `watch`/`unwatch`) gets `args`, then `item_s`, then
    its items as argv, and prints one JSON line `[item, *outcome]` per item it
    finishes, calling `watch(item_s)` before each and `unwatch()` after. An item whose
    worker died is `["crash:<code>"]`, or `["hang"]` when the watchdog or `batch_s`
    stopped it; the rest of its batch runs in a new worker."""
    results: dict[Path, list[Any]] = {}
    pending = list(items)
    env = child_env()
    while pending:
        chunk, pending = pending[:batch], pending[batch:]
        try:
            proc = subprocess.run([sys.executable, "-c", WATCHDOG + worker, *args, str(item_s),
                                   *map(str, chunk)], capture_output=True, text=True,
                                  timeout=batch_s, env=env, check=False)
            lines, code = proc.stdout.splitlines(), proc.returncode
            if code != 0 and "Timeout (" in proc.stderr:  # the watchdog fired
                code = None
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or b""
            lines, code = (out.decode() if isinstance(out, bytes) else out).splitlines(), None
        for line in lines:
            item, *outcome = json.loads(line)
            results[Path(item)] = outcome
        done = [p for p in chunk if p in results]
        if len(done) < len(chunk):
            culprit = chunk[len(done)]
            results[culprit] = ["hang"] if code is None else [f"crash:{code}"]
            pending = chunk[len(done) + 1:] + pending
    return results


def outputs_in_fresh_process(ex: kiln.driver.Executable, feeds: dict[str, np.ndarray],
                             tmp_path: Path, threads: int) -> list[np.ndarray]:
    """`ex`'s `main` on `feeds`, exported and run by a new process with
    `KILN_NUM_THREADS=threads` (the pool reads it once per process)."""
    lib, inputs, result = tmp_path / "lib.so", tmp_path / "in.npy", tmp_path / "out.npy"
    ex.export_library(lib)
    np.save(inputs, feeds, allow_pickle=True)
    proc = run_python(SCRIPT, str(lib), str(inputs), str(result),
                      env={"KILN_NUM_THREADS": str(threads)})
    assert proc.returncode == 0, proc.stderr
    got = np.load(result, allow_pickle=True).item()
    return [got[k] for k in range(len(got))]
