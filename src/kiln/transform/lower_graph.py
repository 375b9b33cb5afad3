"""LowerGraphToTensor: each graph Function becomes a PrimFunc of the same name.

The lowered function follows the destination-passing ABI (docs/abi.md):

- graph parameters become input buffers, in order; the results (a tuple is
  flattened) become trailing output buffers the caller allocates;
- each `CallTensor` becomes `CallFunc(func, inputs + outputs)`;
- tuples and `TupleGetItem` are resolved at compile time (no code);
- each `Constant` becomes an `AllocConst` (weights, read-only);
- a value that flows straight to the result is written directly into its
  output buffer; a result that is a parameter, a constant, or a value already
  returned in an earlier position is copied by an inline copy loop;
- the inputs of a concat that kernels of the same block compute are views of its
  output, and the concat is not called (kiln.transform.concat_views);
- every other intermediate is a view (`DeclBuffer`) into ONE workspace arena,
  a global `Allocate` of uint8, laid out by the static memory planner
  (`memory_plan.py`): buffers that are never live together share bytes.

Symbolic shapes (docs/dynamic-shapes.md): the lowered function takes one int64
scalar per dimension variable after its buffers (sorted by name, the calling
convention of kernels, docs/ir.md), and passes each callee the ones it takes, by
name. Intermediates of static size keep the static plan; the others are placed
after it by `plan_symbolic`, at offsets that are expressions of those scalars, and
the arena's size is one too (computed once per call).

Data-dependent sizes (docs/abi.md, "Data-dependent output sizes"): a kernel with
`kiln.binds_dims` writes a run-time dimension's value into an int64[1] buffer after
its outputs (planned like any intermediate); the value is read right after the call
(`LetStmt`) and passed to later kernels like an input's dimension scalar. Every
buffer is planned and declared at its upper bound (each run-time dimension replaced
by its bound), and the lowered function takes one more int64 buffer after its
results, into which it stores every run-time dimension's value (`kiln.runtime_dims`).

Attributes of the result (`kiln.ir.attrs`): `kiln.graph`,
`kiln.num_outputs`, `kiln.tuple_result`, `kiln.output_names` (from the
function attribute "output_names", else `out0`, `out1`, ...) and
`kiln.workspace_bytes` (the arena size).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kiln import dim_expr
from kiln.artifact.library_schema import SIZE_TEXT_MAX
from kiln.errors import CompileError
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.attrs import (
    ATTR_ARG_DIMS,
    ATTR_BINDS_DIMS,
    ATTR_CHECK_MESSAGES,
    ATTR_GIVEN_OUTPUT_NAMES,
    ATTR_GRAPH,
    ATTR_NUM_OUTPUTS,
    ATTR_OUTPUT_NAMES,
    ATTR_RUNTIME_DIMS,
    ATTR_TUPLE_RESULT,
    ATTR_WORKSPACE_BYTES,
)
from kiln.ir.dtype import itemsize
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dim_vars,
    from_dim_expr,
    is_static,
    shape_text,
    simplify_dim,
    to_dim_expr,
)
from kiln.ir.types import Dim, TensorType, TupleType
from kiln.ir.visitor import substitute
from kiln.transform.concat_views import ConcatViews, concat_views, drop_uncalled_concats
from kiln.transform.memory_plan import (
    DEFAULT_ALIGNMENT,
    Block,
    MemoryPlan,
    live_ranges,
    plan_memory,
    plan_symbolic,
)
from kiln.transform.pass_base import Pass


@dataclass(frozen=True)
class LowerGraphToTensor(Pass):
    """Lower every graph-level function to a PrimFunc (see the module docstring)."""

    name = "lower-graph-to-tensor"
    alignment: int = DEFAULT_ALIGNMENT
    strategy: str = "greedy-by-size"
    concat_in_place: bool = True

    def run(self, mod: IRModule) -> IRModule:
        graph_funcs = mod.graph_funcs()
        if not graph_funcs:
            return mod
        funcs: dict[str, BaseFunc] = dict(mod.functions)
        # If branches and Loop bodies are lowered inside their callers (lower_control_flow)
        bodies = control_flow_functions(graph_funcs)
        for name, fn in graph_funcs.items():
            if name in bodies:
                del funcs[name]
                continue
            funcs[name] = lower_function(name, fn, mod, alignment=self.alignment,
                                         strategy=self.strategy,
                                         concat_in_place=self.concat_in_place).func
        return IRModule(drop_uncalled_concats(funcs), mod.attrs)


def control_flow_functions(graph_funcs: dict[str, g.Function]) -> set[str]:
    """Names of the graph functions some If or Loop calls (branches and bodies)."""
    out: set[str] = set()
    for fn in graph_funcs.values():
        for b in fn.bindings:
            if isinstance(b.value, g.If):
                out.update((b.value.then_branch, b.value.else_branch))
            elif isinstance(b.value, g.Loop):
                out.add(b.value.body)
    return out


# --------------------------------------------------------------------------- analysis


@dataclass(eq=False)
class GraphSlot:
    """One tensor value of the graph function."""

    # "param" | "const" | "call"; control flow (kiln.transform.lower_control_flow) adds
    # "view" (a loop's per-iteration view) and "redirect" (a branch or body result
    # written straight into `target`'s buffer)
    kind: str
    type: TensorType
    name: str
    buffer: t.Buffer | None = None
    data: np.ndarray | None = None
    def_step: int = -1
    # the shape with its run-time dimensions, when `type` holds their bounds
    actual: tuple[Dim, ...] | None = None
    uses: list[int] = field(default_factory=list)
    target: GraphSlot | None = None


GraphValue = GraphSlot | tuple["GraphValue", ...]


@dataclass
class GraphStep:
    """One call of the lowered graph function: its inputs and outputs."""

    func: str  # "" for the liveness markers of control flow (no call)
    inputs: list[GraphSlot]
    outputs: list[GraphSlot]
    # run-time dimensions the callee binds: (name, bound), each with its count slot
    binds: tuple[tuple[str, int | str], ...] = ()
    counts: list[GraphSlot] = field(default_factory=list)


@dataclass(frozen=True)
class LoweredGraph:
    """The lowered PrimFunc, plus the memory plan's inputs and result (for tests)."""

    func: t.PrimFunc
    blocks: tuple[Block, ...]
    plan: MemoryPlan
    buffers: dict[object, t.Buffer]


def _tensor_type(ty: object, where: str) -> TensorType:
    if not isinstance(ty, TensorType):
        raise CompileError(f"{where}: expected a tensor, got {ty}")
    return ty


def _static_type(ty: object, where: str) -> TensorType:
    ty = _tensor_type(ty, where)
    if not is_static(ty.shape):
        raise CompileError(f"{where}: a constant needs a static shape, got "
                           f"{shape_text(ty.shape)}")
    return ty


def flatten_value(v: GraphValue) -> list[GraphSlot]:
    """The slots of a (possibly nested tuple) value, in order."""
    if isinstance(v, GraphSlot):
        return [v]
    return [s for item in v for s in flatten_value(item)]


class GraphAnalyzer:
    """The values, steps and lifetimes of one graph function, for its lowering."""

    def __init__(self, fname: str, mod: IRModule) -> None:
        self.fname = fname
        self.mod = mod
        self.env: dict[g.Var, GraphValue] = {}
        self.consts: dict[g.Constant, GraphSlot] = {}
        self.steps: list[GraphStep] = []  # every call, nested ones too: the liveness clock
        # What the current block emits: calls, and control-flow regions holding blocks
        self.items: list[GraphStep | Region] = []

    def resolve(self, expr: g.Expr, hint: str) -> GraphValue:
        if isinstance(expr, g.Var):
            if expr not in self.env:
                raise CompileError(
                    f"graph function '{self.fname}' uses variable '{expr.name}' before it is "
                    "bound")
            return self.env[expr]
        if isinstance(expr, g.Constant):
            slot = self.consts.get(expr)
            if slot is None:
                cname = expr.name or f"const{len(self.consts)}"
                ty = _static_type(expr.type, f"{self.fname}: constant '{cname}'")
                slot = GraphSlot("const", ty, cname, t.Buffer(cname, ty.shape, ty.dtype),
                             data=expr.data)
                self.consts[expr] = slot
            return slot
        if isinstance(expr, g.Tuple):
            return tuple(self.resolve(f, f"{hint}_{i}") for i, f in enumerate(expr.fields))
        if isinstance(expr, g.TupleGetItem):
            value = self.resolve(expr.tuple_value, hint)
            if isinstance(value, GraphSlot) or not 0 <= expr.index < len(value):
                raise CompileError(
                    f"graph function '{self.fname}': TupleGetItem index {expr.index} does not "
                    f"fit a value of type {expr.tuple_value.type}")
            return value[expr.index]
        if isinstance(expr, g.CallTensor):
            return self._call(expr, hint)
        if isinstance(expr, (g.If, g.Loop)):
            # cycle: kiln.transform.lower_control_flow imports this module
            from kiln.transform.lower_control_flow import analyze_control_flow

            return analyze_control_flow(self, expr, hint)
        if isinstance(expr, g.Call):
            raise CompileError(
                f"graph function '{self.fname}' still calls operator '{expr.op}'; run the "
                "LegalizeOps pass (part of the default graph pipeline) before lowering")
        raise CompileError(
            f"graph function '{self.fname}': cannot lower {type(expr).__name__} {expr!r}")

    def _call(self, call: g.CallTensor, hint: str) -> GraphValue:
        step_index = len(self.steps)
        inputs = [s for a in call.args for s in flatten_value(self.resolve(a, hint))]
        out_types = call.out_types
        outputs = [
            GraphSlot("call", _tensor_type(ty, f"{self.fname}: output of '{call.func}'"),
                  hint if len(out_types) == 1 else f"{hint}_{i}", def_step=step_index)
            for i, ty in enumerate(out_types)
        ]
        binds = self._binds(call.func)
        counts = [GraphSlot("call", TensorType((1,), "int64"), f"{name}_count", def_step=step_index)
                  for name, _ in binds]
        self._check_callee(call.func, inputs, [*outputs, *counts], bound_outputs=bool(binds))
        for s in inputs:
            s.uses.append(step_index)
        step = GraphStep(call.func, inputs, outputs, binds, counts)
        self.steps.append(step)
        self.items.append(step)
        if isinstance(call.ret_type, TupleType):
            return tuple(outputs)
        return outputs[0]

    def _binds(self, func: str) -> tuple[tuple[str, int | str], ...]:
        """The run-time dimensions kernel `func` binds (`kiln.binds_dims`)."""
        callee = self.mod.functions.get(func)
        if not isinstance(callee, t.PrimFunc):
            return ()
        return tuple((str(n), b) for n, b in callee.attrs.get(ATTR_BINDS_DIMS, ()) or ())

    def _check_callee(self, func: str, inputs: list[GraphSlot], outputs: list[GraphSlot], *,
                      bound_outputs: bool = False) -> None:
        where = f"graph function '{self.fname}': call_tensor '{func}'"
        callee = self.mod.functions.get(func)
        if callee is None:
            known = ", ".join(sorted(self.mod.prim_funcs())) or "(none)"
            raise CompileError(f"{where}: no such function in the module. PrimFuncs: {known}")
        if not isinstance(callee, t.PrimFunc):
            raise CompileError(f"{where}: '{func}' is a graph function, not a PrimFunc")
        args = inputs + outputs
        params, dims = callee.params[:len(args)], callee.params[len(args):]
        if len(params) != len(args) or not all(isinstance(d, t.Var) for d in dims):
            raise CompileError(
                f"{where}: the PrimFunc takes {len(callee.params)} parameters but the call "
                f"passes {len(inputs)} inputs + {len(outputs)} outputs (and a kernel's "
                "dimension scalars come last)")
        sizes = _argument_sizes(callee, args)
        for i, (p, s) in enumerate(zip(params, args)):
            role = "input" if i < len(inputs) else "output"
            if not isinstance(p, t.Buffer):
                raise CompileError(
                    f"{where}: parameter {i} '{p.name}' is a scalar; call_tensor passes only "
                    "tensors")
            if bound_outputs and role == "output":  # flat, at the bound: checked by dtype
                if p.dtype != s.type.dtype or len(p.shape) != 1:
                    raise CompileError(
                        f"{where}: parameter {i} '{p.name}' is {shape_text(p.shape)} {p.dtype} "
                        f"but a kernel binding run-time dimensions takes flat "
                        f"{s.type.dtype} outputs")
                continue
            # A kernel's dimension variables are its caller's, by name (docs/ir.md), but
            # for the sizes it takes of its arguments
            shape = tuple(d if isinstance(d, int) else simplify_dim(substitute(d, sizes))
                          for d in p.shape) if sizes else p.shape
            if shape_text(shape) != shape_text(s.type.shape) or p.dtype != s.type.dtype:
                raise CompileError(
                    f"{where}: parameter {i} '{p.name}' is {shape_text(p.shape)} {p.dtype} "
                    f"but the {role} passed is {shape_text(s.type.shape)} {s.type.dtype}")


def _argument_sizes(callee: t.PrimFunc, args: list[GraphSlot]) -> dict[t.Var, t.PrimExpr]:
    """The dimension variables `callee` takes of its arguments (`ATTR_ARG_DIMS`), each
    the extent of the argument's axis it names."""
    arg_dims = callee.attrs.get(ATTR_ARG_DIMS, ())
    if not arg_dims:
        return {}
    by_name = {p.name: p for p in callee.params[len(args):] if isinstance(p, t.Var)}
    return {by_name[name]: t.as_expr(args[param].type.shape[axis], "int64")
            for name, param, axis in arg_dims if name in by_name}


# --------------------------------------------------------------------------- lowering


def lower_function(name: str, fn: g.Function, mod: IRModule, *,
                   alignment: int = DEFAULT_ALIGNMENT,
                   strategy: str = "greedy-by-size",
                   concat_in_place: bool = True) -> LoweredGraph:
    """Lower one graph function (see the module docstring); `concat_in_place`: a
    concat's inputs are views of its output (kiln.transform.concat_views)."""
    an = GraphAnalyzer(name, mod)
    params = _bind_params(name, fn, an)
    for b in fn.bindings:
        an.env[b.var] = an.resolve(b.value, b.var.name)
    results = flatten_value(an.resolve(fn.result, "result"))
    results_types = [s.type for s in results]  # before bounds replace run-time dimensions
    dims, runtime = _dimension_scalars(name, an, params, results)
    out_names = _output_names(name, fn, len(results))
    _declare_at_bounds(results, an.steps, dims, runtime)
    outs = [t.Buffer(n, s.type.shape, s.type.dtype) for n, s in zip(out_names, results)]
    claimed, copies = _claim_outputs(results, outs)

    # A concat's inputs computed here are views of its output (no copy).
    views = concat_views(an.items, mod, claimed) if concat_in_place else ConcatViews()
    ws = _plan_workspace(an.steps, claimed, views, alignment, strategy)
    view_decls = views.declarations()  # after the values they view got their buffers

    scalars: dict[str, t.Var] = {**dims, **{n: v for n, (v, _) in runtime.items()}}
    ctx = EmitContext(mod, scalars, ws.arena, {s: _offset(ws.offsets[s]) for s in ws.values})
    # the values of the run-time dimensions, for the caller
    runtime_out = (t.Buffer("runtime_dims", (len(runtime),), "int64"),) if runtime else ()
    body = _body(an, views, ctx, copies, runtime, runtime_out)
    # One flat statement list (declarations are scoped to the rest of it, see
    # kiln.ir.tensor.Allocate): workspace, constants, views into the workspace, calls.
    stmt = t.seq(*_declarations(an, ws), *view_decls, *body)

    attrs = _lowered_attrs(fn, out_names, ws.size, ctx.messages,
                           _runtime_attr(runtime, results_types, dims) if runtime else None)
    dim_params = tuple(dims[n] for n in sorted(dims))
    prim = t.PrimFunc(tuple(params) + tuple(outs) + runtime_out + dim_params, stmt, attrs)
    buffers: dict[object, t.Buffer] = {s: _buf(s) for s in ws.values}
    return LoweredGraph(prim, ws.blocks, ws.plan, buffers)


def _bind_params(name: str, fn: g.Function, an: GraphAnalyzer) -> list[t.Buffer]:
    """The input buffers of `fn`'s parameters, each bound in `an` as a "param" slot."""
    params: list[t.Buffer] = []
    for v in fn.params:
        if isinstance(v.type, TupleType):
            raise CompileError(
                f"graph function '{name}': parameter '{v.name}' is a tuple {v.type}; the "
                "lowered ABI takes flat tensors: pass the fields as separate parameters")
        ty = _tensor_type(v.type, f"graph function '{name}': parameter '{v.name}'")
        buf = t.Buffer(v.name, ty.shape, ty.dtype)
        params.append(buf)
        an.env[v] = GraphSlot("param", ty, v.name, buf)
    return params


def _dimension_scalars(name: str, an: GraphAnalyzer, params: list[t.Buffer],
                       results: list[GraphSlot]) -> tuple[dict[str, t.Var], _RuntimeDims]:
    """The dimension scalars: every variable of the parameters' shapes, read at entry,
    and the run-time dimensions the steps bind. Every value's shape must be made of
    them."""
    dims = {v.name: v for v in dim_vars(d for p in params for d in p.shape)}
    if len(an.items) != len(an.steps):  # control flow: bodies' dimensions are ours, by name
        from kiln.transform.lower_control_flow import (
            rename_dims,  # cycle: kiln.transform.lower_control_flow imports this module
        )

        rename_dims(an.steps, dims)
    runtime = _runtime_dims(name, an.steps, dims)
    for s in [*results, *(o for step in an.steps for o in step.outputs)]:
        _check_runtime_shape(name, s, runtime)
        unknown = sorted({v.name for v in dim_vars(s.type.shape)} - set(dims) - set(runtime))
        if unknown:
            raise CompileError(
                f"graph function '{name}': value '{s.name}' has shape "
                f"{shape_text(s.type.shape)}, whose dimension {unknown[0]!r} no parameter's "
                "shape gives (a size known only at run time is not supported)")
    return dims, runtime


def _declare_at_bounds(results: list[GraphSlot], steps: list[GraphStep],
                       dims: dict[str, t.Var], runtime: _RuntimeDims) -> None:
    """Every buffer is declared at its upper bound: give each value its type with the
    run-time dimensions replaced by their bounds, keeping its actual shape where that
    differs."""
    for s in [*results, *(o for step in steps for o in (*step.outputs, *step.counts))]:
        bound = _bound_shape(s.type.shape, runtime)
        if bound != s.type.shape and s.actual is None:
            s.actual = _by_name(s.type.shape, {**dims, **{n: v for n, (v, _) in runtime.items()}})
        s.type = TensorType(bound, s.type.dtype)


def _claim_outputs(results: list[GraphSlot], outs: list[t.Buffer]
                   ) -> tuple[dict[GraphSlot, int], list[tuple[t.Buffer, t.Buffer, GraphSlot]]]:
    """The results written straight into their output buffer (slot -> position), and
    the copies (destination, source, slot) of the others."""
    # A value computed by a call and returned is written straight into its
    # output buffer (the first position it appears in); others are copied.
    claimed: dict[GraphSlot, int] = {}
    copies: list[tuple[t.Buffer, t.Buffer, GraphSlot]] = []
    for k, s in enumerate(results):
        if s.kind == "call" and s not in claimed:
            claimed[s] = k
            s.buffer = outs[k]
        else:
            src = outs[claimed[s]] if s in claimed else s.buffer
            assert src is not None
            copies.append((outs[k], src, s))
    return claimed, copies


@dataclass(frozen=True)
class _Workspace:
    """The arena of a lowered function: the values placed in it, the static plan (and
    its input blocks), each value's byte offset, the arena's size and buffer (None when
    no value is placed)."""

    values: list[GraphSlot]
    blocks: tuple[Block, ...]
    plan: MemoryPlan
    offsets: dict[Hashable, Dim]
    size: Dim
    arena: t.Buffer | None


def _plan_workspace(steps: list[GraphStep], claimed: dict[GraphSlot, int], views: ConcatViews,
                    alignment: int, strategy: str) -> _Workspace:
    """Place in one arena everything a call writes that is neither a claimed result nor
    a concat view, and give each such value its buffer."""
    inter = [s for step in steps for s in (*step.outputs, *step.counts)
             if s not in claimed and s.kind == "call" and s not in views.pieces]
    defs: dict[Hashable, int] = {s: s.def_step for s in inter}
    uses: dict[Hashable, list[int]] = {s: s.uses for s in inter}
    views.widen(defs, uses)
    ranges = live_ranges(defs, uses)
    static = [s for s in inter if is_static(s.type.shape)]
    blocks = tuple(Block(s, s.type.numel() * itemsize(s.type.dtype), *ranges[s])
                   for s in static)
    plan = plan_memory(blocks, alignment=alignment, strategy=strategy)
    offsets: dict[Hashable, Dim] = dict(plan.offsets)
    workspace: Dim = plan.total
    if len(static) < len(inter):  # symbolic sizes go after the static plan
        symbolic = [(s, _nbytes(s.type), *ranges[s]) for s in inter if s not in plan.offsets]
        placed, workspace = plan_symbolic(symbolic, plan.total, alignment=alignment)
        offsets.update(placed)
    for s in inter:
        s.buffer = t.Buffer(s.name, s.type.shape, s.type.dtype)
    arena: t.Buffer | None = None
    if inter:
        if isinstance(workspace, int):  # zero-size values still need a base pointer
            workspace = max(workspace, alignment)
        arena = t.Buffer("workspace", (workspace,), "uint8", "global")
    return _Workspace(inter, blocks, plan, offsets, workspace, arena)


def _body(an: GraphAnalyzer, views: ConcatViews, ctx: EmitContext,
          copies: list[tuple[t.Buffer, t.Buffer, GraphSlot]], runtime: _RuntimeDims,
          runtime_out: tuple[t.Buffer, ...]) -> list[t.Stmt]:
    """The statements after the declarations: the calls (concats made views dropped),
    the copies of results, and the stores of the run-time dimensions into
    `runtime_out`."""
    body: list[t.Stmt] = [stmt for item in an.items if id(item) not in views.dropped
                          for stmt in emit_item(item, ctx)]
    for dst, src, slot in copies:
        body.append(copy_stmt(_actual_view(slot, dst, body), _actual_view(slot, src, body)))
    if runtime_out:
        body.extend(t.Store(runtime_out[0], runtime[n][0], (t.Const(j, "int64"),))
                    for j, n in enumerate(sorted(runtime)))
    if not body:
        body.append(t.Evaluate(t.Const(0, "int32")))
    return body


def _declarations(an: GraphAnalyzer, ws: _Workspace) -> list[t.Stmt]:
    """The workspace's allocation, the constants, then the views into the workspace."""
    decls: list[t.Stmt] = []
    if ws.arena is not None:
        decls.append(t.Allocate(ws.arena))
    for slot in an.consts.values():
        assert slot.data is not None
        decls.append(t.AllocConst(_buf(slot), slot.data))
    if ws.arena is not None:
        decls.extend(t.DeclBuffer(_buf(s), ws.arena, _offset(ws.offsets[s])) for s in ws.values)
    return decls


def _lowered_attrs(fn: g.Function, out_names: list[str], workspace: Dim,
                   messages: dict[int, str], runtime_dims: tuple[Any, ...] | None
                   ) -> dict[str, Any]:
    """The lowered function's attributes: `fn`'s own (but the given output names), then
    the lowering's (`runtime_dims`: `kiln.runtime_dims`, None when there are none)."""
    attrs = {k: v for k, v in fn.attrs.items() if k != ATTR_GIVEN_OUTPUT_NAMES}
    attrs.update({
        ATTR_GRAPH: True,
        ATTR_NUM_OUTPUTS: len(out_names),
        ATTR_TUPLE_RESULT: isinstance(fn.ret_type, TupleType),
        ATTR_OUTPUT_NAMES: tuple(out_names),
        # bytes, or for symbolic sizes the text of the expression (metadata shows it)
        ATTR_WORKSPACE_BYTES: workspace if isinstance(workspace, int) else _size_text(workspace),
    })
    if runtime_dims is not None:
        attrs[ATTR_RUNTIME_DIMS] = runtime_dims
    if messages:  # a Loop's iteration limit (kiln.transform.lower_control_flow)
        attrs[ATTR_CHECK_MESSAGES] = tuple(sorted(messages.items()))
    return attrs


@dataclass(frozen=True)
class EmitContext:
    """What emitting a lowered function's statements needs: the module (callees), the
    dimension scalars by name (the inputs' and the run-time ones), the workspace arena
    and the byte offset of each value placed in it."""

    mod: IRModule
    dims: dict[str, t.Var]
    arena: t.Buffer | None
    offsets: dict[GraphSlot, int | t.PrimExpr]
    # the function's own check codes and their messages (`kiln.check_messages`)
    messages: dict[int, str] = field(default_factory=dict)


class Region(Protocol):
    """A control-flow region of a block (kiln.transform.lower_control_flow)."""

    def emit(self, ctx: EmitContext) -> list[t.Stmt]: ...


def emit_item(item: GraphStep | Region, ctx: EmitContext) -> list[t.Stmt]:
    """The statements of one item of a block: a kernel call, or a control-flow region,
    which emits its own."""
    if not isinstance(item, GraphStep):
        return item.emit(ctx)
    if item.binds:
        return _producer_call(item, ctx.mod, ctx.dims)
    stmts: list[t.Stmt] = []
    args: list[t.Buffer | t.PrimExpr] = [_actual_view(s, _buf(s), stmts)
                                         for s in item.inputs + item.outputs]
    callee = ctx.mod.functions[item.func]
    assert isinstance(callee, t.PrimFunc)
    args += _dimension_args(callee, item.inputs + item.outputs, ctx.dims, len(args))
    stmts.append(t.CallFunc(item.func, tuple(args)))
    return stmts


def _dimension_args(callee: t.PrimFunc, slots: list[GraphSlot], dims: dict[str, t.Var],
                    given: int) -> list[t.PrimExpr]:
    """The dimension scalars of a call of `callee` after its `given` buffers: the
    caller's by name, and where the callee takes a size of an argument at run time
    (`ATTR_ARG_DIMS`) that argument's static extent."""
    from_args = {name: (param, axis) for name, param, axis in callee.attrs.get(ATTR_ARG_DIMS, ())}
    out: list[t.PrimExpr] = []
    for p in callee.params[given:]:
        if p.name not in from_args:
            out.append(dims[p.name])
            continue
        param, axis = from_args[p.name]
        extent = slots[param].type.shape[axis]
        if not isinstance(extent, int):  # such kernels are shared by static sizes only
            raise CompileError(f"a kernel takes axis {axis} of its argument {param} "
                               f"({p.name}) at run time; the call's is symbolic: {extent}")
        out.append(t.Const(extent, "int64"))
    return out


# --------------------------------------------------------------------------- run-time dims


_RuntimeDims = dict[str, tuple[t.Var, Dim]]  # name -> (variable, bound over the inputs' dims)


def _runtime_dims(fname: str, steps: list[GraphStep], dims: dict[str, t.Var]) -> _RuntimeDims:
    """The run-time dimensions the steps bind, each with its bound over the parameters'
    dimensions (a bound mentioning an earlier run-time dimension takes that one's bound)."""
    runtime: _RuntimeDims = {}
    for step in steps:
        for name, bound in step.binds:
            if name in runtime or name in dims:
                raise CompileError(f"graph function '{fname}': dimension '{name}' is bound "
                                   "twice (by an input or another data-dependent operator)")
            b: Dim = bound if isinstance(bound, int) else from_dim_expr(dim_expr.parse(bound), dims)
            b = _bound_dim(b, runtime)
            unknown = sorted({v.name for v in dim_vars(b)} - set(dims))
            if unknown:
                raise CompileError(f"graph function '{fname}': the bound {bound!r} of "
                                   f"dimension '{name}' mentions {unknown[0]!r}, which no "
                                   "parameter gives")
            # the variable the values' types hold (one object per name), else a fresh one
            var = next((v for o in step.outputs for v in dim_vars(o.type.shape)
                        if v.name == name), t.Var(name, "int64"))
            runtime[name] = (var, b)
    return runtime


def _bound_dim(d: Dim, runtime: _RuntimeDims) -> Dim:
    """`d` with every run-time dimension replaced by its bound."""
    if isinstance(d, int):
        return d
    vmap = {v: t.as_expr(runtime[v.name][1], "int64") for v in dim_vars(d) if v.name in runtime}
    return simplify_dim(substitute(d, vmap)) if vmap else d


def _bound_shape(shape: tuple[Dim, ...], runtime: _RuntimeDims) -> tuple[Dim, ...]:
    return tuple(_bound_dim(d, runtime) for d in shape)


def _check_runtime_shape(fname: str, s: GraphSlot, runtime: _RuntimeDims) -> None:
    """A dimension mentioning a run-time size must be a product of sizes (`n`, `2*n`,
    `n*batch`): then its bound is never below its value, and no kernel writes past a
    buffer planned at the bound."""
    for d in s.type.shape:
        if isinstance(d, int) or not {v.name for v in dim_vars(d)} & set(runtime):
            continue
        if not _is_product(to_dim_expr(d)):
            raise CompileError(
                f"graph function '{fname}': value '{s.name}' has shape "
                f"{shape_text(s.type.shape)}; a dimension computed from a data-dependent "
                f"size must be a product of sizes (got {dim_text(d)}), so that its upper "
                "bound holds it")


def _is_product(e: dim_expr.Expr) -> bool:
    if isinstance(e, dim_expr.Var):
        return True
    if isinstance(e, dim_expr.Const):
        return e.value >= 0
    return (isinstance(e, dim_expr.Binary) and e.op is dim_expr.Op.MUL
            and _is_product(e.a) and _is_product(e.b))


def _by_name(shape: tuple[Dim, ...], variables: dict[str, t.Var]) -> tuple[Dim, ...]:
    """`shape` with each dimension variable replaced by the one of `variables` of its name."""
    out: list[Dim] = []
    for d in shape:
        vmap = {v: variables[v.name] for v in dim_vars(d)
                if v.name in variables and variables[v.name] is not v}
        out.append(simplify_dim(substitute(d, vmap)) if vmap and not isinstance(d, int) else d)
    return tuple(out)


def _actual_view(s: GraphSlot, buf: t.Buffer, body: list[t.Stmt]) -> t.Buffer:
    """`buf`, or for a value of data-dependent size a view of it with its actual shape
    (declared in `body` where the run-time dimensions are bound): kernels take the
    compact layout of the actual size."""
    if s.actual is None:
        return buf
    view = t.Buffer(buf.name, s.actual, buf.dtype)
    body.append(t.DeclBuffer(view, buf, 0))
    return view


def _producer_call(step: GraphStep, mod: IRModule, scalars: dict[str, t.Var]) -> list[t.Stmt]:
    """The call of a kernel binding run-time dimensions: flat views of its outputs, the
    call, then each dimension read from its count buffer."""
    callee = mod.functions[step.func]
    assert isinstance(callee, t.PrimFunc)
    stmts: list[t.Stmt] = []
    args: list[t.Buffer | t.PrimExpr] = [_buf(s) for s in step.inputs]
    for s in step.outputs:
        view = t.Buffer(f"{s.name}_flat", (dim_product(s.type.shape),), s.type.dtype)
        stmts.append(t.DeclBuffer(view, _buf(s), 0))
        args.append(view)
    args += [_buf(c) for c in step.counts]
    args += [scalars[p.name] for p in callee.params[len(args):]]
    stmts.append(t.CallFunc(step.func, tuple(args)))
    for (name, _), count in zip(step.binds, step.counts):
        stmts.append(t.LetStmt(scalars[name], t.Load(_buf(count), (t.Const(0, "int64"),))))
    return stmts


def _runtime_attr(runtime: _RuntimeDims, results: list[TensorType],
                  dims: dict[str, t.Var]) -> tuple[tuple[str, int | str, tuple[Any, ...]], ...]:
    """`kiln.runtime_dims`: (name, bound, places) per run-time dimension, sorted by name;
    places are `(result, axis, actual)` for each result dimension that mentions one
    (actual: its text over the inputs' and run-time dimensions)."""
    out = []
    for name in sorted(runtime):
        bound = simplify_dim(runtime[name][1])
        places = tuple((k, axis, dim_text(d)) for k, ty in enumerate(results)
                       for axis, d in enumerate(ty.shape)
                       if not isinstance(d, int) and name in {v.name for v in dim_vars(d)})
        out.append((name, bound if isinstance(bound, int) else dim_text(bound), places))
    return tuple(out)


def _buf(s: GraphSlot) -> t.Buffer:
    assert s.buffer is not None
    return s.buffer


def _nbytes(ty: TensorType) -> Dim:
    return dim_product((*ty.shape, itemsize(ty.dtype)))


def _offset(offset: Dim) -> int | t.PrimExpr:
    return offset if isinstance(offset, int) else t.as_expr(offset, "int64")


def _output_names(name: str, fn: g.Function, count: int) -> list[str]:
    given = fn.attrs.get(ATTR_GIVEN_OUTPUT_NAMES)
    if given is None:
        return [f"out{i}" for i in range(count)]
    names = [given] if isinstance(given, str) else list(given)
    if len(names) != count or not all(isinstance(n, str) and n for n in names):
        raise CompileError(
            f"graph function '{name}': attribute 'output_names' {given!r} must list "
            f"{count} non-empty name(s), one per result")
    return names


def copy_stmt(dst: t.Buffer, src: t.Buffer) -> t.Stmt:
    """Loops copying `src` into `dst` element by element (same shape and dtype)."""
    loop_vars = [t.Var(f"i{d}") for d in range(len(dst.shape))]
    stmt: t.Stmt = t.Store(dst, t.Load(src, tuple(loop_vars)), tuple(loop_vars))
    for var, extent in reversed(list(zip(loop_vars, dst.shape))):
        stmt = t.For(var, t.Const(0, var.dtype), t.as_expr(extent, var.dtype), "serial", stmt)
    return stmt


def _size_text(size: t.PrimExpr) -> str | None:
    """The text of a symbolic workspace size, or None (unknown) where it is longer than
    library metadata holds (kiln.artifact.library_schema.SIZE_TEXT_MAX)."""
    text = dim_text(size)
    return text if len(text) <= SIZE_TEXT_MAX else None
