"""Reproducible builds (docs/format.md): the same model compiled for the same target
in two processes gives bit-identical .so, .tar, .a, MLF and wasm files.

The two builds differ in everything a build must not depend on: the hash seed
(set and dict order of strings), the working and temporary directories, and
the compile cache (off in both, so nothing is shared between them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(__file__).with_name("reproducible_build.py")
TESTS = Path(__file__).resolve().parents[1]  # for `support`


def _build(out: Path, seed: int, work: Path, wasm: bool) -> None:
    work.mkdir()
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONHASHSEED=str(seed), KILN_CACHE="0", TMPDIR=str(work),
               PYTHONPATH=path)
    env.pop("SOURCE_DATE_EPOCH", None)
    args = [sys.executable, str(BUILD), str(out)] + (["--wasm"] if wasm else [])
    proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow  # runs first (tests/conftest.py)
def test_two_processes_build_identical_files(tmp_path: Path) -> None:
    wasm = bool(shutil.which("wasm-ld") or shutil.which("wasm-ld-14"))
    first, second = tmp_path / "first", tmp_path / "second"
    _build(first, 1, tmp_path / "work1", wasm)
    _build(second, 2, tmp_path / "work2", wasm)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    kinds = {n.split("-", 1)[-1] for n in names}
    assert {"llvm.so", "llvm.tar", "llvm.a", "c.so", "c.tar", "c.a", "mlf.tar"} <= kinds
    if wasm:
        assert any(n.endswith(".wasm") for n in names)
    differ = [n for n in names if (first / n).read_bytes() != (second / n).read_bytes()]
    assert not differ, f"not reproducible: {differ}"
    if not wasm:
        pytest.skip("wasm-ld is missing (make test installs lld): wasm not compared")
