"""PTX from LLVM IR through llvmlite's NVPTX backend.

PTX is what the CUDA driver JIT-compiles for the GPU it runs on, so one `.ptx`
artifact serves every device at or above its `arch`; `ptxas -arch=sm_NN` checks it
ahead of time.
"""

from __future__ import annotations

import re

from kiln.errors import CompileError, TargetError, missing_dependency

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
_ARCH = re.compile(r"sm_\d+[af]?")


def emit_ptx(llvm_ir: str, arch: str) -> str:
    """The PTX text of `llvm_ir` (a module for `NVPTX_TRIPLE`) for GPU arch `arch` (sm_NN)."""
    if not _ARCH.fullmatch(arch):
        raise TargetError(f"CUDA arch must look like 'sm_90', got {arch!r}")
    try:
        import llvmlite.binding as llvm
    except ImportError as exc:
        missing = missing_dependency(exc, "PTX generation")
        raise (missing or exc) from exc
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(NVPTX_TRIPLE)
    except RuntimeError as exc:
        raise CompileError(f"this llvmlite has no NVPTX backend: {exc}") from None
    try:
        module = llvm.parse_assembly(llvm_ir)
        module.verify()
    except RuntimeError as exc:
        raise CompileError(f"device LLVM IR does not verify: {exc}") from None
    if module.triple != NVPTX_TRIPLE:
        raise CompileError(
            f"device LLVM IR has triple {module.triple!r}; PTX needs {NVPTX_TRIPLE!r}")
    machine = target.create_target_machine(cpu=arch, opt=3)
    text: str = machine.emit_assembly(module)
    return text
