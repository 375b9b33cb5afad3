"""Plain C programs built against kiln's public headers (examples/c_deploy), each
with a library compiled from an ONNX model: the shared fixture body of the C-ABI tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.runtime.native import include_dir
from support.toolchains import c_compiler

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "c_deploy"


def build_c_program(source: Path, out: Path, libs: tuple[str, ...] = ()) -> Path:
    """`source` compiled with the host C compiler, `-std=c11 -Wall -Wextra -Werror`,
    kiln's include directory, -ldl and `libs` (e.g. "-pthread"); skips the test when
    there is no compiler."""
    subprocess.run([c_compiler(), "-std=c11", "-Wall", "-Wextra", "-Werror",
                    f"-I{include_dir()}", str(source), "-ldl", *libs, "-o", str(out)],
                   check=True, timeout=300)
    return out


def program_and_library(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory, model: onnx.ModelProto,
                        example: str) -> tuple[Path, Path]:
    """(the program built from examples/c_deploy/`example`.c, `model`'s library compiled
    for the target `request.param`) in a fresh temporary directory."""
    c_compiler()  # skip before compiling the model
    tmp = tmp_path_factory.mktemp(f"{example}_{request.param}")
    lib = kiln.compile(from_onnx(model), request.param).export_library(tmp / f"{example}.so")
    return build_c_program(EXAMPLES / f"{example}.c", tmp / example), lib
