"""Run the `kiln` command as a user runs it: a fresh process, real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "mlp.onnx"


def run_kiln(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m kiln ARGS` in `cwd`."""
    return subprocess.run([sys.executable, "-m", "kiln", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a failed command; fails unless it failed that way."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]
