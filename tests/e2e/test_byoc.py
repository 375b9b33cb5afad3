"""Bring your own codegen: a backend defined outside kiln, end to end.

The backend (jsongraph_backend.py) registers a target kind whose graph pipeline
keeps operator calls, a codegen that writes JSON + weights artifacts with its
own loader, and that loader. It goes through compile, jit, export (.so: the
artifacts travel in the blob; .tar) and load_module in a fresh process, and is
also found through a `kiln.backends` entry point.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsongraph_backend
import numpy as np
import pytest
from byoc_model import X, mlp_module, op, reference

import kiln
from kiln.errors import CompileError
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from support.processes import child_env


@pytest.fixture(scope="module")
def executable() -> kiln.Executable:
    jsongraph_backend.register()
    return kiln.compile(mlp_module(), "jsongraph")


def test_compile_keeps_the_graph_and_emits_json(executable: kiln.Executable) -> None:
    assert executable.target.kind.name == "jsongraph"
    assert set(executable.ir) == {"main"}
    assert isinstance(executable.ir["main"], g.Function)  # not lowered
    names = [(a.codegen_id, a.loader, a.file_name) for a in executable.artifacts]
    assert names == [("jsongraph", "jsongraph", "graph.json"),
                     ("jsongraph", "jsongraph", "weights.bin")]
    doc = json.loads(executable.artifacts.get("jsongraph", "graph.json").content)
    nodes = doc["functions"]["main"]["graph"]["nodes"]
    assert [n["op"] for n in nodes] == ["matmul", "add", "relu", "tanh"]  # dead code dropped
    meta = executable.metadata
    assert meta["functions"] == {}
    sig = meta["external_functions"]["main"]
    assert [r["name"] for r in sig["results"]] == ["y", "h"] and sig["tuple_result"]


def test_jit_runs_through_the_registered_loader(executable: kiln.Executable) -> None:
    y, h = executable["main"](X)
    want_y, want_h = reference(X)
    np.testing.assert_allclose(y, want_y, rtol=1e-6)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)
    module = executable.jit()
    assert [m.kind for m in module.imports] == ["jsongraph"]
    with pytest.raises(kiln.KilnError, match="argument 0 'x': expected shape"):
        executable["main"](X[:1])


def test_unsupported_graph_is_a_compile_error() -> None:
    jsongraph_backend.register()
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4,), "float32")
        ib.ret(ib.emit(op("exp", x, ty=TensorType((4,), "float32")), "e"))
    with pytest.raises(CompileError, match="unsupported node exp"):
        kiln.compile(ib.get(), "jsongraph")


LOAD_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import jsongraph_backend
    from kiln.runtime import load_module

    jsongraph_backend.register()
    lib = load_module(sys.argv[1])
    x = np.array([[1.0, -2.0, 0.5, 3.0], [0.25, 0.0, -1.5, 2.0]], dtype=np.float32)
    y, h = lib["main"](x)
    print(repr(y.tolist()))
    print(repr(h.tolist()))
""")


def _env(extra: list[str] | None = None) -> dict[str, str]:
    return child_env(*(extra or []), Path(__file__).parent)


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_export_and_load_in_a_fresh_process(executable: kiln.Executable, tmp_path: Path,
                                            suffix: str) -> None:
    path = tmp_path / f"mlp{suffix}"
    executable.export_library(path)
    if suffix == ".so":
        from kiln.artifact import load as load_artifacts_from_file

        inside = load_artifacts_from_file(path)
        assert ("jsongraph", "graph.json") in inside  # the artifact travels in the blob
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(path)], capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    y, h = (np.array(eval(line), dtype=np.float32) for line in proc.stdout.splitlines())
    want_y, want_h = reference(X)
    np.testing.assert_allclose(y, want_y, rtol=1e-6)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)


ENTRY_POINT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    import byoc_model

    assert "jsongraph_backend" not in sys.modules     # nobody imported the plug-in
    ex = kiln.compile(byoc_model.mlp_module(), "jsongraph")   # kind unknown until the plug-in loads
    y, h = ex["main"](byoc_model.X)
    want_y, want_h = byoc_model.reference(byoc_model.X)
    np.testing.assert_allclose(y, want_y, rtol=1e-6)
    assert "jsongraph_backend" in sys.modules
    print("plugin ok", ex.target.kind.name)
""")


def test_entry_point_plugin_is_loaded_lazily(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "jsongraph_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jsongraph-plugin\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text("[kiln.backends]\n"
                                           "jsongraph = jsongraph_backend:register\n")
    proc = subprocess.run([sys.executable, "-c", ENTRY_POINT_SCRIPT], capture_output=True,
                          text=True, timeout=120, env=_env([str(site)]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "plugin ok jsongraph"
