"""C parameter types of the raw kernels, shared by kernels.c and host.c.

docs/abi.md: one argument per IR parameter; a buffer is a pointer to its
element type, a scalar its C type (16-bit floats: their uint16_t bit pattern).
The qualifiers follow what the kernel does with each buffer:

- a buffer the kernel never writes (no store, no external call, no callee that
  writes it) is `const T*`;
- a written buffer is `T* restrict`, unless a call inside the module passes it
  memory that overlaps another argument (then plain `T*`).

This is the LLVM backend's `noalias` rule (kiln.ir.aliasing), so the
two backends promise callers the same thing: outputs do not overlap anything
else (docs/abi.md), inputs may share memory with each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.codegen.naming import C_TYPE_NAMES
from kiln.errors import CompileError
from kiln.ir.aliasing import analyze
from kiln.ir.tensor import Buffer, Param, PrimExpr, PrimFunc, Var
from kiln.ir.visitor import iter_exprs


@dataclass(frozen=True)
class ParamQualifiers:
    """Indices of the buffer parameters a kernel writes, and of those that are restrict."""

    written: frozenset[int]
    restrict: frozenset[int]


def qualifiers(funcs: dict[str, PrimFunc]) -> dict[str, ParamQualifiers]:
    """Per kernel: which buffer parameters are written and which may be `restrict`."""
    info = analyze(funcs)
    return {name: ParamQualifiers(info.written[name], info.noalias[name]) for name in funcs}


def param_ctype(param: Param, index: int, quals: ParamQualifiers,
                restrict: str = "restrict") -> str:
    """The C type of parameter `index` of a raw kernel (no name); `restrict` is the
    dialect's spelling of C99's `restrict` (kiln.codegen.cfamily.dialect)."""
    ctype = C_TYPE_NAMES[param.dtype]
    if not isinstance(param, Buffer):
        return ctype
    if index not in quals.written:
        return f"const {ctype}*"
    return f"{ctype}* {restrict}" if index in quals.restrict else f"{ctype}*"


def describe_params(fn: PrimFunc) -> str:
    """`X: float32[4, 4], n: int64` (raw names: comments pass it through c_comment)."""
    out = []
    for p in fn.params:
        if isinstance(p, Buffer):
            out.append(f"{p.name}: {p.dtype}[{', '.join(str(d) for d in p.shape)}]")
        else:
            out.append(f"{p.name}: {p.dtype}")
    return ", ".join(out)


def check_shape_vars(backend: str, name: str, fn: PrimFunc) -> None:
    """Symbolic parameter shapes may only use scalar parameters: raw kernels get pointers,
    not shapes, so a shape variable that is not a parameter has no value in the kernel."""
    scalars = {p for p in fn.params if isinstance(p, Var)}
    for p in fn.buffer_params:
        for d in p.shape:
            if not isinstance(d, PrimExpr):
                continue
            for v in iter_exprs(d):
                if isinstance(v, Var) and v not in scalars:
                    raise CompileError(
                        f"{backend}, function {name!r}: buffer {p.name!r} has the symbolic "
                        f"shape {p.shape} whose variable {v.name!r} is not a scalar parameter; "
                        "raw kernels receive pointers only, so pass every shape variable as a "
                        "scalar parameter (or use static shapes)")
