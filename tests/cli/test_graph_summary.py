"""The "graphs" metadata entry (kiln.codegen.graph_summary) agrees with the lowered IR."""

from __future__ import annotations

import pytest
from kiln_cli import ROOT

import kiln
from kiln.codegen.naming import LIBRARY_FORMAT_VERSION
from kiln.ir.tensor import Buffer, CallFunc
from kiln.ir.visitor import iter_stmts
from kiln.runtime import load_module


@pytest.fixture(scope="module", params=["mlp.onnx", "tiny_cnn.onnx"])
def compiled(request: pytest.FixtureRequest) -> kiln.Executable:
    return kiln.compile(str(ROOT / "models" / request.param), "c")


def test_calls_match_the_lowered_main(compiled: kiln.Executable) -> None:
    g = compiled.metadata["graphs"]["main"]
    calls = [s for s in iter_stmts(compiled.ir["main"].body) if isinstance(s, CallFunc)]
    assert [k["name"] for k in g["kernels"]] == [c.func for c in calls]
    for k, call in zip(g["kernels"], calls):
        names = [a.name for a in call.args if isinstance(a, Buffer)]
        assert sorted(g["tensors"][t]["name"] for t in k["inputs"] + k["outputs"]) == sorted(names)
        assert k["outputs"], k  # every kernel writes something


def test_every_intermediate_is_written_before_it_is_read(compiled: kiln.Executable) -> None:
    g = compiled.metadata["graphs"]["main"]
    written: set[int] = set()
    for k in g["kernels"]:
        for t in k["inputs"]:
            assert g["tensors"][t]["kind"] in ("input", "weight") or t in written
        written.update(k["outputs"])
    outputs = {t for t, info in enumerate(g["tensors"]) if info["kind"] == "output"}
    assert outputs <= written


def test_live_workspace_tensors_never_share_bytes(compiled: kiln.Executable) -> None:
    from kiln.cli.report import lifetimes

    g = compiled.metadata["graphs"]["main"]
    span = lifetimes(g)
    placed = [(t, i) for t, i in enumerate(g["tensors"]) if i["kind"] == "workspace" and t in span]
    assert placed
    for t, a in placed:
        assert a["offset"] >= 0 and a["offset"] + a["bytes"] <= g["workspace_bytes"]
        for u, b in placed:
            live_together = span[t][0] <= span[u][1] and span[u][0] <= span[t][1]
            disjoint = (a["offset"] + a["bytes"] <= b["offset"]
                        or b["offset"] + b["bytes"] <= a["offset"])
            assert t == u or not live_together or disjoint, (a, b)


def test_the_summary_is_in_the_library(compiled: kiln.Executable, tmp_path) -> None:
    compiled.export_library(tmp_path / "m.so")
    lib = load_module(str(tmp_path / "m.so"))
    assert lib.metadata["version"] == LIBRARY_FORMAT_VERSION
    graphs = lib.metadata["graphs"]
    assert not graphs.parsed  # only reports read it: parsed on first use
    assert graphs == compiled.metadata["graphs"] and graphs.parsed
