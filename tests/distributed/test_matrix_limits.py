"""A build matrix costs what its size says: alias bombs, deep nesting, oversized files
and models, too many cells are UsageErrors (or FrontendErrors for a model file) before
anything large is built, and error messages show values cut short
(docs/security.md, "Limits"). The loader is tested directly, without Ray."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kiln.distributed.matrix import load_matrix
from kiln.errors import FrontendError, UsageError
from support.graphs import GraphBuilder, value_info
from support.processes import run_python

# docs/security.md, "Limits"
MAX_MATRIX_BYTES = 1 << 20
MAX_CELLS = 10_000

# 9 levels of 9 aliases: under 500 bytes standing for 9^8 values
BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else '1'}]\n"
               for i in range(9)) + "models: [*l8]\ntargets: [c]\n"


def _mlp(path: Path) -> Path:
    b = GraphBuilder(0)
    y = b.linear("x", 8, 4)
    path.write_bytes(b.model([value_info("x", [1, 8])], [value_info(y, [1, 4])], 17,
                             "mlp").SerializeToString())
    return path


def _capped(code: str) -> str:
    """Run `code` in a fresh interpreter held to 2 GiB of address space (an unbounded
    expansion fails there fast instead of filling the machine); its stdout."""
    prelude = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    proc = run_python(prelude + textwrap.dedent(code))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_a_yaml_alias_bomb_is_refused_and_small_aliases_still_work(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 500
    out = _capped(f"""
        from kiln.distributed.matrix import load_matrix
        from kiln.errors import UsageError
        try:
            load_matrix({str(path)!r})
        except UsageError as exc:
            print("UsageError:", exc)
    """)
    assert out.startswith("UsageError:") and "aliases expand to more than" in out
    assert len(out) < 500
    # an anchor shared by two models is what aliases are for
    for name in ("a.onnx", "b.onnx"):
        _mlp(tmp_path / name)
    path = tmp_path / "m.yaml"
    path.write_text("models:\n  - {path: a.onnx, shape: &s {x: [1, 8]}}\n"
                    "  - {path: b.onnx, shape: *s}\ntargets: [c]\n")
    matrix = load_matrix(path)
    assert [m.shape for m in matrix.models] == [{"x": (1, 8)}] * 2


ODD = [
    ("deep.json", "[" * 100_000, "deeper than 64"),
    ("deep.yaml", "[" * 100_000, "deeper than 64"),
    ("self.yaml", "models: &m [*m]\ntargets: [c]\n", "refers to a node that contains it"),
    ("digits.json", '{"version": ' + "1" * 5000 + "}", "not valid JSON"),
    ("digits.yaml", "version: " + "1" * 5000 + "\n", "not a YAML document kiln reads"),
]


@pytest.mark.parametrize(("name", "text", "message"), ODD, ids=[n for n, _, _ in ODD])
def test_deep_or_odd_documents_are_usage_errors(tmp_path: Path, name: str, text: str,
                                                message: str) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    (tmp_path / name).write_text(text)
    with pytest.raises(UsageError, match=message):
        load_matrix(tmp_path / name)


def test_an_oversized_matrix_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_MATRIX_BYTES + 1)  # sparse: its size, no data
    with pytest.raises(UsageError, match="more than the 1 MiB"):
        load_matrix(path)


def test_a_huge_model_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    model = tmp_path / "huge.onnx"
    with open(model, "wb") as f:
        f.truncate(20 << 30)  # 20 GiB, sparse: no disk used
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": ["huge.onnx"], "targets": ["c"]}))
    with pytest.raises(FrontendError, match=r"models\[0\].*holds 20 GiB, more than the 2 GiB"):
        load_matrix(path)
    # a matrix made in Python is checked where its models are read
    out = _capped(f"""
        from pathlib import Path
        from kiln.distributed.build import build_many
        from kiln.distributed.executor import InProcessExecutor
        from kiln.distributed.matrix import BuildMatrix, ModelEntry
        from kiln.errors import FrontendError
        matrix = BuildMatrix((ModelEntry(Path({str(model)!r}), {{}}),), ("c",))
        try:
            build_many(matrix, {str(tmp_path / "out")!r}, executor=InProcessExecutor())
        except FrontendError as exc:
            print("FrontendError:", exc)
    """)
    assert out.startswith("FrontendError:") and "holds 20 GiB" in out


def test_the_model_limit_can_be_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    _mlp(tmp_path / "m.onnx")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": ["m.onnx"], "targets": ["c"]}))
    monkeypatch.setenv("KILN_MAX_MODEL_BYTES", "100")
    with pytest.raises(FrontendError, match=r"more than the 100 bytes.*KILN_MAX_MODEL_BYTES"):
        load_matrix(path)
    monkeypatch.setenv("KILN_MAX_MODEL_BYTES", "lots")
    with pytest.raises(UsageError, match=r"\$KILN_MAX_MODEL_BYTES: cannot read 'lots'"):
        load_matrix(path)
    monkeypatch.setenv("KILN_MAX_MODEL_BYTES", "0")  # no limit
    assert load_matrix(path).models[0].name == "m"


def test_too_many_cells_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    _mlp(tmp_path / "m.onnx")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": ["m.onnx"] * 101, "targets": ["c"] * 100}))
    with pytest.raises(UsageError, match=f"10100 cells, more than the {MAX_CELLS}"):
        load_matrix(path)
    for size in (-1, 1 << 63):
        path.write_text(json.dumps({"models": [{"path": "m.onnx", "shape": {"x": size}}],
                                    "targets": ["c"]}))
        with pytest.raises(UsageError, match="sizes from 0 to"):
            load_matrix(path)


def test_error_messages_show_values_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": [list(range(100_000))], "targets": ["c"]}))
    with pytest.raises(UsageError, match=r"models\[0\]: expected a path") as info:
        load_matrix(path)
    assert len(str(info.value)) < 400

