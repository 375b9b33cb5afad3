"""Rules on the shape of the code, read from the source (docs/README.md, "Where a change
goes"):

- kernels take their target explicitly: no module of the op and kernel packages reads
  the ambient target (`isa_for(None)`, `Target.current()`) or tuning session
  (`kiln.tuning.apply.current`), or types an ISA as `Any`. A
  kernel built outside `with Target(...)` must not silently get generic tiles; the
  passes read the target once and hand its ISA down (kiln.target.isa);
- no function over `MAX_LINES` lines, except those of `LONG_FUNCTIONS`, each with its
  length, which may only shrink (a new trick is a variant, not a flag in a long body).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kiln

SRC = Path(kiln.__file__).resolve().parent
# one worker: each test reads every module
pytestmark = pytest.mark.xdist_group("layering")

#: The packages whose kernels must take the ISA as an argument.
KERNEL_PACKAGES = ("ops", "kernels")
MAX_LINES = 100

#: (module path under src/kiln, function) -> its length today. The kernel builders are the
#: debt the house refactor splits into a schedule dataclass and one function per variant
#: (docs/README.md); `build_parser` is one argparse table.
LONG_FUNCTIONS: dict[tuple[str, str], int] = {
    ("cli/main.py", "build_parser"): 154,
}


def hidden_target_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each read of the ambient target in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "isa_for" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
                found.append((node.lineno, "isa_for(None)"))
            elif (isinstance(f, ast.Attribute) and f.attr == "current"
                  and isinstance(f.value, ast.Name) and f.value.id == "Target"):
                found.append((node.lineno, "Target.current()"))
        elif (isinstance(node, ast.ImportFrom) and node.module == "kiln.tuning.apply"
              and any(alias.name == "current" for alias in node.names)):
            found.append((node.lineno, "the ambient tuning session (kiln.tuning.apply.current)"))
        elif (isinstance(node, ast.arg) and node.arg == "isa" and node.annotation is not None
              and ast.unparse(node.annotation) in ("Any", "object")):
            found.append((node.lineno, f"isa: {ast.unparse(node.annotation)}"))
    return found


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function of `source` longer than MAX_LINES (decorators out)."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_LINES]


def _modules(*packages: str) -> list[Path]:
    roots = [SRC / p for p in packages] if packages else [SRC]
    return sorted(path for root in roots if root.is_dir() for path in root.rglob("*.py"))


def test_kernels_take_the_target_as_an_argument() -> None:
    files = _modules(*KERNEL_PACKAGES)
    assert len(files) > 50  # the walk found the packages
    bad = [f"{path.relative_to(SRC)}:{line}: {what}" for path in files
           for line, what in hidden_target_reads(path.read_text(encoding="utf-8"))]
    assert not bad, ("kernels read the ambient target; take the ISA as an argument "
                     "(the pass reads the target once):\n" + "\n".join(bad))


def test_no_new_long_function() -> None:
    found = {(str(path.relative_to(SRC)), name): lines for path in _modules()
             for name, lines in long_functions(path.read_text(encoding="utf-8"))}
    limits = {key: LONG_FUNCTIONS.get(key, MAX_LINES) for key in found}
    grown = [f"{path}: {name} has {lines} lines (limit {limits[path, name]})"
             for (path, name), lines in sorted(found.items()) if lines > limits[path, name]]
    assert not grown, ("split these into a dataclass of choices and one function per "
                       "variant:\n" + "\n".join(grown))
    # a listed function that was split or moved leaves the list
    assert set(LONG_FUNCTIONS) <= set(found), set(LONG_FUNCTIONS) - set(found)


@pytest.mark.parametrize("source, what", [
    ("isa = isa_for(None)\n", "isa_for(None)"),
    ("from kiln.target import Target\nt = Target.current()\n", "Target.current()"),
    ("def f(isa: Any) -> None: ...\n", "isa: Any"),
    ("def f():\n    from kiln.tuning.apply import current\n",
     "the ambient tuning session (kiln.tuning.apply.current)"),
])
def test_the_reads_are_seen(source: str, what: str) -> None:
    assert [w for _, w in hidden_target_reads(source)] == [what]
    assert not hidden_target_reads("isa = isa_for(target)\ndef f(isa: ISA) -> None: ...\n")


def test_a_long_function_is_seen() -> None:
    body = "".join(f"    x{k} = {k}\n" for k in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}") == [("f", MAX_LINES + 1)]
    assert long_functions(f"def f():\n{body[: body.rindex('    x')]}") == []
