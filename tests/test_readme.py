"""The README's tour and its command-line lines run as written (in a scratch directory)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_tour_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    script = tmp_path / "tour.py"  # the DSL decorators read their source file
    script.write_text(blocks[0])
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "def add_one" in proc.stdout and "kernels.o" in proc.stdout
    assert (tmp_path / "add_one.so").exists()


def test_readme_command_line_runs(tmp_path: Path) -> None:
    """Every line of the command-line section, `kiln` being this checkout's `python -m kiln`."""
    section = README.read_text().split("## The command line", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md's command-line section has no sh block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert any(line.startswith("kiln run ") for line in lines)
    (tmp_path / "models").symlink_to(ROOT / "models")
    python = shlex.quote(sys.executable)
    for line in lines:
        command = re.sub(r"^kiln ", f"{python} -m kiln ", line)
        command = re.sub(r"^python ", f"{python} ", command)
        proc = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-2000:]}"
        assert not proc.stderr, f"{line}\n{proc.stderr}"
    assert (tmp_path / "probs.npy").exists()
