"""Every code block of README.md and docs/**/*.md runs (the convention: tests/docs/doc_blocks.py).

One fresh process per Markdown file, from a scratch directory with the repository's
`models/` and `examples/` linked in; a failure names the file and the block's line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import blocks, shell_script

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("doc_blocks.py")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The pages whose blocks take longest (dozens of CLI processes; torch exports): marked
# slow so they start first (tests/conftest.py).
SLOW_PAGES = {"docs/cli.md", "docs/tutorials/from-pytorch.md"}


def _shims(bin_dir: Path) -> None:
    """`kiln` and `python` on PATH are this checkout's, as after `make` and activating .venv."""
    bin_dir.mkdir()
    for name, command in (("kiln", f'exec "{sys.executable}" -m kiln "$@"'),
                          ("python", f'exec "{sys.executable}" "$@"'),
                          ("python3", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(0o755)


@pytest.mark.parametrize("page", [
    pytest.param(p, id=str(p.relative_to(ROOT)),
                 marks=[pytest.mark.slow] if str(p.relative_to(ROOT)) in SLOW_PAGES else [])
    for p in PAGES])
def test_code_blocks_run(page: Path, tmp_path: Path) -> None:
    if not blocks(page.read_text()):
        pytest.skip(f"{page.relative_to(ROOT)} has no runnable block")
    for name in ("models", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    _shims(tmp_path / ".bin")
    env = {**os.environ, "PATH": f"{tmp_path / '.bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(RUNNER), str(page)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}", pytrace=False)


def test_blocks_are_found_with_their_lines() -> None:
    text = "# t\n\n```python\nx = 1\n```\n\n```text\nnot run\n```\n\n```console\n$ ls\nout\n```\n"
    found = blocks(text)
    assert [(b.kind, b.line) for b in found] == [("python", 4), ("console", 12)]
    script = shell_script(found[1]).splitlines()
    assert script[11] == "ls" and script[12] == ""  # line 12 of the page; output dropped


def test_machine_changing_lines_are_skipped() -> None:
    page = ("x\n```sh\nmake demo\npip install kiln-tensor\nkiln --version\n"
            ".venv/bin/python bench/models.py --models small\npython bench_notes.py\n```\n")
    (block,) = blocks(page)
    script = shell_script(block).splitlines()
    assert script[2:7] == [": skipped 'make demo'", ": skipped 'pip install kiln-tensor'",
                           "kiln --version",
                           ": skipped '.venv/bin/python bench/models.py --models small'",
                           "python bench_notes.py"]


def _run_page(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    page = tmp_path / "page.md"
    page.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(RUNNER), str(page)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("text", "line"), [
    ("# p\n```python\nx = 1\n```\n\n```python\nassert x == 2\n```\n", 7),
    ("# p\n```python\n>>> 1 + 1\n3\n```\n", 3),
    ("# p\n```sh\ntrue\nfalse\necho never\n```\n", 3),
    ("# p\n```c\nint main(void) { int unused; return 0; }\n```\n", 3),
], ids=["python", "doctest", "sh", "c"])
def test_a_failing_block_is_named_by_its_line(tmp_path: Path, text: str, line: int) -> None:
    proc = _run_page(tmp_path, text)
    assert proc.returncode == 1
    assert f"FAILED {tmp_path / 'page.md'}:{line}" in proc.stderr, proc.stderr
    assert "never" not in proc.stdout


def test_blocks_of_a_page_share_one_namespace_in_order(tmp_path: Path) -> None:
    text = ("# p\n```python\nimport json\nx = 41\n```\n```sh\nN=42\necho $N > n.txt\n```\n"
            "```python\n>>> x + int(open('n.txt').read()) - 42\n41\n```\n"
            "```sh\ntest \"$N\" = 42\n```\n")
    proc = _run_page(tmp_path, text)
    assert proc.returncode == 0, proc.stderr
