"""Control flow in `lower-graph-to-tensor`: graph-level `If` and `Loop` become a real
`IfThenElse` and a real `While` loop of the lowered host function.

The branches and the loop body are graph functions of the module (already
legalized like any other, so their kernels went through the normal pipeline).
Their bindings are analysed in place, as part of the calling function: their
kernel calls join its steps, so every value they compute is a block of the one
workspace arena, placed by the same memory planner. Liveness follows the
program text, with two additions:

- the values a region defines for itself (an If's outputs; a Loop's two state
  buffers, counter, condition and scan outputs) are defined by a marker step at
  the region's start and kept alive to a marker step at its end;
- a value defined before a loop and read in its body is kept alive to the end of
  the loop (every iteration reads it).

If: `IfThenElse(cond[()], then, else)`; each branch's result is written straight
into the If's output buffer when a kernel of the branch computes it, else copied.

Loop (ONNX semantics, kiln.ir.graph.Loop): the loop-carried values live in two
arena buffers A and B (ping-pong): iteration `i` reads its state from the half
of parity `i % 2` and its body's kernels write the next state straight into the
other half (views whose byte offsets are `select(i % 2 == 0, A, B)`), so no
iteration copies or allocates. A counter and the condition are 0-d arena
tensors, which the body reads as its `iteration` and `cond` parameters:

    A = init; counter[()] = 0; keep[()] = cond (or true); m = trip_count[()]
    while counter[()] < m and keep[()]:
        i = counter[()]
        cur = view(A if i % 2 == 0 else B); next = view(B if i % 2 == 0 else A)
        <body kernels: read cur, write next and scan slice i>
        keep[()] = body_cond[()]; counter[()] = i + 1
    final = copy of view(A if counter % 2 == 0 else B)

A scan output stacks one slice per iteration: slice `i` is a view at byte `i *
slice_bytes` of its buffer, and a check (error 20) refuses an iteration past its
length and a loop that stopped before filling it.

With the module attribute `kiln.max_loop_iterations` (kiln.compile's
max_loop_iterations) every iteration starts with `check(i < limit)`, whose code is
the loop's own (FIRST_FUNCTION_ERROR + the body's place among the module's graph
functions) and whose message, recorded in the lowered function's
`kiln.check_messages`, names the Loop node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import CompileError
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_MAX_LOOP_ITERATIONS, ATTR_SOURCE_NODE
from kiln.ir.dtype import itemsize
from kiln.ir.kernel_errors import ERROR_LOOP_SCAN, FIRST_FUNCTION_ERROR
from kiln.ir.shape_expr import dim_product, dim_vars
from kiln.ir.types import TensorType, TupleType
from kiln.ir.visitor import substitute
from kiln.transform.lower_graph import (
    EmitContext,
    GraphAnalyzer,
    GraphSlot,
    GraphStep,
    GraphValue,
    Region,
    copy_stmt,
    emit_item,
    flatten_value,
)

_BOOL0 = TensorType((), "bool")
_INT0 = TensorType((), "int64")


def analyze_control_flow(an: GraphAnalyzer, expr: g.If | g.Loop, hint: str) -> GraphValue:
    """Analyse an If or Loop binding of the function `an` lowers; return its value."""
    if isinstance(expr, g.If):
        return _analyze_if(an, expr, hint)
    return _analyze_loop(an, expr, hint)


def rename_dims(steps: list[GraphStep], dims: dict[str, t.Var]) -> None:
    """Give every value the calling function's dimension variables: a body function
    has its own, named as its caller's (docs/ir.md)."""
    for step in steps:
        for s in step.outputs:
            found = dim_vars(s.type.shape)
            if any(dims.get(v.name, v) is not v for v in found):
                vmap = {v: dims[v.name] for v in found if v.name in dims}
                shape = tuple(d if isinstance(d, int) else substitute(d, vmap)
                              for d in s.type.shape)
                s.type = TensorType(shape, s.type.dtype)


# --------------------------------------------------------------------------- analysis


def _single(an: GraphAnalyzer, expr: g.Expr, hint: str, what: str) -> GraphSlot:
    value = an.resolve(expr, hint)
    if not isinstance(value, GraphSlot):
        raise CompileError(f"graph function '{an.fname}': {what} is a tuple; it must be a "
                           "tensor")
    return value


def _tensor_fields(ty: g.Type) -> list[TensorType]:
    fields = ty.fields if isinstance(ty, TupleType) else (ty,)
    out: list[TensorType] = []
    for f in fields:
        if isinstance(f, TupleType):
            out.extend(_tensor_fields(f))
        else:
            out.append(f)
    return out


def _marker(an: GraphAnalyzer, inputs: list[GraphSlot], outputs: list[GraphSlot]) -> int:
    """A step without a call: defines `outputs`, uses `inputs` (liveness only)."""
    index = len(an.steps)
    for s in outputs:
        s.def_step = index
    for s in inputs:
        s.uses.append(index)
    an.steps.append(GraphStep("", inputs, outputs))
    return index


@dataclass
class _Block:
    """An analysed branch or body: its items and the slot of each result."""

    items: list[GraphStep | Region]
    results: list[GraphSlot]


def _analyze_body(an: GraphAnalyzer, name: str, params: list[GraphValue], role: str) -> _Block:
    fn = an.mod.functions.get(name)
    if not isinstance(fn, g.Function):
        raise CompileError(f"graph function '{an.fname}': {role} '{name}' is not a graph "
                           "function of the module")
    if len(fn.params) != len(params):
        raise CompileError(f"graph function '{an.fname}': {role} '{name}' takes "
                           f"{len(fn.params)} parameters, control flow passes {len(params)} "
                           "(run kiln.ir.verify)")
    for p, v in zip(fn.params, params):
        an.env[p] = v
    outer, an.items = an.items, []
    try:
        for b in fn.bindings:
            an.env[b.var] = an.resolve(b.value, f"{name}_{b.var.name}")
        results = flatten_value(an.resolve(fn.result, f"{name}_result"))
        return _Block(an.items, results)
    finally:
        an.items = outer


def _redirect(r: GraphSlot, target: GraphSlot, start: int) -> bool:
    """Let the kernel computing body result `r` write straight into `target`'s buffer,
    when a kernel of this region computes it and nothing claimed it before."""
    if r.kind != "call" or r.def_step <= start or r.target is not None:
        return False
    r.kind, r.target = "redirect", target
    return True


def _resolve_redirects(block: _Block, targets: list[GraphSlot]) -> None:
    for r, target in zip(block.results, targets):
        if r.target is target:
            r.buffer = target.buffer


def _copies(block: _Block, targets: list[GraphSlot]) -> list[t.Stmt]:
    out = []
    for r, target in zip(block.results, targets):
        if r.target is not target:
            assert r.buffer is not None and target.buffer is not None
            out.append(copy_stmt(target.buffer, r.buffer))
    return out


@dataclass(eq=False)
class _IfRegion:
    cond: GraphSlot
    outputs: list[GraphSlot]
    branches: tuple[_Block, _Block]

    def emit(self, ctx: EmitContext) -> list[t.Stmt]:
        bodies = []
        for block in self.branches:
            _resolve_redirects(block, self.outputs)
            stmts = [s for item in block.items for s in emit_item(item, ctx)]
            bodies.append(t.seq(*stmts, *_copies(block, self.outputs)))
        assert self.cond.buffer is not None
        return [t.IfThenElse(t.Load(self.cond.buffer, ()), bodies[0], bodies[1])]


def _analyze_if(an: GraphAnalyzer, e: g.If, hint: str) -> GraphValue:
    cond = _single(an, e.cond, hint, "an if condition")
    args = [an.resolve(a, f"{hint}_arg{k}") for k, a in enumerate(e.args)]
    outs = [GraphSlot("call", ty, hint if len(_tensor_fields(e.ret_type)) == 1 else f"{hint}_{k}")
            for k, ty in enumerate(_tensor_fields(e.ret_type))]
    start = _marker(an, [cond, *(s for a in args for s in flatten_value(a))], outs)
    then = _analyze_body(an, e.then_branch, args, "then branch")
    other = _analyze_body(an, e.else_branch, args, "else branch")
    for block in (then, other):
        if len(block.results) != len(outs):
            raise CompileError(f"graph function '{an.fname}': a branch returns "
                               f"{len(block.results)} tensors, the if {len(outs)}")
        for r, out in zip(block.results, outs):
            _redirect(r, out, start)
    _marker(an, [cond, *outs], [])  # outputs written in the branches stay put
    an.items.append(_IfRegion(cond, outs, (then, other)))
    return _regroup(outs, e.ret_type)


def _regroup(slots: list[GraphSlot], ty: g.Type) -> GraphValue:
    if not isinstance(ty, TupleType):
        return slots[0]
    out: list[GraphValue] = []
    for f in ty.fields:
        n = len(_tensor_fields(f))
        out.append(_regroup(slots[:n], f))
        slots = slots[n:]
    return tuple(out)


@dataclass(eq=False)
class _LoopRegion:
    trip: GraphSlot | None
    cond: GraphSlot | None
    inits: list[GraphSlot]
    halves: list[tuple[GraphSlot, GraphSlot]]
    cur: list[GraphSlot]
    nxt: list[GraphSlot]
    counter: GraphSlot
    keep: GraphSlot
    scans: list[GraphSlot]
    scan_views: list[GraphSlot]
    finals: list[GraphSlot]
    body: _Block
    name: str
    label: str  # how errors name the loop: its ONNX node, else its body function
    limit: _Limit | None  # the iteration limit (max_loop_iterations), if any
    # filled while emitting
    stmts: list[t.Stmt] = field(default_factory=list)

    def emit(self, ctx: EmitContext) -> list[t.Stmt]:
        if ctx.arena is None:
            raise CompileError(f"loop '{self.name}': no workspace arena")
        arena = ctx.arena
        out: list[t.Stmt] = []
        zero, one, two = (t.Const(v, "int64") for v in (0, 1, 2))
        counter, keep = _buf(self.counter), _buf(self.keep)
        for (a, _), init in zip(self.halves, self.inits):
            out.append(copy_stmt(_buf(a), _buf(init)))
        out.append(t.Store(counter, zero, ()))
        out.append(t.Store(keep, t.Load(_buf(self.cond), ()) if self.cond else
                           t.Const(True, "bool"), ()))
        test: t.PrimExpr | None = t.Load(keep, ()) if self.cond else None
        if self.trip is not None:
            m = t.Var(f"{self.name}_trip_count", "int64")
            out.append(t.LetStmt(m, t.Load(_buf(self.trip), ())))
            below = t.Compare("lt", t.Load(counter, ()), m)
            test = below if test is None else t.BinaryOp("and", below, test)
        if test is None:
            raise CompileError(f"loop '{self.name}' has neither a trip count nor a condition: "
                               "it would never end")

        body: list[t.Stmt] = []
        i = t.Var("iteration", "int64")
        body.append(t.LetStmt(i, t.Load(counter, ())))
        if self.limit is not None:
            body.append(self.limit.check(i, self.label, ctx))
        even = t.Compare("eq", t.BinaryOp("floormod", i, two), zero)
        for (a, b), cur, nxt in zip(self.halves, self.cur, self.nxt):
            off_a, off_b = ctx.offsets[a], ctx.offsets[b]
            for view, first, second in ((cur, off_a, off_b), (nxt, off_b, off_a)):
                view.buffer = t.Buffer(view.name, view.type.shape, view.type.dtype)
                body.append(t.DeclBuffer(view.buffer, arena,
                                         t.Select(even, t.as_expr(first, "int64"),
                                                  t.as_expr(second, "int64"))))
        code = t.Const(ERROR_LOOP_SCAN, "int32")
        for scan, view in zip(self.scans, self.scan_views):
            length = t.as_expr(scan.type.shape[0], "int64")
            body.append(t.Evaluate(t.Intrin("check", (t.Compare("lt", i, length), code))))
            view.buffer = t.Buffer(view.name, view.type.shape, view.type.dtype)
            step = t.as_expr(dim_product((*view.type.shape, itemsize(view.type.dtype))),
                             "int64")
            if scan in ctx.offsets:
                source, base = arena, t.as_expr(ctx.offsets[scan], "int64")
                offset: t.PrimExpr = t.BinaryOp("add", base, t.BinaryOp("mul", i, step))
            else:  # a function output: the view is into the output buffer
                source, offset = _buf(scan), t.BinaryOp("mul", i, step)
            body.append(t.DeclBuffer(view.buffer, source, offset))
        targets = [self.keep, *self.nxt, *self.scan_views]
        _resolve_redirects(self.body, targets)
        body.extend(s for item in self.body.items for s in emit_item(item, ctx))
        body.extend(_copies(_Block([], self.body.results[1:]), targets[1:]))
        if self.cond is not None:
            body.append(t.Store(keep, t.Load(_buf(self.body.results[0]), ()), ()))
        body.append(t.Store(counter, t.BinaryOp("add", i, one), ()))
        out.append(t.While(test, t.seq(*body)))

        n = t.Var(f"{self.name}_iterations", "int64")
        out.append(t.LetStmt(n, t.Load(counter, ())))
        for scan in self.scans:
            length = t.as_expr(scan.type.shape[0], "int64")
            out.append(t.Evaluate(t.Intrin("check", (t.Compare("eq", n, length), code))))
        even_n = t.Compare("eq", t.BinaryOp("floormod", n, two), zero)
        for (a, b), final in zip(self.halves, self.finals):
            last = t.Buffer(f"{final.name}_last", final.type.shape, final.type.dtype)
            out.append(t.DeclBuffer(last, arena, t.Select(
                even_n, t.as_expr(ctx.offsets[a], "int64"), t.as_expr(ctx.offsets[b], "int64"))))
            out.append(copy_stmt(_buf(final), last))
        return out


@dataclass(frozen=True)
class _Limit:
    """At most `count` iterations (the module attribute `kiln.max_loop_iterations`): the
    check that fails the next one, with the loop's own error code `code`."""

    count: int
    code: int

    def check(self, i: t.Var, label: str, ctx: EmitContext) -> t.Stmt:
        """`check(i < count)`, its message (naming the loop) recorded in `ctx`."""
        ctx.messages[self.code] = (f"Loop {label} ran more than {self.count} iterations "
                                   f"(the limit max_loop_iterations={self.count})")
        ok = t.Compare("lt", i, t.Const(self.count, "int64"))
        return t.Evaluate(t.Intrin(t.CHECK_INTRINSIC, (ok, t.Const(self.code, "int32"))))


def _limit(an: GraphAnalyzer, body: str) -> _Limit | None:
    """The iteration limit of the loop with body function `body`: the module's
    `kiln.max_loop_iterations`, with an error code no other loop of the module has."""
    count = an.mod.attrs.get(ATTR_MAX_LOOP_ITERATIONS)
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise CompileError(f"module attribute {ATTR_MAX_LOOP_ITERATIONS}={count!r}: expected "
                           "a positive integer (the most iterations a Loop may run)")
    bodies = sorted(name for name, fn in an.mod.functions.items() if isinstance(fn, g.Function))
    return _Limit(count, FIRST_FUNCTION_ERROR + bodies.index(body))


def _label(an: GraphAnalyzer, body: str) -> str:
    """How errors name a loop: its ONNX node's name when the importer recorded it."""
    node = an.mod.functions[body].attrs.get(ATTR_SOURCE_NODE)
    return f"{node!r} (body {body!r})" if node else f"with body {body!r}"


def _buf(s: GraphSlot | None) -> t.Buffer:
    assert s is not None and s.buffer is not None
    return s.buffer


def _analyze_loop(an: GraphAnalyzer, e: g.Loop, hint: str) -> GraphValue:
    where = f"graph function '{an.fname}': loop '{e.body}'"
    trip = None if e.trip_count is None else _single(an, e.trip_count, hint, "a trip count")
    cond = None if e.cond is None else _single(an, e.cond, hint, "a loop condition")
    inits = [_single(an, s, f"{hint}_init{k}", "a loop-carried value")
             for k, s in enumerate(e.states)]
    captures = [an.resolve(c, f"{hint}_capture{k}") for k, c in enumerate(e.captures)]
    fields = list(e.ret_type.fields)
    scan_types = fields[len(inits):]
    for ty in scan_types:
        if not isinstance(ty, TensorType) or not ty.shape:
            raise CompileError(f"{where}: scan output type {ty} needs a leading axis")

    def slot(ty: TensorType, name: str) -> GraphSlot:
        return GraphSlot("call", ty, f"{hint}_{name}")

    halves = [(slot(s.type, f"state{k}_a"), slot(s.type, f"state{k}_b"))
              for k, s in enumerate(inits)]
    counter, keep = slot(_INT0, "counter"), slot(_BOOL0, "cond")
    scans = [slot(ty, f"scan{k}") for k, ty in enumerate(scan_types)
             if isinstance(ty, TensorType)]
    region = [*(h for pair in halves for h in pair), counter, keep, *scans]
    uses = [*(x for x in (trip, cond) if x is not None), *inits,
            *(s for c in captures for s in flatten_value(c))]
    start = _marker(an, uses, region)
    cur = [GraphSlot("view", s.type, f"{hint}_state{k}") for k, s in enumerate(inits)]
    nxt = [GraphSlot("view", s.type, f"{hint}_next{k}") for k, s in enumerate(inits)]
    scan_views = [GraphSlot("view", TensorType(s.type.shape[1:], s.type.dtype),
                        f"{hint}_slice{k}") for k, s in enumerate(scans)]
    body = _analyze_body(an, e.body, [counter, keep, *cur, *captures], "loop body")
    if len(body.results) != 1 + len(inits) + len(scans):
        raise CompileError(f"{where}: the body returns {len(body.results)} tensors; expected "
                           f"the condition, {len(inits)} state(s) and {len(scans)} scan "
                           "value(s)")
    for r, target in zip(body.results[1:], [*nxt, *scan_views]):
        _redirect(r, target, start)
    # Values from before the loop that the body reads stay intact for every iteration.
    end = len(an.steps)
    outer = {s for step in an.steps[start + 1:end] for s in step.inputs
             if s.kind == "call" and 0 <= s.def_step < start}
    finals = [slot(s.type, f"final{k}") for k, s in enumerate(inits)]
    _marker(an, [*region, *outer, *body.results], finals)
    an.items.append(_LoopRegion(trip, cond, inits, halves, cur, nxt, counter, keep, scans,
                                scan_views, finals, body, hint, _label(an, e.body),
                                _limit(an, e.body)))
    return tuple([*finals, *scans])
