"""No module imports another module's private (`_name`) names.

A name another module needs is part of its module's interface: it is public
and has a docstring (or, for a constant, a comment). `PRIVATE_FAMILIES` are
private modules split out of one module, which share their privates by design.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layering import SRC, _module_name, _resolve

# Private modules that make up one module between them: the reference interpreter
# (kiln.ir.evaluate and its private halves, docs/ir.md).
PRIVATE_FAMILIES = ({"kiln.ir.evaluate", "kiln.ir._interp_compiler", "kiln.ir._interp_runtime",
                     "kiln.ir._interp_externs"},)

# Reach-ins whose owners are reworking them; each entry is (importing module, imported
# module). Empty: add one only with the issue that removes it.
PENDING: set[tuple[str, str]] = set()


def private_imports(source: str, module: str, is_package: bool = False
                    ) -> list[tuple[int, str, str]]:
    """(line, imported module, name) of each `from kiln... import _name` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            if base.split(".")[0] != "kiln":
                continue
            found.extend((node.lineno, base, alias.name) for alias in node.names
                         if alias.name.startswith("_") and not alias.name.startswith("__"))
    return found


def _same_family(a: str, b: str) -> bool:
    return any(a in family and b in family for family in PRIVATE_FAMILIES)


def reach_ins() -> dict[tuple[str, str], list[str]]:
    """(importing module, imported module) -> the private names it takes."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for line, base, name in private_imports(path.read_text(encoding="utf-8"), module,
                                                path.name == "__init__.py"):
            if base != module and not _same_family(module, base):
                out.setdefault((module, base), []).append(f"{name} (line {line})")
    return out


def test_no_module_imports_another_modules_private_names() -> None:
    found = reach_ins()
    bad = [f"{importer} takes {', '.join(names)} from {imported}"
           for (importer, imported), names in found.items() if (importer, imported) not in PENDING]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_scan_sees_private_imports() -> None:
    source = "from kiln.ir.names import _hidden, public\nfrom .verify import _check\n"
    assert private_imports(source, "kiln.ir.probe") == [
        (1, "kiln.ir.names", "_hidden"), (2, "kiln.ir.verify", "_check")]


def test_the_interpreter_family_is_the_only_exception() -> None:
    assert _same_family("kiln.ir.evaluate", "kiln.ir._interp_runtime")
    assert not _same_family("kiln.ir.evaluate", "kiln.ir.verify")
    assert Path(SRC / "ir" / "_interp_runtime.py").is_file()
