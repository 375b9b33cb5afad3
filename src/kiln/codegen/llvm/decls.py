"""Declarations of external functions and LLVM intrinsics, one per name per module.

A target whose math library spells functions its own way lowers into an
`ExternModule`: its extern-name table maps the name the lowering asks for (an
LLVM intrinsic `llvm.exp.f32`, a libm `expf`) to the one the target declares
(CUDA's libdevice `__nv_expf`, kiln.codegen.cuda.ptx), so every call of either
spelling reaches one declaration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llvmlite import ir

from kiln.errors import CompileError


class ExternModule(ir.Module):
    """An llvmlite module whose external functions are declared under the names of
    `extern_names` (requested name -> declared name; names not in it stay)."""

    def __init__(self, name: str, extern_names: Mapping[str, str]) -> None:
        super().__init__(name=name)
        self.extern_names = dict(extern_names)


def declare(
    module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type], *, what: str = "function",
) -> ir.Function:
    """The function `name` of `module`, declared on first use (under its extern-name
    table's name for it, in an `ExternModule`).

    Declaring one name twice with different types raises CompileError: a C
    function has one prototype.
    """
    intrinsic = name.startswith("llvm.")
    if isinstance(module, ExternModule):
        name = module.extern_names.get(name, name)
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
    if intrinsic:
        fn.attributes.add("nounwind")
    return fn


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """An LLVM intrinsic such as `llvm.exp.f32` (the caller spells the overload suffix)."""
    return declare(module, name, ret, args, what="intrinsic")
