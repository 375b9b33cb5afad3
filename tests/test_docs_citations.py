"""Code comments and docs cite only what is in the repository (docs/, code, public standards).

Design notes that never shipped ("seed 002", "DESIGN invariant 6", "../shared/...") are
dead references to a reader of the repository: this lists every one left.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"seed [0-9]|DESIGN|invariant [0-9]|shared/|choice C[0-9]")
SUFFIXES = {".py", ".md", ".c", ".h", ".json", ".txt", ".toml", ".mjs"}
THIS = Path(__file__).resolve()  # it names the patterns


def _texts() -> list[Path]:
    files = [p for where in ("src", "docs", "tests", "bench", "examples")
             for p in (ROOT / where).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    return [p for p in [*files, ROOT / "README.md", ROOT / "Makefile"] if p != THIS]


def test_no_citation_of_documents_outside_the_repository() -> None:
    found = []
    for path in _texts():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "citations of documents not in the repository:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_names() -> None:
    for bad in ("(seed 002, C3)", "DESIGN invariant 6", "see ../shared/notes.md", "choice C0"):
        assert FORBIDDEN.search(bad), bad
    assert not FORBIDDEN.search("Apache TVM's target RFC (docs/targets.md)")
