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
functions: library metadata and host.c list `kernel_funcs` only.

Registered as the pass `outline-parallel-loops` (`OutlineParallelLoops`):
`kiln.compile` runs it after the pipelines (and profiling), before a code
generator that consumes outlined IR (`llvm`, `llvmjit`, `c`, `cuda`), unless the
tensor pipeline already did. Its result is ordinary IR: the loop bodies are
PrimFuncs marked `kiln.parallel_loop_of` / `kiln.parallel_loop_var` (and private),
the launches CallFuncs of them, so it prints, parses back and runs in the
interpreter. The backends recover the launch sites from those attributes
(`outlined_launches`) and refuse a module that still holds an outlinable
parallel loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.aliasing import analyze
from kiln.ir.attrs import ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR, ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
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


# A launch CallFunc's arguments: (0, iteration count, captured values...), matching
# the loop body's parameters (begin, end, captured...).
COUNT_ARG = 1
FIRST_CAPTURE = 2


@dataclass(frozen=True)
class Launch:
    """One outlined parallel loop: its body function and the loop it came from."""

    body: str       # name of the outlined loop-body function
    parent: str     # the kernel holding the loop
    var: str        # the loop variable's name hint


@dataclass
class Outlined:
    """The module with its parallel loops outlined, and the launch sites."""

    mod: IRModule
    # Launch CallFunc node (by identity) -> what it launches.
    launches: dict[CallFunc, Launch] = field(default_factory=dict)

    @property
    def bodies(self) -> tuple[str, ...]:
        """Names of the outlined loop-body functions, in outlining order: code generators
        emit them in this order, so it must not depend on hashing (reproducible builds)."""
        return tuple(dict.fromkeys(launch.body for launch in self.launches.values()))


def is_loop_body(fn: BaseFunc) -> bool:
    """Whether `fn` is a parallel loop body outlined by this pass (private to the
    library: never an entry, never in the metadata)."""
    return isinstance(fn, PrimFunc) and ATTR_PARALLEL_OF in fn.attrs


def kernel_funcs(mod: IRModule) -> dict[str, PrimFunc]:
    """The module's PrimFuncs but outlined loop bodies: the library's functions."""
    return {name: fn for name, fn in mod.prim_funcs().items() if not is_loop_body(fn)}


def _parallel_loops(mod: IRModule) -> Iterator[tuple[str, For]]:
    for name, fn in mod.prim_funcs().items():
        for s in iter_stmts(fn.body):
            if isinstance(s, For) and s.kind == "parallel":
                yield name, s


def has_parallel_loops(mod: IRModule) -> bool:
    """True if some kernel runs a loop on the thread pool: a loop of kind `parallel`, or
    one already outlined (host.c then defines the thread pool, which the kernels call)."""
    return (any(True for _ in _parallel_loops(mod))
            or any(is_loop_body(fn) for fn in mod.functions.values()))


def outline_parallel_loops(mod: IRModule) -> Outlined:
    """Outline every outermost `parallel` loop of every PrimFunc (module docstring)."""
    if not any(True for _ in _parallel_loops(mod)):
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


def outlined_launches(mod: IRModule, who: str = "codegen") -> Outlined:
    """The launch sites of a module `OutlineParallelLoops` produced, recovered from its
    loop bodies' attributes; CompileError if a parallel loop is left to outline (the
    backends consume outlined IR only). `who` names the consumer in the error."""
    for name, loop in _parallel_loops(mod):
        if _outlinable(loop) and not is_loop_body(mod.functions[name]):
            raise CompileError(
                f"{who} of '{name}': parallel loop '{loop.var.name}' was not outlined; run "
                f"the pass '{OutlineParallelLoops.name}' before codegen (kiln.compile does "
                "for the targets that need it)")
    bodies = {name: fn for name, fn in mod.functions.items() if is_loop_body(fn)}
    launches: dict[CallFunc, Launch] = {}
    for fn in mod.prim_funcs().values():
        for s in iter_stmts(fn.body):
            if isinstance(s, CallFunc) and s.func in bodies:
                attrs = bodies[s.func].attrs
                launches[s] = Launch(s.func, attrs[ATTR_PARALLEL_OF], attrs[ATTR_PARALLEL_VAR])
    return Outlined(mod, launches)


@dataclass(frozen=True)
class OutlineParallelLoops(Pass):
    """Outline every outermost `parallel` loop into a loop-body function and a launch
    (module docstring); a module outlined already is returned as is."""

    name = "outline-parallel-loops"

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
        if s.kind == "parallel" and _outlinable(s):
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


def _outlinable(loop: For) -> bool:
    """Integer loops with matching bound dtypes; anything else is left to the backend's
    serial path, which reports the problem."""
    return (dt.is_int(loop.var.dtype) and loop.start.dtype == loop.var.dtype
            and loop.extent.dtype == loop.var.dtype)


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
    "COUNT_ARG",
    "FIRST_CAPTURE",
    "Launch",
    "OutlineParallelLoops",
    "Outlined",
    "has_parallel_loops",
    "is_loop_body",
    "kernel_funcs",
    "outline_parallel_loops",
    "outlined_launches",
]
