"""PTX from LLVM IR: `ptxas` (CUDA toolkit) must assemble what kiln emits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiln.codegen.constants import ConstantPool
from kiln.codegen.cuda import emit_ptx
from kiln.errors import CompileError, TargetError
from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import CallExtern, Cast, Intrin
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


def _exp_twice() -> IRModule:
    """exp(x) as an intrinsic and as libm's `expf`, in float32 and float64."""
    ib = IRBuilder()
    with ib.prim_func("exps"):
        x = ib.arg("X", (4,), "float32")
        y = ib.arg("Y", (4,), "float32")
        z = ib.arg("Z", (4,), "float64")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], Intrin("exp", (x[i],)) + CallExtern("expf", (x[i],), "float32"))
            ib.store(z, [i], Intrin("exp", (Cast("float64", x[i]),)))
    return ib.get()


@pytest.mark.parametrize("table", [False, True])
def test_extern_name_table_names_the_declarations(table: bool) -> None:
    """The LLVM lowering declares math functions under the extern-name table's names: the
    intrinsic and the libm spelling of exp become one declaration of libdevice's."""
    pytest.importorskip("llvmlite", reason="LLVM lowering needs llvmlite")
    from kiln.codegen.cuda.ptx import NVPTX_TRIPLE, libdevice_names
    from kiln.codegen.llvm.lower_to_llvm import LoweringOptions, lower_module

    mod = _exp_twice()
    names = libdevice_names() if table else {}
    text = str(lower_module(mod, ConstantPool.from_module(mod), LoweringOptions(
        prefix="k_", triple=NVPTX_TRIPLE, extern_names=names)).module)
    declared = sorted(line.split("@")[1].split("(")[0].strip('"')
                      for line in text.splitlines() if line.startswith("declare"))
    if table:
        assert names["llvm.exp.f32"] == names["expf"] == "__nv_expf"
        assert declared == ["__nv_exp", "__nv_expf"]
    else:
        assert declared == ["expf", "llvm.exp.f32", "llvm.exp.f64"]
