"""PTX from LLVM IR: `ptxas` (CUDA toolkit) must assemble what kiln emits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.codegen.cuda import NVPTX_TRIPLE, emit_ptx
from kiln.errors import CompileError, TargetError

# out[i] = max(a[i], 0) over a 1-D grid, bounds-checked: the shape of a fused elementwise kernel.
RELU_KERNEL = f"""
target triple = "{NVPTX_TRIPLE}"
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
define ptx_kernel void @relu(ptr addrspace(1) %a, ptr addrspace(1) %out, i32 %n) {{
entry:
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %b = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %w = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %bw = mul i32 %b, %w
  %i = add i32 %bw, %t
  %in = icmp slt i32 %i, %n
  br i1 %in, label %body, label %done
body:
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %y = call float @llvm.maxnum.f32(float %x, float 0.0)
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %y, ptr addrspace(1) %po
  br label %done
done:
  ret void
}}
declare float @llvm.maxnum.f32(float, float)
"""


def test_ptx_names_the_kernel_and_arch() -> None:
    ptx = emit_ptx(RELU_KERNEL, "sm_90")
    assert ".target sm_90" in ptx
    assert ".visible .entry relu(" in ptx
    assert "%ctaid.x" in ptx and "%tid.x" in ptx


def test_ptxas_assembles_the_ptx(tmp_path: Path) -> None:
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not on PATH")
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
