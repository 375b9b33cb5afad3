"""What a flag or a file can make `kiln` spend: every numeric flag takes an integer in
its range, else argparse's usage error (exit code 2) naming the flag and the range;
model files are size-checked before anything reads them (docs/security.md, "Limits";
docs/cli.md, "Errors and exit codes")."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import onnx
import pytest

from kiln.cli.main import main
from kiln.cli.tune import cmd_tune
from kiln.errors import UsageError
from support.graphs import GraphBuilder, value_info
from support.processes import run_python

FLAGS = [
    (["tune", "m.onnx", "-o", "db.json", "--in-process", "--threads"], "0", "from 1 to 256"),
    (["tune", "m.onnx", "-o", "db.json", "--in-process", "--threads"], "-2", "from 1 to 256"),
    (["tune", "m.onnx", "-o", "db.json", "--in-process", "--threads"], "two", "from 1 to 256"),
    (["tune", "m.onnx", "-o", "db.json", "--in-process", "--threads"], "257", "from 1 to 256"),
    (["tune", "m.onnx", "-o", "db.json", "--in-process", "--workers"], "0", "from 1 to 1024"),
    (["run", "m.so", "--repeat"], "-1", "from 0 to 100000"),
    (["run", "m.so", "--repeat"], "1000000000", "from 0 to 100000"),
    (["run", "m.so", "--warmup"], "-3", "from 0 to 100000"),
    (["run", "m.so", "--top"], "0", "from 1 to 10000"),
    (["compile", "m.onnx", "-o", "m.so", "--max-loop-iterations"], "0",
     "from 1 to 9223372036854775807"),
]


@pytest.mark.parametrize(("words", "value", "expected"), FLAGS,
                         ids=[f"{w[0]} {w[-1]} {v}" for w, v, _ in FLAGS])
def test_a_numeric_flag_out_of_range_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        words: list[str], value: str, expected: str) -> None:
    monkeypatch.chdir(tmp_path)  # m.onnx / m.so do not exist: nothing may get that far
    with pytest.raises(SystemExit) as info:
        main([*words, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {words[-1]}: expected an integer {expected}, got '{value}'" in err
    assert not (tmp_path / "db.json").exists()


@pytest.mark.parametrize(("budget", "message"), [
    ("200h", "longer than a week"),
    ("9" * 400, "longer than a week"),  # a float past its range: infinite
], ids=["200h", "400 nines"])
def test_a_budget_out_of_range_is_a_usage_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                budget: str, message: str) -> None:
    assert main(["tune", "m.onnx", "-o", str(tmp_path / "db.json"), "--in-process",
                 "--budget", budget]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "db.json").exists()


def test_tune_from_python_refuses_zero_threads(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--threads takes an integer from 1 to 256, got 0"):
        cmd_tune("m.onnx", None, "1s", str(tmp_path / "db.json"), None, True, {}, None, 0)


def _kiln_capped(*words: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`kiln WORDS` in a fresh interpreter held to 2 GiB of address space: a command
    that reads a huge file whole fails fast there instead of filling the machine."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from kiln.cli.main import main
        sys.exit(main({list(words)!r}))
    """)
    return run_python(code, cwd=cwd)


@pytest.mark.parametrize("verb", [["compile", "-o", "out.so"], ["inspect"],
                                  ["tune", "-o", "db.json", "--in-process"]],
                         ids=["compile", "inspect", "tune"])
def test_a_huge_model_file_is_refused_before_it_is_read(tmp_path: Path, verb: list[str]
                                                        ) -> None:
    model = tmp_path / "huge.onnx"
    with open(model, "wb") as f:
        f.truncate(20 << 30)  # 20 GiB, sparse: no disk used
    proc = _kiln_capped(verb[0], str(model), *verb[1:], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        f"kiln {verb[0]}: error: ONNX model file {model} holds 20 GiB, more than the 2 GiB "
        'it may hold (docs/security.md, "Limits"); a larger model keeps its weights in '
        "external data files, or set $KILN_MAX_MODEL_BYTES")


def test_a_device_is_not_a_model_file(tmp_path: Path) -> None:
    proc = _kiln_capped("compile", "/dev/zero", "-o", "out.so", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        "kiln compile: error: ONNX model file /dev/zero is not a regular file (a directory, "
        "a device or a pipe); kiln reads a model from a file whose size it can check")


def _external_model(folder: Path) -> Path:
    """A dense layer whose weights live in the external data file `w.bin`."""
    b = GraphBuilder(0)
    y = b.linear("x", 64, 32)
    model = b.model([value_info("x", [1, 64])], [value_info(y, [1, 32])], 17, "dense")
    path = folder / "dense.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)
    return path


def test_external_data_past_its_limit_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _external_model(tmp_path)
    monkeypatch.setenv("KILN_MAX_EXTERNAL_DATA_BYTES", "1K")
    assert main(["compile", str(path), "-o", str(tmp_path / "m.so")]) == 2
    err = capsys.readouterr().err
    assert "its external data (up to tensor " in err
    assert "more than the 1 KiB a model may reference" in err
    assert "$KILN_MAX_EXTERNAL_DATA_BYTES" in err
    # a tensor without a length reads its whole file: a 20 GiB sparse one is refused
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        kept = [e for e in tensor.external_data if e.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    onnx.save_model(model, str(path))
    with open(tmp_path / "w.bin", "r+b") as f:
        f.truncate(20 << 30)  # sparse: no disk used
    monkeypatch.delenv("KILN_MAX_EXTERNAL_DATA_BYTES")
    proc = _kiln_capped("compile", str(path), "-o", "m.so", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "holds 20 GiB, more than the 8 GiB a model may reference" in proc.stderr
