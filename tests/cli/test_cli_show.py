"""kiln inspect --show prints one artifact: the host C source of the shipped MLP."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kiln_cli import one_line_error, run_kiln


def test_show_host_c_compiles(built: Path, tmp_path: Path) -> None:
    shown = run_kiln("inspect", "mlp.so", "--show", "host/host.c", "--format", "c", cwd=built)
    assert shown.returncode == 0, shown.stderr
    assert "main" in shown.stdout
    # what --show printed is the C source itself: a C compiler parses it
    src = tmp_path / "host.c"
    src.write_text(shown.stdout)
    cc = subprocess.run(["cc", "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr


def test_show_unknown_artifact_names_what_exists(built: Path) -> None:
    line = one_line_error(run_kiln("inspect", "mlp.so", "--show", "llvm/absent.bc", cwd=built))
    assert "'llvm/absent.bc'" in line and "host/host.c" in line
