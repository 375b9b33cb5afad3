"""The test suite shares its helpers through tests/support (on pytest's `pythonpath`):
no test file edits sys.path, and only tests/support/reference.py creates onnxruntime
sessions or defines an onnxruntime helper."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REFERENCE = "support/reference.py"
SESSION_ALLOWED = {REFERENCE}
HELPER_NAMES = {"onnxruntime_outputs", "ort_session"}
PATH_EDITS = {"insert", "append", "extend", "remove"}


def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def findings(source: str, rel: str) -> list[str]:
    """What `source` (the file `rel` under tests/) does that the suite forbids."""
    out = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in PATH_EDITS and _is_sys_path(node.func.value)):
            out.append(f"{rel}:{line}: edits sys.path")
        elif isinstance(node, ast.Assign | ast.AugAssign) and any(
                _is_sys_path(t.value if isinstance(t, ast.Subscript) else t)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            out.append(f"{rel}:{line}: assigns sys.path")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and any(f"sys.path.{e}(" in node.value for e in PATH_EDITS)):
            out.append(f"{rel}:{line}: a child script edits sys.path")
        elif rel not in SESSION_ALLOWED and (
                # onnxruntime's, not kiln's own (kiln.InferenceSession)
                (isinstance(node, ast.Attribute) and node.attr == "InferenceSession"
                 and not (isinstance(node.value, ast.Name) and node.value.id == "kiln"))
                or (isinstance(node, ast.ImportFrom) and node.module == "onnxruntime"
                    and any(a.name == "InferenceSession" for a in node.names))):
            out.append(f"{rel}:{line}: creates an onnxruntime session itself")
        elif (isinstance(node, ast.FunctionDef) and node.name in HELPER_NAMES
              and rel != REFERENCE):
            out.append(f"{rel}:{line}: defines its own {node.name}")
    return out


def _test_sources() -> list[tuple[str, str]]:
    return [(p.relative_to(TESTS).as_posix(), p.read_text(encoding="utf-8"))
            for p in sorted(TESTS.rglob("*.py")) if p.resolve() != Path(__file__).resolve()]


def test_no_test_file_edits_sys_path_or_makes_its_own_sessions() -> None:
    problems = [f for rel, source in _test_sources() for f in findings(source, rel)]
    assert problems == [], "use tests/support (tests/support/__init__.py):\n" + "\n".join(
        problems)


@pytest.mark.parametrize("source, found", [
    ("import sys\nsys.path.insert(0, 'x')\n", "edits sys.path"),
    ("import sys\nsys.path.append('x')\n", "edits sys.path"),
    ("import sys\nsys.path[:0] = ['x']\n", "assigns sys.path"),
    ("code = 'import sys; sys.path.insert(0, \"x\")'\n", "a child script edits sys.path"),
    ("import onnxruntime as ort\nort.InferenceSession(b'')\n", "creates an onnxruntime session"),
    ("from onnxruntime import InferenceSession\n", "creates an onnxruntime session"),
    ("def onnxruntime_outputs(m, f):\n    pass\n", "defines its own onnxruntime_outputs"),
])
def test_the_check_finds_each_pattern(source: str, found: str) -> None:
    (problem,) = findings(source, "x/test_x.py")
    assert found in problem
    assert findings("import sys\nprint(sys.path)\n", "x/test_x.py") == []


def test_the_support_package_is_on_pytests_pythonpath() -> None:
    config = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert "tests" in config["tool"]["pytest"]["ini_options"]["pythonpath"]
    import support.reference

    assert Path(support.reference.__file__).resolve() == TESTS / REFERENCE


def test_toolchain_probes_skip_with_the_missing_tools_name() -> None:
    from support.toolchains import find_tool, needs, require_tool

    missing = "kiln-no-such-tool"
    mark = needs("sh", (missing, "sh"), missing, why="for the test")
    assert mark.args == (True,) and mark.kwargs["reason"] == (
        f"needs {missing} on PATH (for the test)")
    assert needs("sh").args == (False,)
    assert find_tool(missing, "sh") == find_tool("sh") is not None
    with pytest.raises(pytest.skip.Exception, match=missing):
        require_tool(missing)
