"""Every failure of `kiln` is one line on stderr and a non-zero exit; a closed pipe is quiet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from kiln_cli import MODEL, one_line_error, run_kiln


def test_missing_model_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(run_kiln("compile", "missing.onnx", "-t", "llvm", "-o", "m.so",
                                   cwd=tmp_path))
    assert line.startswith("kiln compile: error:") and "missing.onnx" in line
    assert not (tmp_path / "m.so").exists()


def test_bad_target_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(run_kiln("compile", str(MODEL), "-t", "llvmm", "-o", "m.so",
                                   cwd=tmp_path))
    assert "'llvmm'" in line and "did you mean 'llvm'" in line


def test_kind_without_codegen_names_the_kinds_that_have_one(tmp_path: Path) -> None:
    line = one_line_error(run_kiln("compile", str(MODEL), "-t", "vulkan", "-o", "m.so",
                                   cwd=tmp_path))
    assert "target kind 'vulkan' has no code generator" in line
    assert "kinds with one: c, cuda, llvm" in line
    assert not (tmp_path / "m.so").exists()


def test_bad_input_file_is_one_line(built: Path) -> None:
    (built / "bad.npy").write_bytes(b"not numpy at all")
    line = one_line_error(run_kiln("run", "mlp.so", "--input", "x=bad.npy", cwd=built))
    assert line.startswith("kiln run: error: --input x=bad.npy:") and "not a .npy" in line
    line = one_line_error(run_kiln("run", "mlp.so", "--input", "x=absent.npy", cwd=built))
    assert "absent.npy" in line


def test_wrong_input_shape_is_one_line(built: Path) -> None:
    np.save(built / "wide.npy", np.zeros((1, 65), np.float32))
    line = one_line_error(run_kiln("run", "mlp.so", "--input", "x=wide.npy", cwd=built))
    assert line.startswith("kiln run: error:") and "x" in line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_kiln("--debug", "compile", "missing.onnx", "-o", "m.so", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`kiln targets list | head -1`: the first line, and nothing on stderr."""
    command = f"'{sys.executable}' -m kiln targets list | head -1"
    proc = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0
    assert proc.stdout.split() == ["tag", "kind", "codegen", "description"]
    assert proc.stderr == ""


def test_reader_gone_before_the_write_is_quiet(tmp_path: Path) -> None:
    """The reader exits before kiln writes a byte: kiln's write meets EPIPE, says nothing."""
    command = f"'{sys.executable}' -m kiln targets list | true; echo $? >&2"
    proc = subprocess.run(["bash", "-c", command.replace("echo $?", "echo ${PIPESTATUS[0]}")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.stderr.strip() == "141"  # 128 + SIGPIPE, as a shell tool killed by it


def test_a_bug_is_one_line_and_debug_anywhere_shows_it(tmp_path: Path) -> None:
    """An unexpected exception inside a command: exit 1, one line asking for --debug."""
    script = (
        "import sys\n"
        "import kiln.cli.targets as t\n"
        "def broken():\n"
        "    raise RuntimeError('simulated bug')\n"
        "t.cmd_kinds = broken\n"
        "from kiln.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "targets", "kinds"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "internal error: RuntimeError: simulated bug" in line and "--debug" in line
    for argv in (["--debug", "targets", "kinds"], ["targets", "kinds", "--debug"]):
        shown = subprocess.run([sys.executable, "-c", script, *argv], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert shown.returncode != 0 and "Traceback" in shown.stderr
        assert "simulated bug" in shown.stderr
