"""`kiln targets list|show|kinds`, the old spellings, --help on every verb, --version."""

from __future__ import annotations

from pathlib import Path

import pytest
from kiln_cli import one_line_error, run_kiln

import kiln
from kiln.target import list_tags


def _rows(stdout: str) -> list[list[str]]:
    return [line.split(None, 3) for line in stdout.splitlines()[1:] if "/" in line.split()[0]]


def test_list_marks_tags_without_a_codegen(tmp_path: Path) -> None:
    proc = run_kiln("targets", "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert {r[0] for r in rows} == set(list_tags())
    by_kind = {r[1]: r[2] for r in rows}
    assert by_kind["llvm"] == "yes" and by_kind["rocm"] == "no"


def test_list_by_kind_and_unknown_kind(tmp_path: Path) -> None:
    proc = run_kiln("targets", "list", "--kind", "llvm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert rows and all(r[1] == "llvm" and r[2] == "yes" for r in rows)
    line = one_line_error(run_kiln("targets", "list", "--kind", "llvmm", cwd=tmp_path))
    assert "llvmm" in line


def test_show_and_the_old_spellings(tmp_path: Path) -> None:
    show = run_kiln("targets", "show", "llvm", cwd=tmp_path)
    assert show.returncode == 0 and show.stdout.startswith("target kind 'llvm'")
    assert run_kiln("targets", "llvm", cwd=tmp_path).stdout == show.stdout
    kinds = run_kiln("targets", "--kinds", cwd=tmp_path)
    assert kinds.returncode == 0 and kinds.stdout == run_kiln("targets", "kinds",
                                                             cwd=tmp_path).stdout
    assert run_kiln("targets", cwd=tmp_path).stdout.startswith("tag ")
    line = one_line_error(run_kiln("targets", "show", "no-such-thing", cwd=tmp_path))
    assert "neither a target kind nor a tag" in line


@pytest.mark.parametrize("verb", [[], ["compile"], ["inspect"], ["run"], ["cache"],
                                  ["targets"], ["targets", "list"], ["targets", "show"],
                                  ["targets", "kinds"]])
def test_help_on_every_verb(tmp_path: Path, verb: list[str]) -> None:
    proc = run_kiln(*verb, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: kiln") and not proc.stderr


def test_help_advertises_only_what_parses(tmp_path: Path) -> None:
    """The top-level help names the verb spellings and not the `--tags` flag that never existed."""
    text = run_kiln("--help", cwd=tmp_path).stdout
    assert "--tags" not in text
    for verb in ("compile", "inspect", "targets list", "targets show", "targets kinds", "run"):
        assert f"kiln {verb}" in text


def test_version(tmp_path: Path) -> None:
    proc = run_kiln("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"kiln {kiln.__version__}"
