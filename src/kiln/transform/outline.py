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
(`kiln.codegen.aliasing`) decide `restrict` / `noalias` for the loop body's
parameters exactly as for any other call.

A `parallel` loop nested in another one runs serially (the outer loop already
uses every thread); so do loops whose variable is not an integer (the
backends report those). The outlined module is for the kernels only: library
metadata and host.c are made from the original module, so loop bodies never
become public functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kiln.codegen.aliasing import analyze
from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.attrs import ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR, ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    CallExtern,
    CallFunc,
    Cast,
    Compare,
    Const,
    DeclBuffer,
    Evaluate,
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Store,
    UnaryOp,
    Var,
    seq,
)

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
    def bodies(self) -> set[str]:
        """Names of the outlined loop-body functions."""
        return {launch.body for launch in self.launches.values()}


def has_parallel_loops(mod: IRModule) -> bool:
    """True if some tensor-level function holds a loop of kind `parallel` (host.c then
    defines the thread pool, which the kernels call)."""
    return any(isinstance(s, For) and s.kind == "parallel"
               for fn in mod.prim_funcs().values() for s in _stmts(fn.body))


def outline_parallel_loops(mod: IRModule) -> Outlined:
    """Outline every outermost `parallel` loop of every PrimFunc (module docstring)."""
    if not has_parallel_loops(mod):
        return Outlined(mod)
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
        body = outliner.stmt(fn.body, frozenset())
        out.update(outliner.bodies)  # loop bodies before their kernel
        out[name] = fn if body is fn.body else fn.with_body(body)
        launches.update(outliner.launches)
    return Outlined(IRModule(out, mod.attrs), launches)


class _Outliner:
    def __init__(self, name: str, funcs: dict[str, PrimFunc],
                 written: dict[str, frozenset[int]], taken: set[str]) -> None:
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

    def stmt(self, s: Stmt, consts: frozenset[Buffer]) -> Stmt:
        """`s` with its outermost parallel loops replaced by launches.

        `consts` are the read-only buffers in scope (AllocConst and views of them).
        """
        if isinstance(s, For):
            if s.kind == "parallel" and _outlinable(s):
                return self.outline(s, consts)
            body = self.stmt(s.body, consts)
            return s if body is s.body else For(s.var, s.start, s.extent, s.kind, body)
        if isinstance(s, SeqStmt):
            items = []
            for x in s.body:
                items.append(self.stmt(x, consts))
                # A declaration's scope is the rest of this list.
                if isinstance(x, AllocConst) or (
                        isinstance(x, DeclBuffer) and x.source in consts):
                    consts = consts | {x.buffer}
            return s if all(a is b for a, b in zip(items, s.body)) else seq(*items)
        if isinstance(s, LetStmt):
            body = self.stmt(s.body, consts)
            return s if body is s.body else LetStmt(s.var, s.value, body)
        if isinstance(s, IfThenElse):
            then = self.stmt(s.then_body, consts)
            other = self.stmt(s.else_body, consts) if s.else_body is not None else None
            if then is s.then_body and other is s.else_body:
                return s
            return IfThenElse(s.cond, then, other)
        return s

    def outline(self, loop: For, consts: frozenset[Buffer]) -> Stmt:
        dtype = loop.var.dtype
        inner = _demote_parallel(loop.body)
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
                       LetStmt(loop.var, BinaryOp("add", loop.start, offset), inner))
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
        views = [s for s in _stmts(body) if isinstance(s, DeclBuffer)]
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


def _demote_parallel(s: Stmt) -> Stmt:
    """`s` with nested parallel loops made serial (they would run serially anyway)."""
    if not any(isinstance(x, For) and x.kind == "parallel" for x in _stmts(s)):
        return s
    if isinstance(s, For):
        kind = "serial" if s.kind == "parallel" else s.kind
        return For(s.var, s.start, s.extent, kind, _demote_parallel(s.body))
    if isinstance(s, SeqStmt):
        return seq(*(_demote_parallel(x) for x in s.body))
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, _demote_parallel(s.body))
    if isinstance(s, IfThenElse):
        other = _demote_parallel(s.else_body) if s.else_body is not None else None
        return IfThenElse(s.cond, _demote_parallel(s.then_body), other)
    return s


# ------------------------------------------------------------------ walks


def _stmts(s: Stmt) -> Iterator[Stmt]:
    stack = [s]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, SeqStmt):
            stack.extend(reversed(x.body))
        elif isinstance(x, (For, LetStmt)):
            stack.append(x.body)
        elif isinstance(x, IfThenElse):
            if x.else_body is not None:
                stack.append(x.else_body)
            stack.append(x.then_body)


def _stmt_parts(s: Stmt) -> tuple[list[PrimExpr], list[Buffer]]:
    """Expressions and buffers a statement uses directly (not its nested statements)."""
    if isinstance(s, Store):
        return [s.value, *s.indices], [s.buffer]
    if isinstance(s, For):
        return [s.start, s.extent], []
    if isinstance(s, LetStmt):
        return [s.value], []
    if isinstance(s, IfThenElse):
        return [s.cond], []
    if isinstance(s, Evaluate):
        return [s.value], []
    if isinstance(s, CallFunc):
        return ([a for a in s.args if isinstance(a, PrimExpr)],
                [a for a in s.args if isinstance(a, Buffer)])
    if isinstance(s, DeclBuffer):
        return [], [s.source]
    return [], []


def _expr_uses(e: PrimExpr) -> Iterator[Var | Buffer]:
    """Variables and buffers in `e`, in evaluation order."""
    stack: list[PrimExpr] = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Var):
            yield x
        elif isinstance(x, Load):
            yield x.buffer
            stack.extend(reversed(x.indices))
        elif isinstance(x, (BinaryOp, Compare)):
            stack.extend((x.b, x.a))
        elif isinstance(x, UnaryOp):
            stack.append(x.a)
        elif isinstance(x, Select):
            stack.extend((x.false_value, x.true_value, x.cond))
        elif isinstance(x, Cast):
            stack.append(x.value)
        elif isinstance(x, Intrin):
            stack.extend(reversed(x.args))
        elif isinstance(x, CallExtern):
            for a in reversed(x.args):
                if isinstance(a, Buffer):
                    yield a
                else:
                    stack.append(a)


def _captures(loop: For, body: Stmt) -> tuple[list[Buffer], list[Var]]:
    """Buffers and scalars the loop uses but does not bind, in first-use order."""
    bound: set[object] = {loop.var}
    for s in _stmts(body):
        if isinstance(s, (For, LetStmt)):
            bound.add(s.var)
        elif isinstance(s, (Allocate, AllocConst, DeclBuffer)):
            bound.add(s.buffer)
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
    for s in _stmts(body):
        exprs, bufs = _stmt_parts(s)
        for b in bufs:
            use(b)
        for e in exprs:
            for node in _expr_uses(e):
                use(node)
        if isinstance(s, (Allocate, AllocConst, DeclBuffer)):
            for d in s.buffer.shape:  # a local buffer's symbolic size
                if isinstance(d, PrimExpr):
                    for node in _expr_uses(d):
                        use(node)
    return list(buffers), list(scalars)


def _written_buffers(body: Stmt, funcs: dict[str, PrimFunc],
                     written: dict[str, frozenset[int]]) -> Iterator[Buffer]:
    """Buffers stored to inside `body`, directly or by a called kernel."""
    for s in _stmts(body):
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
    "Outlined",
    "has_parallel_loops",
    "outline_parallel_loops",
]
