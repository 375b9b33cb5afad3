"""Function-local imports in src/kiln say why they are local.

An import inside a function hides a dependency from the reader, so one is
written only where it has to be, and then a trailing comment names the reason:

* `# cycle: kiln.x imports this module` (an import at the top would be circular),
* `# optional: llvmlite (the compiler extra)` (a package not every install has),
* `# heavy: kiln.x imports onnx` (importing it at the top would pull in a large or
  optional dependency for every user of this module),
* `# lazy: ...` (loaded on first use on purpose: a registry's lazy entry, the
  compiler kept off the numpy-only runtime import).

Every other import belongs at the top of its module. The comment sits on a line of
the import statement, or on the line just above it.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import kiln

SRC = Path(kiln.__file__).resolve().parent
REASONS = ("# cycle:", "# optional:", "# heavy:", "# lazy:")


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, text) of each import inside a function of `source` without a reason."""
    lines = source.splitlines()
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                own = lines[child.lineno - 1:child.end_lineno]
                above = lines[child.lineno - 2].strip() if child.lineno >= 2 else ""
                said = any(r in line for line in own for r in REASONS) or (
                    above.startswith("#") and any(r in above for r in REASONS))
                if not said:
                    out.append((child.lineno, lines[child.lineno - 1].strip()))
            visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return out


def test_finds_an_unexplained_local_import():
    source = textwrap.dedent('''
        import os

        def hoistable():
            import json
            return json.dumps({})

        def kept():
            import llvmlite  # optional: llvmlite (the compiler extra)
            from kiln.ir import (  # cycle: kiln.ir imports this module
                printer,
            )
            # lazy: kiln.kernels.lowering loads it
            from kiln.kernels import conv
            return llvmlite, printer, conv

        class C:
            def method(self):
                from kiln.ir import graph  # the printer needs it
                return graph
        ''')
    assert unexplained(source) == [(5, "import json"), (19, "from kiln.ir import graph  "
                                                              "# the printer needs it")]


def test_a_comment_on_the_line_before_counts_only_alone():
    source = textwrap.dedent('''
        def f():
            x = 1  # lazy: not about the import
            import json
            return json, x
        ''')
    assert unexplained(source) == [(4, "import json")]


def test_every_local_import_says_why():
    missing = [f"{path.relative_to(SRC.parent)}:{line}: {text}"
               for path in sorted(SRC.rglob("*.py"))
               for line, text in unexplained(path.read_text())]
    assert not missing, ("imports inside functions without a reason comment "
                         "(move them to the top, or say `# cycle:`, `# optional:`, "
                         "`# heavy:` or `# lazy:`):\n" + "\n".join(missing))
