"""Outline `parallel` loops into functions the thread pool can run (shared by `c` and `llvm`).

A loop `for i in [start, start + extent) parallel: body` of kernel `f` becomes

- a new tensor-level function, the *loop body* `f_parallel0(begin: int64,
  end: int64, <captured buffers>, <captured scalars>)` whose body is
  `for k in [begin, end): let i = start + k; body` (serial), and
- in `f`, a `CallFunc("f_parallel0", (0, extent, <captured...>))` that the
  backends print as a *launch*: the captured values go into a context struct
  and `{prefix}_parallel_for(extent, <trampoline>, &context)` runs the body
  over chunks of `[0, extent)` on the library's thread pool (docs/abi.md,
  "Parallel loops"). The trampoline `int32_t run(int64_t begin, int64_t end,
  void* context)` unpacks the struct and calls the loop body.

Captured: every variable and buffer the loop uses that is bound outside it
(parameters, outer loop and let variables, allocations, constants, views),
plus the scalar parameters symbolic shapes of captured buffers refer to.
Buffers allocated inside the loop stay inside: each iteration range gets its
own. Representing the launch as a CallFunc lets the aliasing analysis
(`kiln.ir.aliasing`) decide `restrict` / `noalias` for the loop body's
parameters exactly as for any other call.

A `parallel` loop nested in another one runs serially (the outer loop already
uses every thread); so do loops whose variable is not an integer (the
backends report those). Loop bodies never become public
functions: library metadata and host.c list `kernel_funcs` only
(kiln.ir.outlined).

Registered as the pass `outline-parallel-loops` (`OutlineParallelLoops`):
`kiln.compile` runs it after the pipelines (and profiling), before a code
generator that consumes outlined IR (`llvm`, `llvmjit`, `c`, `cuda`), unless the
tensor pipeline already did. Its result is ordinary IR: the loop bodies are
PrimFuncs marked `kiln.parallel_loop_of` / `kiln.parallel_loop_var` (and private),
the launches CallFuncs of them, so it prints, parses back and runs in the
interpreter. The backends recover the launch sites from those attributes
(`outlined_launches`) and refuse a module that still holds an outlinable
parallel loop. What the result looks like (the launch's arguments, the queries the
backends ask) is kiln.ir.outlined, which the backends import instead of this pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kiln.errors import CompileError
from kiln.ir.aliasing import analyze
from kiln.ir.attrs import ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR, ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.outlined import (
    OUTLINE_PASS,
    Launch,
    Outlined,
    is_outlinable,
    outlined_launches,
    parallel_loops,
)
from kiln.ir.tensor import (
    AllocConst,
    BinaryOp,
    Buffer,
    CallFunc,
    Cast,
    Const,
    DeclBuffer,
    For,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.ir.visitor import StmtMutator, definitions, iter_stmts, operands
from kiln.transform.pass_base import Pass

INDEX = "int64"


def outline_parallel_loops(mod: IRModule) -> Outlined:
    """Outline every outermost `parallel` loop of every PrimFunc (module docstring)."""
    if not any(True for _ in parallel_loops(mod)):
        return outlined_launches(mod)  # nothing to outline (or outlined already)
    funcs = mod.prim_funcs()
    written = analyze(dict(funcs)).written
    taken = set(mod.functions)
    out: dict[str, BaseFunc] = {}
    launches: dict[CallFunc, Launch] = {}
    for name, fn in mod.functions.items():
        if not isinstance(fn, PrimFunc):
            out[name] = fn
            continue
        outliner = _Outliner(name, funcs, written, taken)
        body = outliner.visit_stmt(fn.body)
        out.update(outliner.bodies)  # loop bodies before their kernel
        out[name] = fn if body is fn.body else fn.with_body(body)
        launches.update(outliner.launches)
    return Outlined(IRModule(out, mod.attrs), launches)


@dataclass(frozen=True)
class OutlineParallelLoops(Pass):
    """Outline every outermost `parallel` loop into a loop-body function and a launch
    (module docstring); a module outlined already is returned as is."""

    name = OUTLINE_PASS

    def run(self, mod: IRModule) -> IRModule:
        return outline_parallel_loops(mod).mod


class _Outliner(StmtMutator):
    """Replaces the outermost parallel loops of one kernel by launches."""

    def __init__(self, name: str, funcs: dict[str, PrimFunc],
                 written: dict[str, frozenset[int]], taken: set[str]) -> None:
        self.consts: set[Buffer] = set()
        self.name = name
        self.funcs = funcs
        self.written = written
        self.taken = taken
        self.bodies: dict[str, PrimFunc] = {}
        self.launches: dict[CallFunc, Launch] = {}

    def fresh_name(self) -> str:
        k = 0
        while f"{self.name}_parallel{k}" in self.taken:
            k += 1
        name = f"{self.name}_parallel{k}"
        self.taken.add(name)
        return name

    # Read-only buffers met so far (AllocConst and views of them): a buffer object is
    # bound once, so the set only grows.
    def visit_for(self, s: For) -> Stmt:
        if s.kind == "parallel" and is_outlinable(s):
            return self.outline(s, frozenset(self.consts))
        return super().visit_for(s)

    def visit_alloc_const(self, s: AllocConst) -> Stmt:
        self.consts.add(s.buffer)
        return super().visit_alloc_const(s)

    def visit_decl_buffer(self, s: DeclBuffer) -> Stmt:
        if s.source in self.consts:
            self.consts.add(s.buffer)
        return super().visit_decl_buffer(s)

    def outline(self, loop: For, consts: frozenset[Buffer]) -> Stmt:
        dtype = loop.var.dtype
        inner = _DemoteParallel().visit_stmt(loop.body)
        buffers, scalars = _captures(loop, inner)
        self.check_constants(loop, inner, consts)
        begin, end = Var("begin", INDEX), Var("end", INDEX)
        extent = BinaryOp("sub", end, begin)
        if dtype == INDEX and _is_zero(loop.start):
            # The common case: the chunk bounds are the loop's own bounds.
            body: Stmt = For(loop.var, begin, extent, "serial", inner)
        else:
            k = Var(f"{loop.var.name}_k", INDEX)
            offset: PrimExpr = k if dtype == INDEX else Cast(dtype, k)
            body = For(k, begin, extent, "serial",
                       seq(LetStmt(loop.var, BinaryOp("add", loop.start, offset)), inner))
        name = self.fresh_name()
        params: tuple[Buffer | Var, ...] = (begin, end, *buffers, *scalars)
        self.bodies[name] = PrimFunc(params, body, {
            ATTR_PRIVATE: True, ATTR_PARALLEL_OF: self.name,
            ATTR_PARALLEL_VAR: loop.var.name})
        count = loop.extent if loop.extent.dtype == INDEX else Cast(INDEX, loop.extent)
        launch = CallFunc(name, (Const(0, INDEX), count, *buffers, *scalars))
        self.launches[launch] = Launch(name, self.name, loop.var.name)
        return launch

    def check_constants(self, loop: For, body: Stmt, consts: frozenset[Buffer]) -> None:
        """Storing into a constant is an error the backends report; keep reporting it
        when the store moves into a loop body where the constant is a parameter."""
        views = [s for s in iter_stmts(body) if isinstance(s, DeclBuffer)]
        readonly = set(consts)
        changed = True
        while changed:  # views of constants declared inside the loop are read-only too
            changed = False
            for view in views:
                if view.source in readonly and view.buffer not in readonly:
                    readonly.add(view.buffer)
                    changed = True
        for target in _written_buffers(body, self.funcs, self.written):
            if target in readonly:
                raise CompileError(
                    f"codegen of '{self.name}': parallel loop '{loop.var.name}' stores into "
                    f"constant buffer '{target.name}' (AllocConst data is read-only)")


def _is_zero(e: PrimExpr) -> bool:
    return isinstance(e, Const) and e.value == 0


class _DemoteParallel(StmtMutator):
    """Nested parallel loops made serial (they would run serially anyway)."""

    def visit_for(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if s.kind != "parallel" and body is s.body:
            return s
        return For(s.var, s.start, s.extent, "serial" if s.kind == "parallel" else s.kind, body)


# ------------------------------------------------------------------ walks


def _stmt_parts(s: Stmt) -> tuple[list[PrimExpr], list[Buffer]]:
    """Expressions and buffers a statement uses directly (not its nested statements)."""
    parts = operands(s)
    return ([x for x in parts if isinstance(x, PrimExpr)],
            [x for x in parts if isinstance(x, Buffer)])


def _expr_uses(e: PrimExpr) -> Iterator[Var | Buffer]:
    """Variables and buffers in `e`, in evaluation order."""
    stack: list[PrimExpr | Buffer] = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, (Var, Buffer)):
            yield x
        else:
            stack.extend(reversed(operands(x)))


def _captures(loop: For, body: Stmt) -> tuple[list[Buffer], list[Var]]:
    """Buffers and scalars the loop uses but does not bind, in first-use order."""
    bound: set[object] = {loop.var}
    for s in iter_stmts(body):
        bound.update(definitions(s))
    buffers: dict[Buffer, None] = {}
    scalars: dict[Var, None] = {}

    def use(node: Var | Buffer) -> None:
        if node in bound:
            return
        if isinstance(node, Buffer):
            if node not in buffers:
                buffers[node] = None
                for d in node.shape:  # symbolic shapes: their variables come along
                    if isinstance(d, PrimExpr):
                        for v in _expr_uses(d):
                            use(v)
        elif node not in scalars:
            scalars[node] = None

    for node in _expr_uses(loop.start):
        use(node)
    for s in iter_stmts(body):
        exprs, bufs = _stmt_parts(s)
        for b in bufs:
            use(b)
        for e in exprs:
            for node in _expr_uses(e):
                use(node)
        for bound_here in definitions(s):
            if not isinstance(bound_here, Buffer):
                continue
            for d in bound_here.shape:  # a local buffer's symbolic size
                if isinstance(d, PrimExpr):
                    for node in _expr_uses(d):
                        use(node)
    return list(buffers), list(scalars)


def _written_buffers(body: Stmt, funcs: dict[str, PrimFunc],
                     written: dict[str, frozenset[int]]) -> Iterator[Buffer]:
    """Buffers stored to inside `body`, directly or by a called kernel."""
    for s in iter_stmts(body):
        if isinstance(s, Store):
            yield s.buffer
        elif isinstance(s, CallFunc) and s.func in funcs:
            for index in written.get(s.func, frozenset()):
                if index < len(s.args) and isinstance(s.args[index], Buffer):
                    yield s.args[index]  # type: ignore[misc]


__all__ = [
    "OutlineParallelLoops",
    "outline_parallel_loops",
]
