"""Byte sizes against the target's address space, checked before any code is written.

A tensor of `[2**62, 4]` float32 is 2**66 bytes: its size wraps in 64-bit C
(`malloc` gets a small number) and the first call writes past the block. So
every buffer a lowered module names (parameters, results, workspaces, local
arrays, constants, views) must fit in one C object of the target: at most
PTRDIFF_MAX = 2**(pointer bits - 1) - 1 bytes (C pointer differences and GCC's
object size limit), which also keeps every element offset within int64.
A buffer past that is a CompileError naming the tensor and its function.
"""

from __future__ import annotations

import struct
from typing import Any

from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.attrs import ATTR_PARALLEL_OF
from kiln.ir.module import IRModule
from kiln.ir.outlined import is_loop_body, kernel_funcs
from kiln.ir.tensor import Allocate, AllocConst, Buffer, DeclBuffer
from kiln.ir.visitor import iter_stmts

# Architectures (the first part of a triple) whose pointers are 64 bits wide;
# every other one kiln targets (arm, thumb*, riscv32, i686, wasm32, ...) has 32.
_ARCH_64 = ("x86_64", "amd64", "aarch64", "arm64", "riscv64", "ppc64", "powerpc64",
            "mips64", "s390x", "sparcv9", "sparc64", "wasm64", "loongarch64", "nvptx64",
            "amdgcn")


def host_pointer_bits() -> int:
    """Pointer width of this process."""
    return struct.calcsize("P") * 8


def triple_pointer_bits(triple: str | None) -> int:
    """Pointer width of a target triple (None: this machine)."""
    if not triple:
        return host_pointer_bits()
    arch = str(triple).split("-", 1)[0].lower()
    if arch.endswith("_32") or arch == "x86_64_x32":  # ILP32 ABIs of 64-bit machines
        return 32
    return 64 if arch.startswith(_ARCH_64) else 32


def target_pointer_bits(target: Any) -> int:
    """Pointer width of a `kiln.target.Target` of kind `c` (None: this machine)."""
    try:  # like kiln.codegen.c.flags.target_attr: any object, or None, is this machine
        triple = target.get("mtriple")
    except Exception:
        triple = None
    return triple_pointer_bits(triple if isinstance(triple, str) else None)


def max_object_bytes(pointer_bits: int) -> int:
    """The largest C object a target with `pointer_bits`-bit pointers can hold."""
    return (1 << (pointer_bits - 1)) - 1


def check_buffer_sizes(mod: IRModule, pointer_bits: int) -> None:
    """CompileError if some buffer of `mod` is larger than one object of the target."""

    limit = max_object_bytes(pointer_bits)
    # An outlined loop body's buffers are its kernel's (parameters) or made in the loop:
    # reported under the kernel's name.
    bodies = [fn for fn in mod.prim_funcs().values() if is_loop_body(fn)]
    for name, fn in kernel_funcs(mod).items():
        buffers: list[tuple[str, Buffer]] = [("parameter", p) for p in fn.params
                                             if isinstance(p, Buffer)]
        mine = [b.body for b in bodies if b.attrs[ATTR_PARALLEL_OF] == name]
        # only statements bind buffers: the expressions need no walk
        for node in (n for body in (fn.body, *mine) for n in iter_stmts(body)):
            if isinstance(node, Allocate):
                buffers.append(("workspace", node.buffer))
            elif isinstance(node, AllocConst):
                buffers.append(("constant", node.buffer))
            elif isinstance(node, DeclBuffer):
                buffers.append(("tensor", node.buffer))
        # The tensor at fault before the workspace arena that holds it.
        buffers.sort(key=lambda item: item[0] == "workspace")
        for kind, buf in buffers:
            if any(not isinstance(d, int) for d in buf.shape):
                continue  # symbolic: checked where the shape is known (host entry)
            size = buf.numel() * dt.itemsize(buf.dtype)
            if size > limit:
                raise CompileError(
                    f"{kind} {buf.name!r} of function {name!r} ({buf.dtype}"
                    f"{list(buf.shape)}) needs {size} bytes, more than a "
                    f"{pointer_bits}-bit target can address in one object ({limit} bytes)")


__all__ = [
    "check_buffer_sizes",
    "host_pointer_bits",
    "max_object_bytes",
    "target_pointer_bits",
    "triple_pointer_bits",
]
