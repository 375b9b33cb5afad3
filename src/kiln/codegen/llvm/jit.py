"""The `llvmjit` codegen: lowered IRModule -> bitcode (+ constants) run by LLVM's JIT.

llvmjit is the one target that never becomes a shared library (the documented
exception, docs/codegen-llvm.md): its artifacts have loader "llvmjit" and
`kiln.codegen.llvm.jit_loader.load_llvmjit` compiles them in memory. The
bitcode artifact *is* the saved form: an ArtifactSet holding it can be
archived and loaded again through the same loader.
"""

from __future__ import annotations

from typing import Any

from kiln.artifact import Artifact
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.codegen import compile_module
from kiln.codegen.naming import library_metadata
from kiln.ir.module import IRModule

CODEGEN_ID = "llvmjit"
LOADER = "llvmjit"
BITCODE_FILE = "module.bc"
# Version of the module.bc metadata layout that jit_loader reads.
JIT_FORMAT = "kiln.llvmjit"
JIT_FORMAT_VERSION = 1


def codegen_llvmjit(mod: IRModule, target: Any, *, prefix: str,
                    pool: ConstantPool) -> list[Any]:
    """Compile `mod` for this process (target kind `llvmjit`) into JIT artifacts.

    Returns `module.bc` (optimised bitcode; metadata: the library metadata,
    the prefix, the host triple, CPU and features) and, when `pool` holds
    constants, `constants.bin`, both with loader "llvmjit".
    """

    compiled = compile_module(mod, target, prefix=prefix, pool=pool, jit=True)
    meta = {
        **compiled.metadata(),
        "format": JIT_FORMAT,
        "version": JIT_FORMAT_VERSION,
        "metadata": library_metadata(mod, prefix),
        "prefix": prefix,
        "kernels": dict(compiled.lowered.kernels),
        "uses_constants": compiled.lowered.uses_constants,
    }
    artifacts = [Artifact(CODEGEN_ID, LOADER, BITCODE_FILE, compiled.module.as_bitcode(), meta)]
    if len(pool):
        artifacts.append(pool.artifact(CODEGEN_ID, prefix, loader=LOADER))
    return artifacts
