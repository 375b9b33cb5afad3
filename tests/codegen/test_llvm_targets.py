"""The `llvm` codegen's artifacts: host objects linked and run, cross objects checked."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from llvm_helpers import PREFIX, compiled, elementwise

from kiln.artifact import ArtifactSet
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm import codegen_llvm
from kiln.codegen.naming import library_metadata
from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import Intrin
from kiln.target import Target


def _weights_module() -> IRModule:
    w = np.linspace(-1, 1, 16, dtype=np.float32)
    ib = IRBuilder()
    with ib.prim_func("affine"):
        x = ib.arg("X", (16,), "float32")
        y = ib.arg("Y", (16,), "float32")
        with ib.alloc_const("W", w) as wb, ib.for_range(16, name="i", kind="vectorized") as i:
            ib.store(y, [i], Intrin("tanh", (x[i] * wb[i],)) + 1.0)
    return ib.get()


def _codegen(mod: IRModule, target: Target) -> list:  # type: ignore[type-arg]
    return codegen_llvm(mod, target, prefix=PREFIX, pool=ConstantPool.from_module(mod))


def test_codegen_llvm_returns_object_bitcode_host_and_constants() -> None:
    mod = _weights_module()
    arts = _codegen(mod, Target("llvm"))
    assert [(a.codegen_id, a.loader, a.file_name) for a in arts] == [
        ("llvm", "native", "kernels.o"), ("llvm", "none", "kernels.bc"),
        ("host", "native", "host.c"), ("llvm", "native", "constants.bin"),
        ("llvm", "native", "const_table.c")]
    obj, bc, _, consts, table = arts
    assert obj.content[:4] == b"\x7fELF"
    assert obj.metadata["functions"] == ["kiln__kernel_affine"]
    assert obj.metadata["externs"] == [] and "-lm" in obj.metadata["libs"]
    assert consts.metadata["symbol"] == "kiln__consts" and consts.size == 64
    from kiln.codegen.llvm.target_machine import llvm_binding

    parsed = llvm_binding().parse_bitcode(bc.content)
    parsed.verify()
    assert parsed.get_function("kiln__kernel_affine").visibility.name == "hidden"
    # The kernel is hidden and the constants are an undefined reference in the object.
    elf = ELFFile(io.BytesIO(obj.content))
    syms = {s.name: s for s in elf.get_section_by_name(".symtab").iter_symbols()}
    assert syms["kiln__kernel_affine"]["st_other"]["visibility"] == "STV_HIDDEN"
    # The kernels read each constant's address from the table const_table.c defines.
    assert syms["kiln__const_table"]["st_shndx"] == "SHN_UNDEF" and "kiln__consts" not in syms
    assert consts.metadata["table"] == [[0, 64]]
    assert b"kiln__consts + 0ULL" in bytes(table.content)


def test_exported_library_runs_and_hides_kernels(tmp_path: Path) -> None:
    from kiln.export import export_library

    mod = _weights_module()
    so = export_library(ArtifactSet(_codegen(mod, Target("llvm"))), library_metadata(mod, PREFIX),
                        tmp_path / "lib.so", prefix=PREFIX)
    with open(so, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        exported = {s.name for s in dynsym.iter_symbols() if s["st_shndx"] != "SHN_UNDEF"}
    assert "kiln_affine" in exported
    assert not any("_kernel_" in name or name == "kiln__consts" for name in exported)
    # Load it back in a fresh interpreter: what deploys is what was tested.
    script = textwrap.dedent(f"""
        import numpy as np
        from kiln.runtime import load_module
        m = load_module({str(so)!r})
        x = np.arange(16, dtype=np.float32) / 4
        y = np.zeros(16, np.float32)
        m["affine"](x, y)
        w = np.linspace(-1, 1, 16, dtype=np.float32)
        np.testing.assert_allclose(y, np.tanh(x * w) + 1, rtol=1e-6)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False)
    assert out.stdout.strip() == "ok", out.stderr


CROSS = [
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "EM_AARCH64", "ET_REL"),
    ({"kind": "llvm", "mtriple": "thumbv7em-none-eabi", "mcpu": "cortex-m4"}, "EM_ARM", "ET_REL"),
    ({"kind": "llvm", "mtriple": "riscv64-linux-gnu", "mattr": ["+m", "+a", "+f", "+d", "+c"]},
     "EM_RISCV", "ET_REL"),
]


@pytest.mark.parametrize(("spec", "machine", "etype"), CROSS, ids=lambda v: str(v)[:40])
def test_cross_objects_are_elf_for_their_machine(spec: dict, machine: str, etype: str) -> None:
    mod = _weights_module()
    arts = _codegen(mod, Target(spec))
    elf = ELFFile(io.BytesIO(arts[0].content))
    assert elf["e_machine"] == machine and elf["e_type"] == etype
    symbols = {s.name for s in elf.get_section_by_name(".symtab").iter_symbols()}
    assert {"kiln__kernel_affine", "kiln__const_table", "tanhf"} <= symbols
    if machine == "EM_RISCV":
        assert elf["e_flags"] & 0x6 == 0x4  # EF_RISCV_FLOAT_ABI_DOUBLE: lp64d
    if machine == "EM_ARM":
        assert arts[0].metadata["reloc"] == "static"
        assert "-lm" not in arts[0].metadata["libs"]  # bare metal: no host libm assumed


def test_wasm32_object() -> None:
    arts = _codegen(_weights_module(), Target({"kind": "llvm",
                                               "mtriple": "wasm32-unknown-unknown"}))
    assert arts[0].content[:4] == b"\0asm"


def test_arm_float_abi_attribute_selects_the_calling_convention() -> None:
    mod = elementwise("f", ["float32"], "float32", lambda a: a * 2.0, 4).get()
    spec = {"kind": "llvm", "mtriple": "thumbv7em-none-eabi", "mcpu": "cortex-m4"}
    hard = compiled(mod, {**spec, "mfloat-abi": "hard"})
    assert hard.config.triple == "thumbv7em-unknown-none-eabihf"
    asm = hard.target_machine.emit_assembly(hard.module)
    assert ".eabi_attribute\t28, 1" in asm  # Tag_ABI_VFP_args: floats in VFP registers
    soft = compiled(mod, {**spec, "mfloat-abi": "soft"})
    soft_asm = soft.target_machine.emit_assembly(soft.module)
    assert "+soft-float" in soft.config.features and "vmul" not in soft_asm


def test_unknown_triple_is_a_compile_error() -> None:
    class FakeTarget:
        def get(self, name: str, default: object = None) -> object:
            return {"mtriple": "nosucharch-linux-gnu"}.get(name, default)

    mod = elementwise("f", ["float32"], "float32", lambda a: a, 4).get()
    with pytest.raises(CompileError, match="LLVM has no backend for triple"):
        compiled(mod, FakeTarget())
