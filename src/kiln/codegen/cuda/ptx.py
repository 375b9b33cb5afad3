"""PTX from LLVM IR through llvmlite's NVPTX backend.

PTX is what the CUDA driver JIT-compiles for the GPU it runs on, so one `.ptx`
artifact serves every device at or above its `arch`; `ptxas -arch=sm_NN` checks it
ahead of time.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiln.codegen.c.externs import MATH_H
from kiln.codegen.naming import kernel_symbol
from kiln.errors import CompileError, TargetError, missing_dependency

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
_ARCH = re.compile(r"sm_\d+[af]?")


def emit_ptx(llvm_ir: str, arch: str) -> str:
    """The PTX text of `llvm_ir` (a module for `NVPTX_TRIPLE`) for GPU arch `arch` (sm_NN)."""
    if not _ARCH.fullmatch(arch):
        raise TargetError(f"CUDA arch must look like 'sm_90', got {arch!r}")
    llvm = _llvm()
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


# ------------------------------------------------------------------ kernels to PTX

# LLVM math intrinsics NVPTX has no instruction for: libdevice's `__nv_*` versions.
_LIBDEVICE_INTRINSICS = ("exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan",
                         "pow", "powi", "sinh", "cosh", "tanh", "asin", "acos", "atan",
                         "atan2", "ldexp", "frexp", "lround", "llround")
LIBDEVICE_ENV = "KILN_LIBDEVICE"


def device_ptx(mod: Any, launches: Mapping[str, Any], *, prefix: str, arch: str,
               pool: Any) -> str:
    """PTX for the per-thread functions `mod` (kiln.codegen.cuda.kernels): one
    `ptx_kernel` entry per launch, named `kernel_entry(prefix, name)`, passing
    ctaid.x and tid.x; math functions come from CUDA's libdevice (`libdevice_path`)."""
    from llvmlite import ir  # optional: llvmlite (the compiler extra)

    from kiln.codegen.llvm.lower_to_llvm import (  # heavy: it imports llvmlite
        LoweringOptions,
        lower_module,
    )

    llvm = _llvm()
    machine = llvm.Target.from_triple(NVPTX_TRIPLE).create_target_machine(cpu=arch, opt=3)
    lowered = lower_module(mod, pool, LoweringOptions(
        prefix=prefix, triple=NVPTX_TRIPLE, data_layout=str(machine.target_data),
        extern_names=libdevice_names()))
    module = lowered.module
    i32, i64 = ir.IntType(32), ir.IntType(64)
    sreg = {reg: ir.Function(module, ir.FunctionType(i32, []),
                             f"llvm.nvvm.read.ptx.sreg.{reg}.x") for reg in ("ctaid", "tid")}
    for name in launches:
        inner = module.get_global(lowered.kernels[name])
        params = inner.function_type.args[:-2]
        entry = ir.Function(module, ir.FunctionType(ir.VoidType(), params),
                            kernel_entry(prefix, name))
        entry.calling_convention = "ptx_kernel"
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        block = b.zext(b.call(sreg["ctaid"], []), i64)
        thread = b.zext(b.call(sreg["tid"], []), i64)
        b.call(inner, [*entry.args, block, thread])
        b.ret_void()
    try:
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
    except RuntimeError as exc:
        raise CompileError(f"device LLVM IR does not verify: {exc}") from None
    missing = _link_libdevice(llvm, parsed)
    if missing:
        raise CompileError(
            f"the GPU kernels call math functions {', '.join(missing)}, which PTX takes from "
            f"CUDA's libdevice; none found: install the CUDA toolkit or set "
            f"${LIBDEVICE_ENV} to libdevice.10.bc")
    entries = {kernel_entry(prefix, name) for name in launches}
    for fn in parsed.functions:
        if not fn.is_declaration and fn.name not in entries:
            fn.linkage = llvm.Linkage.internal  # lets the optimizer drop unused libdevice
    from kiln.codegen.llvm.target_machine import (
        optimize,  # heavy: kiln.codegen.llvm.target_machine imports llvmlite
    )

    optimize(parsed, machine, 3)
    text_ptx: str = machine.emit_assembly(parsed)
    return text_ptx


def kernel_entry(prefix: str, name: str) -> str:
    """The symbol of kernel `name`'s GPU entry point (`__global__` / `ptx_kernel`)."""

    return kernel_symbol(prefix, name) + "_global"


def libdevice_path() -> Path | None:
    """CUDA's libdevice bitcode: $KILN_LIBDEVICE, $CUDA_HOME, next to nvcc, /usr/local/cuda."""

    given = os.environ.get(LIBDEVICE_ENV)
    if given:
        return Path(given) if Path(given).is_file() else None
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(0, str(Path(nvcc).resolve().parents[1]))
    for root in roots:
        if root:
            found = sorted(Path(root, "nvvm", "libdevice").glob("libdevice*.bc"))
            if found:
                return found[-1]
    return None


@functools.cache
def libdevice_names() -> Mapping[str, str]:
    """The extern-name table of device code (kiln.codegen.llvm.decls.ExternModule): each
    math intrinsic NVPTX has no instruction for and each <math.h> function, by the name
    the LLVM lowering declares, -> its CUDA libdevice function (`llvm.exp.f32` and
    `expf` -> `__nv_expf`, `llvm.exp.f64` and `exp` -> `__nv_exp`)."""

    table = {name: f"__nv_{name}" for name in MATH_H}
    for op in _LIBDEVICE_INTRINSICS:
        table[f"llvm.{op}.f32"] = f"__nv_{op}f"
        table[f"llvm.{op}.f64"] = f"__nv_{op}"
    return table


def _link_libdevice(llvm: Any, module: Any) -> list[str]:
    """Link libdevice into `module` if it calls `__nv_` functions; the names left
    undefined when libdevice is not found."""
    wanted = sorted(f.name for f in module.functions
                    if f.is_declaration and f.name.startswith("__nv_"))
    if not wanted:
        return []
    path = libdevice_path()
    if path is None:
        return wanted
    library = llvm.parse_bitcode(path.read_bytes())
    library.triple = module.triple
    library.data_layout = module.data_layout
    module.link_in(library)
    return []


def _llvm() -> Any:
    try:
        import llvmlite.binding as llvm  # optional: llvmlite (the compiler extra)
    except ImportError as exc:
        missing = missing_dependency(exc, "PTX generation")
        raise (missing or exc) from exc
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm
