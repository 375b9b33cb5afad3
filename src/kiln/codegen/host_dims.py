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

from kiln import dim_expr
from kiln.codegen.cfamily.printer import CPrinter, NameScope
from kiln.errors import CompileError
from kiln.escape import c_string_literal, int64_literal
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.shape_expr import dim_bounds, dim_nonzero, dim_vars, shape_text, to_dim_expr
from kiln.ir.tensor import Buffer, PrimExpr, PrimFunc, Var

_NS = "kiln_host_"  # kiln_host.c's static helpers


def dim_c(d: int | PrimExpr, names: Mapping[str, str], status: str) -> str:
    """A dimension as an int64 C expression over the locals `names` (by variable name),
    computed by kiln_dim.c's checked helpers into the int32_t `status` (`kiln.dim_expr.to_c`)."""
    return dim_expr.to_c(to_dim_expr(d), names, status)


def dim_check(fn: str, status: str, value: str, d: int | PrimExpr) -> str:
    """The C check (0 when it passes) that `value`, computed by `dim_c` into `status`, is a
    size: kiln_host.c's dim_ok with the dimension's text, as Python's message quotes it."""
    text = c_string_literal(dim_expr.quote(to_dim_expr(d)))
    return f"{_NS}dim_ok({fn}, {status}, {value}, {text})"


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
    # A graph function's variables are sizes from 0 up (as onnxruntime takes them) unless
    # `kiln.dim_bounds` says otherwise (its metadata lists them so); a kernel's scalars
    # only as that attribute says.
    bounds = dim_bounds(fn)
    default = (0, None) if fn.attrs.get(ATTR_GRAPH) else None
    for var in variables:
        if var not in bounds and default is None:
            continue
        low, high = bounds.get(var) or default or (0, None)
        checks.append(f"{_NS}dim_range(fn, {c_string_literal(var)}, {locals_[var]}, "
                      f"{int64_literal(low)}, {int64_literal(-1 if high is None else high)})")
    checks.extend(_nonzero_checks(p, names, fn, locals_))
    for arg in tensors:
        if all(isinstance(d, Var) for d in arg.buffer.shape):
            continue  # every dimension was bound or checked above
        want = names.fresh(f"{arg.buffer.name}_want")
        p.line(f"int64_t {want}[{len(arg.buffer.shape)}];")
        status = ""
        fill: list[str] = []
        for axis, d in enumerate(arg.buffer.shape):
            if isinstance(d, Var | int):  # bound above, or a constant: nothing to check
                value = locals_[d.name] if isinstance(d, Var) else int64_literal(d)
                fill.append(f"{want}[{axis}] = {value}")
                continue
            if not status:
                status = names.fresh(f"{arg.buffer.name}_status")
                p.line(f"int32_t {status} = 0;")
            # each expression is checked on its own, in order, as bind_dims does
            value = f"{want}[{axis}]"
            checks.append(f"({status} = 0, {value} = {dim_c(d, locals_, status)}, "
                          f"{dim_check('fn', status, value, d)})")
        checks.append(f"({', '.join([*fill, ''])}{_NS}shape_is(fn, {arg.index}, {arg.name_c}, "
                      f"args[{arg.index}], {len(arg.buffer.shape)}, {want}, "
                      f"{c_string_literal(shape_text(arg.buffer.shape))}))")
    or_return(p, checks)
    return locals_


def _nonzero_checks(p: CPrinter, names: NameScope, fn: PrimFunc,
                    locals_: Mapping[str, str]) -> list[str]:
    """The checks that the sizes the model divides by (`kiln.dim_nonzero`) are not 0, in
    order, as bind_dims runs them."""
    checks: list[str] = []
    for text, why in dim_nonzero(fn):
        expr = dim_expr.parse(text)
        if not dim_expr.variables(expr) <= set(locals_):
            continue  # a size of variables this entry does not bind (none in practice)
        status, value = names.fresh("nonzero_status"), names.fresh("nonzero")
        p.line(f"int32_t {status} = 0;")
        p.line(f"int64_t {value} = 0;")
        checks.append(f"({value} = {dim_expr.to_c(expr, locals_, status)}, "
                      f"{_NS}dim_nonzero(fn, {status}, {value}, "
                      f"{c_string_literal(dim_expr.quote(expr))}, {c_string_literal(why)}))")
    return checks


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
