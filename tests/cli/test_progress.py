"""`kiln compile` shows a live progress line on a terminal, and nothing when piped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from kiln_cli import ROOT, run_kiln

from support import small_models

# Long enough (several seconds with the compile cache off) for the display to appear.
BIG = "resnet18.onnx"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("progress")
    onnx.save(small_models.resnet18(), str(where / BIG))
    return where


def run_on_terminal(args: list[str], cwd: Path, **env_vars: str) -> tuple[int, bytes]:
    """Exit code and everything `python -m kiln ARGS` wrote to its pseudo-terminal
    (the compile cache off unless `env_vars` say otherwise)."""
    main, side = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "KILN_CACHE": "off",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           **env_vars}
    proc = subprocess.Popen([sys.executable, "-m", "kiln", *args], cwd=cwd, env=env,
                            stdin=side, stdout=side, stderr=side)
    os.close(side)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    return proc.wait(timeout=300), out


def test_progress_on_a_terminal(model: Path) -> None:
    code, out = run_on_terminal(["compile", BIG, "-t", "llvm", "-o", "tty.so"], model)
    assert code == 0, out.decode(errors="replace")
    assert f"compiling {BIG}: ".encode() in out
    assert b"passes done" in out and b"codegen" in out
    assert b"-> tty.so in" in out  # the result line follows the erased display


def test_no_progress_when_piped(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "off")
    done = run_kiln("compile", BIG, "-t", "llvm", "-o", "piped.so", cwd=model)
    assert done.returncode == 0, done.stderr
    assert "compiling" not in done.stdout + done.stderr
    assert "\x1b[" not in done.stdout + done.stderr
    assert done.stderr == "" and done.stdout.startswith(f"compiled {BIG} for llvm")



def test_the_line_waits_for_the_delay() -> None:
    """CompileProgress on a pseudo-terminal: nothing when the work ends before the delay,
    the line (then erased) when it runs past it."""
    import time

    from kiln.driver.progress import CompileProgress

    def written(show_after: float, work: float) -> bytes:
        main, side = pty.openpty()
        os.set_blocking(main, False)
        with open(side, "w", closefd=True) as terminal:
            with CompileProgress("m.onnx", stream=terminal, show_after=show_after) as p:
                assert p.enabled
                p.stage("pass simplify")
                time.sleep(work)
            terminal.flush()
            try:
                return os.read(main, 65536)
            except BlockingIOError:  # nothing was written
                return b""
            finally:
                os.close(main)

    assert written(show_after=30.0, work=0.0) == b""
    shown = written(show_after=0.0, work=0.5)
    assert b"compiling m.onnx: pass simplify (0 passes done)" in shown
