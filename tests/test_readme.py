"""The README's tour runs as written (in a scratch directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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
