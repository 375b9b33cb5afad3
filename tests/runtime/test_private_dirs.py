"""Private temporary directories (kiln.runtime.private_dirs): a process that dies without
running its finalizers (os._exit, SIGKILL) leaves its directory, and the next process's
first private directory removes it; a live process's directory is never removed."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kiln.runtime import private_dirs
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir, sweep_stale_dirs
from support.processes import child_env, run_python

MAKE = ("import os, sys\n"
        "from kiln.runtime.private_dirs import make_private_dir\n"
        "print(make_private_dir('kiln-load-'), flush=True)\n")


def test_a_dead_owners_dir_is_swept_and_a_live_ones_is_not(tmp_path: Path) -> None:
    exited = run_python(MAKE + "os._exit(0)\n", env={"TMPDIR": str(tmp_path)})
    assert exited.returncode == 0, exited.stderr
    left = Path(exited.stdout.strip())
    assert left.parent == tmp_path and left.is_dir()  # no finalizer ran

    with subprocess.Popen([sys.executable, "-c", MAKE + "sys.stdin.read()\n"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=child_env(TMPDIR=str(tmp_path))) as live:
        assert live.stdout is not None
        held = Path(live.stdout.readline().strip())
        assert held.is_dir() and not left.exists()  # swept by the next process's first one
        foreign = tmp_path / "kiln-load-not-ours"  # no owner file: another program's
        foreign.mkdir()
        assert sweep_stale_dirs(tmp_path) == []
        assert held.is_dir() and foreign.is_dir()
        live.kill()  # SIGKILL: its lock goes with it
        live.wait()
    assert sweep_stale_dirs(tmp_path) == [held]
    assert foreign.is_dir()


def test_the_first_private_dir_sweeps_and_removal_releases_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(private_dirs, "_swept", True)
    stale = Path(make_private_dir("kiln-session-"))
    # Dropping the descriptor without removing the directory is what a dead process leaves.
    private_dirs.os.close(private_dirs._owners.pop(str(stale)))

    monkeypatch.setattr(private_dirs, "_swept", False)
    fresh = Path(make_private_dir("kiln-load-"))
    assert not stale.exists() and fresh.is_dir()
    assert sweep_stale_dirs(tmp_path) == []  # our own live directory is locked
    remove_private_dir(str(fresh))
    assert not fresh.exists() and str(fresh) not in private_dirs._owners
