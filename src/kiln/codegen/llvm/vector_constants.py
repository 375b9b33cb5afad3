"""Vector constants the LLVM lowering uses again and again, built once.

llvmlite keeps a constant's printed text on the constant object, and a vector
constant is one object per lane besides: a broadcast's zero mask or a dot product's
shuffle masks, built afresh at each use, cost their construction and their printing
(`split_module`) every time. These are cached by value; a constant holds no parent, so
one object serves every function and module, and the text printed is the same.
"""

from __future__ import annotations

import functools

from llvmlite import ir

I32 = ir.IntType(32)


@functools.lru_cache(maxsize=256)
def splat(ty: ir.Type, n: int, value: int) -> ir.Constant:
    """`<n x ty>` with every lane `value`."""
    return ir.Constant(ir.VectorType(ty, n), [value] * n)


@functools.lru_cache(maxsize=256)
def undef(ty: ir.Type) -> ir.Constant:
    """The undefined value of `ty`."""
    return ir.Constant(ty, ir.Undefined)


@functools.lru_cache(maxsize=256)
def lanes_mask(start: int, count: int, limit: int) -> ir.Constant:
    """The shuffle mask of lanes `start` .. `start + count - 1`, those past `limit`
    reading lane `limit` (the first lane of an undefined second operand)."""
    return ir.Constant(ir.VectorType(I32, count), [min(start + i, limit) for i in range(count)])


__all__ = ["lanes_mask", "splat", "undef"]
