"""Declarations of external functions and LLVM intrinsics, one per name per module."""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from kiln.errors import CompileError


def declare(
    module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type], *, what: str = "function",
) -> ir.Function:
    """The function `name` of `module`, declared on first use.

    Declaring one name twice with different types raises CompileError: a C
    function has one prototype.
    """
    ftype = ir.FunctionType(ret, list(args))
    existing = module.globals.get(name)
    if existing is not None:
        if not isinstance(existing, ir.Function) or existing.ftype != ftype:
            have = existing.ftype if isinstance(existing, ir.Function) else existing.type
            raise CompileError(
                f"{what} {name!r} is used with two different C signatures: "
                f"{have} and {ftype}; give every call of it the same argument dtypes")
        return existing
    fn = ir.Function(module, ftype, name)
    if name.startswith("llvm."):
        fn.attributes.add("nounwind")
    return fn


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """An LLVM intrinsic such as `llvm.exp.f32` (the caller spells the overload suffix)."""
    return declare(module, name, ret, args, what="intrinsic")
