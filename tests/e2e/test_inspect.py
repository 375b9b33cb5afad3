"""Every piece of a compiled executable can be named and shown (docs/artifacts.md):
`ArtifactSet.inspect()` lists the artifacts, and a loaded module shows its C source,
LLVM IR and assembly."""

from __future__ import annotations

import pytest

import kiln
from kiln.artifact import inspect_artifact
from kiln.ir import IRBuilder


def _module() -> kiln.IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        x = ib.arg("X", (16,), "float32")
        y = ib.arg("Y", (16,), "float32")
        with ib.for_range(16) as i:
            ib.store(y, [i], x[i] + 1.0)
    return ib.get()


@pytest.fixture(scope="module")
def llvm_ex() -> kiln.Executable:
    return kiln.compile(_module(), "llvm")


@pytest.fixture(scope="module")
def c_ex() -> kiln.Executable:
    return kiln.compile(_module(), "c")


def test_artifact_table_names_every_piece(llvm_ex: kiln.Executable) -> None:
    table = llvm_ex.artifacts.inspect()
    for name in ("kernels.o", "kernels.bc", "host.c"):
        assert name in table
    assert "native" in table and "none" in table


def test_llvm_artifacts_show_ir_and_assembly(llvm_ex: kiln.Executable) -> None:
    bc = llvm_ex.artifacts.get("llvm", "kernels.bc")
    assert bc is not None
    ll = inspect_artifact(bc, "ll")
    assert "define" in ll and "kiln__kernel_add_one" in ll
    asm = inspect_artifact(bc, "asm")
    assert "kiln__kernel_add_one:" in asm and "ret" in asm


def test_loaded_module_shows_sources(llvm_ex: kiln.Executable, c_ex: kiln.Executable) -> None:
    lib = llvm_ex.jit()
    assert "define" in lib.inspect_source("ll")
    assert "kiln__kernel_add_one" in lib.inspect_source("asm")
    c_src = c_ex.jit().inspect_source("c")
    assert "kiln__kernel_add_one" in c_src and "for (" in c_src
