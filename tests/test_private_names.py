"""No module imports another module's private (`_name`) names.

A name another module needs is part of its module's interface: it is public
and has a docstring (or, for a constant, a comment). A module split into private
modules (the reference interpreter: `kiln.ir.evaluate` and `kiln.ir._interp_*`)
shares public names between them: the privacy is the modules' own.
"""

from __future__ import annotations

import ast

from test_layering import SRC, _module_name, _resolve

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


def reach_ins() -> dict[tuple[str, str], list[str]]:
    """(importing module, imported module) -> the private names it takes."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for line, base, name in private_imports(path.read_text(encoding="utf-8"), module,
                                                path.name == "__init__.py"):
            if base != module:
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

