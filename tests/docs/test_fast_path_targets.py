"""The pages a newcomer follows compile for `host`, not for the portable `llvm` target.

`llvm` alone is generic x86-64 (no AVX): several times slower than `host` (the
table in docs/targets.md). README.md, the quickstart, the tutorials and examples/
are the fast path; a page about another target is allowed by name, with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAST_PATH = [ROOT / "README.md", ROOT / "docs" / "quickstart.md",
             *sorted((ROOT / "docs" / "tutorials").glob("*.md")),
             *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file())]

# Pages about other targets, where a bare or refined `llvm` is the point.
ALLOWED = {
    "docs/tutorials/cross-compiling.md": "builds for another CPU: a triple after llvm",
}

# `-t llvm`, `--target llvm`, `"llvm"` / `'llvm'` as a whole target string (a kind
# listing such as `--kind llvm` or `kiln targets show llvm` is not a build).
SLOW = re.compile(r"""(?:-t|--target)[ =]["']?llvm\b|(?<![\w-])(?<!: )["']llvm["']""")


def test_fast_path_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in FAST_PATH}
    assert {"README.md", "docs/quickstart.md", "docs/tutorials/python-jit.md"} <= names
    assert set(ALLOWED) <= names, "an allowed page was renamed: update ALLOWED"


def test_fast_path_compiles_for_host() -> None:
    found = []
    for path in FAST_PATH:
        name = path.relative_to(ROOT).as_posix()
        if name in ALLOWED:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if SLOW.search(line):
                found.append(f"{name}:{n}: {line.strip()}")
    assert not found, ("compile for host (the default) on the fast path; `llvm` is "
                       "generic x86-64 without AVX:\n" + "\n".join(found))


def test_the_pattern_catches_the_slow_spellings() -> None:
    for slow in ('kiln compile m.onnx -t llvm -o m.so', 'kiln.compile(mod, "llvm")',
                 "Target('llvm')", "kiln compile m.onnx --target=llvm -o m.so"):
        assert SLOW.search(slow), slow
    for fine in ("kiln targets list --kind llvm", 'kiln.compile(mod, "host")',
                 "--show llvm/kernels.bc", '{"kind": "llvm", "mcpu": "x86-64-v3"}',
                 'Target("llvm -mtriple=aarch64-linux-gnu")'):
        assert not SLOW.search(fine), fine
