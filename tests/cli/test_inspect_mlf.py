"""`kiln inspect` reads a Model Library Format tar: signature, files, one file, a report."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from kiln_cli import MODEL, one_line_error, run_kiln


@pytest.fixture(scope="module")
def mlf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("mlf")
    done = run_kiln("compile", str(MODEL), "-t", "c", "--mlf", "mlp", "-o", "mlp_mlf.tar",
                    cwd=where)
    assert done.returncode == 0, done.stderr
    return where / "mlp_mlf.tar"


def test_report_lists_the_signature_and_every_file(mlf: Path) -> None:
    done = run_kiln("inspect", mlf.name, "--format", "json", cwd=mlf.parent)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    with tarfile.open(mlf) as tar:
        sizes = {m.name.removeprefix("./"): m.size for m in tar.getmembers() if m.isfile()}
    assert info["kind"] == "Model Library Format archive" and info["format"] == "mlf"
    assert {a["name"]: a["size"] for a in info["artifacts"]} == sizes
    assert info["functions"]["main"]["inputs"] == [
        {"name": "x", "shape": [1, 64], "dtype": "float32"}]
    assert info["functions"]["main"]["outputs"][0]["name"] == "probs"
    params = [n for n in sizes if n.startswith("parameters/") and n.endswith(".params")]
    assert info["weight_bytes"] == sum(sizes[n] for n in params) > 0
    text = run_kiln("inspect", mlf.name, cwd=mlf.parent)
    assert "input  x" in text.stdout and "target:   c" in text.stdout


def test_show_prints_one_file(mlf: Path) -> None:
    with tarfile.open(mlf) as tar:
        f = tar.extractfile("codegen/host/include/mlp.h")
        assert f is not None
        want = f.read().decode()
    done = run_kiln("inspect", mlf.name, "--show", "codegen/host/include/mlp.h", cwd=mlf.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == want + "\n"
    line = one_line_error(run_kiln("inspect", mlf.name, "--show", "nope.c", cwd=mlf.parent))
    assert "no file 'nope.c'" in line and "codegen/host/src/host.c" in line


def test_report_of_an_mlf_is_the_reduced_page(mlf: Path) -> None:
    done = run_kiln("inspect", mlf.name, "--report", "mlf.html", cwd=mlf.parent)
    assert done.returncode == 0, done.stderr
    assert "signatures only" in done.stdout
    page = (mlf.parent / "mlf.html").read_text()
    assert "holds no graph summary" in page and "x: 1\u00d764 float32" in page
