"""kiln's LLVM backends: `llvm` (object code linked into a library) and `llvmjit`.

    artifacts = codegen_llvm(lowered_mod, Target("llvm"), prefix="kiln_", pool=pool)

Both lower every tensor-level function to a raw kernel
`i32 @{prefix}_kernel_{name}(...)` (docs/abi.md) with `lower_to_llvm`, verify
it with LLVM and optimise it at the target's opt-level. See
docs/codegen-llvm.md.
"""

from kiln.codegen.llvm.codegen import codegen_llvm
from kiln.codegen.llvm.jit import codegen_llvmjit

__all__ = ["codegen_llvm", "codegen_llvmjit"]
