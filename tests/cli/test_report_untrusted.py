"""`kiln inspect` and `--report` on malformed metadata: a FormatError naming the file and
the JSON path, never a TypeError or IndexError from deep inside the page."""

from __future__ import annotations

import copy
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from kiln_cli import one_line_error, run_kiln

from kiln.artifact import Artifact, ArtifactSet
from kiln.artifact.archive import write_tar
from kiln.cli.inspect import as_text, describe, report_metadata
from kiln.cli.report import render_report
from kiln.errors import FormatError

GOOD: dict[str, Any] = {
    "format": "kiln.library", "version": 2, "kiln_version": "0.1.0", "prefix": "kiln_",
    "functions": {"main": {"name": "main", "symbol": "kiln_main", "kind": "graph",
                           "params": [{"name": "x", "kind": "tensor", "shape": [4],
                                       "dtype": "float32"}],
                           "results": [{"name": "y", "kind": "tensor", "shape": [4],
                                        "dtype": "float32"}]}},
    "graphs": {"main": {"tensors": [
        {"name": "x", "shape": [4], "dtype": "float32", "bytes": 16, "kind": "input"},
        {"name": "t", "shape": [4], "dtype": "float32", "bytes": 16, "kind": "workspace",
         "offset": 0},
        {"name": "y", "shape": [4], "dtype": "float32", "bytes": 16, "kind": "output"}],
        "kernels": [{"name": "k0", "inputs": [0], "outputs": [1]},
                    {"name": "k1", "inputs": [1], "outputs": [2]}],
        "workspace_bytes": 16}},
}


def _edit(change: Any) -> dict[str, Any]:
    """A copy of GOOD changed in place by `change`."""
    meta = copy.deepcopy(GOOD)
    change(meta)
    return meta


def _fn(meta: dict[str, Any]) -> Any:
    return meta["functions"]["main"]


def _graph(meta: dict[str, Any]) -> Any:
    return meta["graphs"]["main"]


BAD = [
    (lambda m: _fn(m)["params"][0].update(name=1),
     "functions.main.params[0].name: expected a name, got 1"),
    (lambda m: _fn(m).update(params="x"), "functions.main.params: expected a list"),
    (lambda m: _fn(m)["params"][0].update(shape="abc"),
     "functions.main.params[0].shape: expected a list"),
    (lambda m: m.update(functions=[]), "functions: expected an object, got []"),
    (lambda m: _fn(m).update(dims=[1]), "functions.main.dims[0]: expected an object, got 1"),
    (lambda m: _graph(m)["kernels"][0].update(inputs=[99]),
     "graphs.main.kernels[0].inputs[0]: expected a tensor index below 3, got 99"),
    (lambda m: _graph(m)["kernels"][0].update(inputs=["a"]),
     "graphs.main.kernels[0].inputs[0]: expected an int"),
    (lambda m: _graph(m)["kernels"][1].update(outputs=[-1]), "expected an int >= 0, got -1"),
    (lambda m: _graph(m).update(tensors="x"), "graphs.main.tensors: expected a list"),
    (lambda m: _graph(m)["tensors"][1].update(offset=[]), "graphs.main.tensors[1].offset"),
    (lambda m: _graph(m)["tensors"][1].update(bytes="16"), "graphs.main.tensors[1].bytes"),
    (lambda m: _graph(m).update(workspace_bytes={}), "graphs.main.workspace_bytes"),
    (lambda m: m.update(graphs=[]), "graphs: expected an object"),
    (lambda m: m.update(external_dependencies=[1]),
     "external_dependencies[0]: expected an object"),
]


def _library(path: Path, metadata: dict[str, Any]) -> Path:
    arts = ArtifactSet([Artifact("c", "none", "notes.txt", b"hello")])
    write_tar(path, arts, metadata)
    return path


def test_good_metadata_gives_a_page(tmp_path: Path) -> None:
    path = str(_library(tmp_path / "good.tar", GOOD))
    assert "k0" in render_report(report_metadata(path), "good.tar")
    assert "input  x" in as_text(describe(path))


@pytest.mark.parametrize("change, message", BAD)
def test_malformed_library_metadata_is_a_format_error(tmp_path: Path, change: Any,
                                                      message: str) -> None:
    path = _library(tmp_path / "bad.tar", _edit(change))
    for read in (report_metadata, describe):
        with pytest.raises(FormatError) as info:
            read(str(path))
        text = str(info.value)
        assert text.startswith(f"{path}: library metadata: ") and message in text, text


def _mlf(path: Path, metadata: bytes) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("metadata.json", metadata), ("codegen/host/src/host.c", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_command_reports_one_line(tmp_path: Path) -> None:
    _library(tmp_path / "bad.tar", _edit(BAD[5][0]))
    line = one_line_error(run_kiln("inspect", "bad.tar", "--report", "r.html", cwd=tmp_path))
    assert "kiln inspect: error:" in line and "expected a tensor index below 3" in line
    meta = {"version": 1, "model_name": "m", "prefix": "kiln_",
            "inputs": [{"name": "x", "shape": ["a"], "dtype": "float32"}], "outputs": [],
            "memory": {}, "build": {}}
    _mlf(tmp_path / "bad_mlf.tar", json.dumps(meta).encode())
    line = one_line_error(run_kiln("inspect", "bad_mlf.tar", "--report", "r.html",
                                   cwd=tmp_path))
    assert 'metadata.json: inputs[0].shape[0]: expected an int >= 0, got "a"' in line
