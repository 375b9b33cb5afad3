"""The test suite shares its helpers through tests/support (on pytest's `pythonpath`):
no test file edits sys.path, and only tests/support/reference.py creates onnxruntime
sessions or defines an onnxruntime helper; ONNX graphs are built with
support.graphs.GraphBuilder, except in the files of RAW_GRAPHS."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REFERENCE = "support/reference.py"
# The compatibility scripts are onnxruntime scripts on purpose: they run with
# `rt` = onnxruntime and `rt` = kiln and are compared (tests/session/compat).
SESSION_ALLOWED = {REFERENCE, "session/compat/compat_scripts.py"}
HELPER_NAMES = {"onnxruntime_outputs", "ort_session"}
PATH_EDITS = {"insert", "append", "extend", "remove"}
GRAPHS = "support/graphs.py"
# Files that build deliberately invalid or hostile models, proto field by proto field,
# where a builder that names, types and checks values would get in the way.
RAW_GRAPHS = {
    "frontend/test_untrusted_models.py": "hostile models: cycles, empty names, negative "
                                         "dims, external data out of bounds, size bombs",
    "frontend/test_onnx_checker.py": "models onnx's checker and onnxruntime refuse",
    "codegen/test_hostile_names.py": "a child script builds a model whose every name is "
                                     "a C/shell/format-string payload with NUL bytes",
}


def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def _makes_raw_graph(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        return (func.attr if isinstance(func, ast.Attribute)
                else getattr(func, "id", None)) == "make_graph"
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and "make_graph(" in node.value)


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
        elif rel not in RAW_GRAPHS and rel != GRAPHS and _makes_raw_graph(node):
            out.append(f"{rel}:{line}: builds a graph with helper.make_graph")
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
    ("from onnx import helper\ng = helper.make_graph([], 'g', [], [])\n", "helper.make_graph"),
    ("from onnx.helper import make_graph\ng = make_graph([], 'g', [], [])\n",
     "helper.make_graph"),
    ("code = 'graph = helper.make_graph(nodes)'\n", "helper.make_graph"),
])
def test_the_check_finds_each_pattern(source: str, found: str) -> None:
    (problem,) = findings(source, "x/test_x.py")
    assert found in problem
    assert findings("import sys\nprint(sys.path)\n", "x/test_x.py") == []


def test_raw_graphs_are_allowed_only_where_listed() -> None:
    """Each allow-listed file exists and still needs its raw graphs; the builder's own
    file and a listed file pass the check."""
    source = "from onnx import helper\ng = helper.make_graph([], 'g', [], [])\n"
    for rel in RAW_GRAPHS:
        assert "make_graph(" in (TESTS / rel).read_text(encoding="utf-8"), rel
        assert findings(source, rel) == []
    assert findings(source, GRAPHS) == []


def test_graph_builder_keeps_names_and_imports_and_types_outputs() -> None:
    """Named values, an If whose branches are builder subgraphs, an untyped output typed
    by shape inference, two opset imports: onnx's checker and onnxruntime accept it."""
    import numpy as np
    import onnx
    from onnx import TensorProto

    from support.graphs import GraphBuilder, value_info
    from support.reference import onnxruntime_outputs

    then_b, else_b = GraphBuilder(), GraphBuilder()
    then_b.node("Add", ["x", "k"], ["t"])
    else_b.node("Neg", ["x"], ["e"])
    b = GraphBuilder()
    b.const(np.array([1.0, 2.0, 3.0], np.float32), name="k")
    b.input("c", [], TensorProto.BOOL)
    b.input("x", [3])
    b.node("If", ["c"], ["y"], name="pick",
           then_branch=then_b.graph("then", [], [value_info("t", [3])]),
           else_branch=else_b.graph("else", [], [value_info("e", [3])]))
    b.node("Relu", ["y"], ["out"])
    b.output("out", typed=False)
    model = b.model(opset={"": 17, "com.microsoft": 1}, infer_outputs=True, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17),
                                                                   ("com.microsoft", 1)]
    assert model.ir_version == 8 and [i.name for i in model.graph.initializer] == ["k"]
    (out,) = model.graph.output
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [3]
    x = np.array([-2.0, 0.5, -4.0], np.float32)
    for c, want in ((True, [0.0, 2.5, 0.0]), (False, [2.0, 0.0, 4.0])):
        (got,) = onnxruntime_outputs(model, {"c": np.array(c), "x": x})
        np.testing.assert_array_equal(got, want)
    assert b.model(opset=None, ir_version=None, check=False).ir_version == onnx.IR_VERSION


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


@pytest.fixture(scope="module")
def shared_value() -> int:
    return 1


@pytest.fixture(scope="module", params=["first", "second"])
def shared_param(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_tests_sharing_a_module_fixture_run_in_one_xdist_group(
        request: pytest.FixtureRequest, shared_param: str, shared_value: int) -> None:
    """tests/conftest.py groups them per module and fixture parameter, in a name that
    pytest-xdist's loadgroup takes (it ignores one that a "]" ends); the random data
    of rng_for do not depend on the group."""
    from support.seeds import node_id_of  # lazy: this test alone uses it

    mark = request.node.get_closest_marker("xdist_group")
    assert mark is not None
    index = ["first", "second"].index(shared_param)
    assert mark.args[0] == f"tests/test_test_support.py:shared_param={index}"
    assert "[" not in mark.args[0] and "]" not in mark.args[0]
    assert node_id_of(request.node) == request.node.nodeid.split("@")[0]
    assert node_id_of(request.node).endswith(f"[{shared_param}]")
