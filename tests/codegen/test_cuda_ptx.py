"""PTX from LLVM IR: `ptxas` (CUDA toolkit) must assemble what kiln emits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiln.codegen.cuda import emit_ptx
from kiln.errors import CompileError, TargetError
from support.cuda_ptx_kernels import RELU_KERNEL
from support.toolchains import require_tool


def test_ptx_names_the_kernel_and_arch() -> None:
    ptx = emit_ptx(RELU_KERNEL, "sm_90")
    assert ".target sm_90" in ptx
    assert ".visible .entry relu(" in ptx
    assert "%ctaid.x" in ptx and "%tid.x" in ptx


def test_ptxas_assembles_the_ptx(tmp_path: Path) -> None:
    ptxas = require_tool("ptxas", why="the CUDA toolkit")
    src = tmp_path / "relu.ptx"
    src.write_text(emit_ptx(RELU_KERNEL, "sm_90"))
    out = tmp_path / "relu.cubin"
    proc = subprocess.run([ptxas, "-arch=sm_90", str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"


def test_bad_inputs_are_kiln_errors() -> None:
    with pytest.raises(TargetError, match="sm_90"):
        emit_ptx(RELU_KERNEL, "ampere")
    with pytest.raises(CompileError, match="does not verify"):
        emit_ptx("define void @f( {", "sm_90")
    with pytest.raises(CompileError, match="PTX needs"):
        emit_ptx('target triple = "x86_64-unknown-linux-gnu"\n', "sm_90")
