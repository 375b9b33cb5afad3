"""The backends build code through printers and builders, not by patching text.

Every `str.replace`-style call (two or three positional arguments, no keywords),
`re.sub` / `re.subn` and `.sub` on a compiled pattern in src/kiln/codegen is
found from the source, and there must be none: what differs between C-family
languages is a dialect object of the C printer (kiln.codegen.cfamily.dialect),
the names a target gives external functions an extern-name table of the LLVM
lowering (kiln.codegen.llvm.decls.ExternModule), and C files are combined by
their own #include lines and renamed by macros.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kiln

CODEGEN = Path(kiln.__file__).resolve().parent / "codegen"


def _regex_names(tree: ast.Module) -> set[str]:
    """Names bound to `re.compile(...)` anywhere in the module."""
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "compile"
                and isinstance(node.value.func.value, ast.Name)
                and node.value.func.value.id == "re"):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def text_patches(source: str) -> list[int]:
    """Line numbers of the text-substitution calls in `source`."""
    tree = ast.parse(source)
    regexes = _regex_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr, owner = node.func.attr, node.func.value
        str_replace = attr == "replace" and 2 <= len(node.args) <= 3 and not node.keywords
        # re.sub, PATTERN.sub on a compiled pattern, re.compile(...).sub
        regex_sub = attr in ("sub", "subn") and (
            isinstance(owner, ast.Call)
            or (isinstance(owner, ast.Name) and (owner.id == "re" or owner.id in regexes)))
        if str_replace or regex_sub:
            lines.append(node.lineno)
    return sorted(lines)


def test_no_text_patching_in_codegen() -> None:
    found = {str(p.relative_to(CODEGEN)): text_patches(p.read_text(encoding="utf-8"))
             for p in sorted(CODEGEN.rglob("*.py"))}
    bad = [f"codegen/{name}: lines {lines}" for name, lines in found.items() if lines]
    assert not bad, ("text substitution over generated code (build it through the printer, "
                     "its dialect or the IR builder instead):\n" + "\n".join(bad))


@pytest.mark.parametrize("source, expected", [
    ("x = text.replace('a', 'b')\n", [1]),
    ("import re\ny = re.sub('a', 'b', text)\n", [2]),
    ("import re\nP = re.compile('a')\n\ndef f(t):\n    return P.sub('b', t)\n", [5]),
    ("from dataclasses import replace\nz = replace(obj, name='n')\n", []),
    ("w = builder.sub(x, y)\n", []),  # an llvmlite IRBuilder instruction
    ("import re\ndef f(t):\n    p = re.compile('a')\n    return p.sub('b', t)\n", [4]),
])
def test_the_scan(source: str, expected: list[int]) -> None:
    assert text_patches(source) == expected
