"""`same_address(a, b)`: whether two buffer parameters of a kernel start at one address.

A kernel whose output may be one of its inputs' own buffer (a key/value cache written in
place, kiln.ops.kv_cache) asks this at run time and skips what is already there, as
onnxruntime's GroupQueryAttention compares its past and present pointers. It is a
`CallExtern` of a reserved name that no library defines: each backend emits the pointer
comparison itself (kiln.codegen.c.expr, kiln.codegen.llvm.lower_to_llvm) and the
reference interpreter compares the arrays' data addresses (kiln.ir._interp_externs). The
result is int32, 1 or 0; the call reads and writes nothing (name its buffers in the
kernel's ATTR_EXTERN_READS).
"""

from __future__ import annotations

from kiln.ir.tensor import Buffer, CallExtern

#: The reserved extern name (a C identifier no library exports: leading underscores).
SAME_ADDRESS = "__kiln_same_address"


def same_address(a: Buffer, b: Buffer) -> CallExtern:
    """int32 1 when `a` and `b` start at the same address, else 0."""
    return CallExtern(SAME_ADDRESS, (a, b), "int32")


__all__ = ["SAME_ADDRESS", "same_address"]
