"""The symbolic-dimension part of host.c's packed entries (docs/dynamic-shapes.md).

A function whose tensor parameters have symbolic shapes takes its dimension
variables from the tensors it is given: after the usual per-argument checks
(which then leave the shape open), the entry binds each variable at its first
occurrence, checks every other occurrence (the same variable elsewhere must
agree), the declared bounds (`kiln.dim_bounds`), then every tensor's whole shape
against its expressions, with the texts of docs/abi.md (check 7). The same order
is `kiln.runtime.dim_binding.bind_dims`, so C and Python report alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kiln.codegen.cfamily.printer import CPrinter, NameScope
from kiln.errors import CompileError
from kiln.escape import c_string_literal, int64_literal
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.shape_expr import dim_bounds, dim_vars, shape_text
from kiln.ir.tensor import BinaryOp, Buffer, Cast, Const, PrimExpr, PrimFunc, UnaryOp, Var

_NS = "kiln_host_"  # kiln_host.c's static helpers
_C_BINARY = {"add": "+", "sub": "-", "mul": "*"}
_C_CALLS = {"floordiv": f"{_NS}floordiv", "div": f"{_NS}floordiv",
            "floormod": f"{_NS}floormod", "mod": f"{_NS}floormod"}


def dim_c(d: int | PrimExpr, names: Mapping[str, str]) -> str:
    """A dimension as an int64 C expression over the locals `names` (by variable name)."""
    if isinstance(d, int):
        return int64_literal(d)
    if isinstance(d, Const):
        return dim_c(int(d.value), names)
    if isinstance(d, Var):
        return names[d.name]
    if isinstance(d, Cast):
        return dim_c(d.value, names)
    if isinstance(d, UnaryOp) and d.op == "neg":
        return f"(-{dim_c(d.a, names)})"
    if isinstance(d, BinaryOp):
        a, b = dim_c(d.a, names), dim_c(d.b, names)
        if d.op in _C_BINARY:
            return f"({a} {_C_BINARY[d.op]} {b})"
        if d.op in _C_CALLS:
            return f"{_C_CALLS[d.op]}({a}, {b})"
        if d.op in ("min", "max"):
            return f"({a} {'<' if d.op == 'min' else '>'} {b} ? {a} : {b})"
    raise CompileError(f"host entry: cannot compute the dimension {d!r} in C")


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of an entry: index, parameter and its name as a C string."""

    index: int
    buffer: Buffer
    name_c: str  # a C string literal or the name of a static char array


def emit_binding(p: CPrinter, names: NameScope, fn_name: str, fn: PrimFunc,
                 tensors: Sequence[TensorArg],
                 given: Mapping[str, tuple[str, int, str]]) -> dict[str, str]:
    """Bind and check the dimension variables of `tensors`; returns their C locals.

    `given` maps variables the caller passes as scalars to (local, argument index,
    name as a C string); the others are read from the tensors. On a failure the
    emitted code returns KILN_HOST_ARGUMENT_ERROR.
    """
    variables = sorted({v.name for a in tensors for v in dim_vars(a.buffer.shape)})
    locals_: dict[str, str] = {}
    seen: dict[str, tuple[str, str]] = {}
    for var in variables:
        local = names.fresh(var)
        at, where = names.fresh(f"{var}_at"), names.fresh(f"{var}_in")
        locals_[var], seen[var] = local, (at, where)
        if var in given:
            value, index, pname = given[var]
            p.line(f"int64_t {local} = {value};")
            p.line(f"int32_t {at} = {index};")
            p.line(f"const char* {where} = {pname};")
        else:
            p.line(f"int64_t {local} = 0;")
            p.line(f"int32_t {at} = -1;")
            p.line(f"const char* {where} = NULL;")
            if not any(isinstance(d, Var) and d.name == var for a in tensors
                       for d in a.buffer.shape):
                raise CompileError(
                    f"host entry of '{fn_name}': dimension '{var}' appears only inside "
                    "expressions of the tensors' shapes, so no argument gives its value")
        p.line(f"(void){at};")
        p.line(f"(void){where};")
    checks: list[str] = []
    for arg in tensors:
        shape = f"((const DLTensor*)args[{arg.index}].v_handle)->shape"
        for axis, d in enumerate(arg.buffer.shape):
            if isinstance(d, Var):
                at, where = seen[d.name]
                checks.append(
                    f"{_NS}bind_dim(fn, {c_string_literal(d.name)}, &{locals_[d.name]}, &{at}, "
                    f"&{where}, {arg.index}, {arg.name_c}, {shape}[{axis}])")
    # A graph function's variables are sizes of at least 1 unless `kiln.dim_bounds` says
    # otherwise (its metadata lists them so); a kernel's scalars only as that attribute says.
    bounds = dim_bounds(fn)
    default = (1, None) if fn.attrs.get(ATTR_GRAPH) else None
    for var in variables:
        if var not in bounds and default is None:
            continue
        low, high = bounds.get(var) or default or (0, None)
        checks.append(f"{_NS}dim_range(fn, {c_string_literal(var)}, {locals_[var]}, "
                      f"{int64_literal(low)}, {int64_literal(-1 if high is None else high)})")
    for arg in tensors:
        if all(isinstance(d, Var) for d in arg.buffer.shape):
            continue  # every dimension was bound or checked above
        want = names.fresh(f"{arg.buffer.name}_want")
        fill = ", ".join(f"{want}[{axis}] = {dim_c(d, locals_)}"
                         for axis, d in enumerate(arg.buffer.shape))
        p.line(f"int64_t {want}[{len(arg.buffer.shape)}];")
        checks.append(f"({fill}, {_NS}shape_is(fn, {arg.index}, {arg.name_c}, "
                      f"args[{arg.index}], {len(arg.buffer.shape)}, {want}, "
                      f"{c_string_literal(shape_text(arg.buffer.shape))}))")
    or_return(p, checks)
    return locals_


def or_return(p: CPrinter, checks: Sequence[str]) -> None:
    """Emit `if (c0 != 0 || c1 != 0 ...) return KILN_HOST_ARGUMENT_ERROR;` (first failure wins)."""
    if not checks:
        return
    p.line(f"if ({checks[0]} != 0{' ||' if len(checks) > 1 else ') {'}")
    for j, check in enumerate(checks[1:], 1):
        p.line(f"    {check} != 0{' ||' if j < len(checks) - 1 else ') {'}")
    with p.indented():
        p.line("return KILN_HOST_ARGUMENT_ERROR;")
    p.line("}")
