"""InterchangeReductions: run the innermost output loop inside the reduction loops.

Operators written with `te.reduce` lower to one accumulator per output element:

    for j in range(J):                       # the innermost output loop
        acc: float32[1] (stack)
        acc[0] = init
        for k in ...:                        # the reduction
            acc[0] = acc[0] + X[k] * W[k, j]
        out[j] = epilogue(acc[0])

The reduction is innermost, so nothing runs over neighbouring outputs: a dense
layer reads the weights column by column and no loop vectorizes. This pass
turns the accumulator into a small array and moves the output loop inside:

    for jo in range(ceil(J / tile)):         # only when J > tile
        acc: float32[tile] (stack)
        for j in ...: acc[j] = init
        for k in ...:
            for j in ...: acc[j] = acc[j] + X[k] * W[k, jo * tile + j]
        for j in ...: out[jo * tile + j] = epilogue(acc[j])

Each output element still sees exactly the same operations in the same order
(only the interleaving between *different* outputs changes), so results are
identical bit for bit. The pass applies only when that interleaving cannot be
observed: with the accumulators expanded, the output loop's iterations must be
independent by the analysis of the `parallelize` pass
(`loop_is_parallelizable`). It also requires the plain shape above: a loop
from 0 with a constant extent whose body is stack accumulators of one element
wrapping a sequence of statements, at least one of them a loop; no other
allocation, view or kernel call inside; reduction loop bounds that do not
depend on the output loop.

The output loop goes to the innermost position of each reduction loop nest
(through perfectly nested loops). Loops longer than `tile` are tiled, so the
accumulators stay small and the tiles can run in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir.aliasing import analyze
from kiln.ir.analysis.loop_dependence import Storage, loop_is_parallelizable
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.module import IRModule
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    CallFunc,
    Const,
    DeclBuffer,
    For,
    Load,
    PrimExpr,
    PrimFunc,
    SeqStmt,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.ir.visitor import StmtExprMutator, iter_exprs, iter_stmts
from kiln.transform.parallelize import LoopRewriter
from kiln.transform.pass_base import FunctionPass

INDEX = "int64"


@dataclass(frozen=True)
class InterchangeReductions(FunctionPass):
    """Move the innermost output loop of reductions inside them (module docstring)."""

    name = "interchange-reductions"
    level = "tensor"
    # Most accumulators per reduction (the output loop is tiled to this many).
    tile: int = 64

    def run(self, mod: IRModule) -> IRModule:
        funcs = mod.prim_funcs()
        # the module-wide alias analysis only where some kernel has a loop to move
        candidates = {name for name, fn in funcs.items()
                      if not fn.attrs.get(ATTR_GRAPH) and _has_accumulator_loop(fn.body)}
        if not candidates:
            return mod
        info = analyze(dict(funcs))
        aliased = {name for name in funcs if info.noalias[name] != info.written[name]}
        changed: dict[str, PrimFunc] = {}
        for name, fn in funcs.items():
            if name not in candidates:
                continue
            body = _Interchanger(self.tile, Storage(fn, name in aliased)).visit_stmt(fn.body)
            if body is not fn.body:
                changed[name] = fn.with_body(body)
        if not changed:
            return mod
        return IRModule({n: changed.get(n, f) for n, f in mod.functions.items()}, mod.attrs)


def _has_accumulator_loop(body: Stmt) -> bool:
    """Whether some loop under `body` starts with a one-element stack accumulator, as
    every loop `_Interchanger.interchange` rewrites does (statements only are walked)."""
    for s in iter_stmts(body):
        if isinstance(s, For):
            first = s.body.body[0] if isinstance(s.body, SeqStmt) and s.body.body else s.body
            if (isinstance(first, Allocate) and first.buffer.scope == "local"
                    and first.buffer.shape == (1,)):
                return True
    return False


class _Interchanger(LoopRewriter):
    def __init__(self, tile: int, storage: Storage) -> None:
        self.tile = max(1, tile)
        self.storage = storage

    def visit_for(self, loop: For) -> Stmt:
        done = self.interchange(loop)
        if done is not None:
            return done
        return super().visit_for(loop)

    def interchange(self, loop: For) -> Stmt | None:
        """The rewritten loop, or None when it does not have the expected shape."""
        if (loop.kind != "serial" or loop.var.dtype != INDEX or not _is_const(loop.start, 0)
                or not isinstance(loop.extent, Const) or int(loop.extent.value) < 2):
            return None
        # The body: scalar accumulators declared first, then the statements.
        items = list(loop.body.body) if isinstance(loop.body, SeqStmt) else [loop.body]
        accs: list[Buffer] = []
        while items and isinstance(items[0], Allocate):
            decl = items.pop(0)
            assert isinstance(decl, Allocate)
            buf = decl.buffer
            if buf.scope != "local" or buf.shape != (1,):
                return None
            accs.append(buf)
        statements = items
        if not accs or not any(isinstance(x, For) for x in statements):
            return None
        for x in (y for st in statements for y in iter_stmts(st)):
            if isinstance(x, (Allocate, AllocConst, DeclBuffer, CallFunc)):
                return None
            if isinstance(x, For) and x.kind == "parallel":
                return None
        if not all(_outer_bounds_free_of(x, loop.var) for x in statements):
            return None
        extent = int(loop.extent.value)
        if not self.independent(loop, extent, accs, statements):
            return None
        lanes = min(extent, self.tile)
        vectors = {a: Buffer(a.name, (lanes,), a.dtype, "local") for a in accs}
        if extent <= lanes:
            return self.expanded(loop, vectors, statements, Const(lanes, INDEX), None)
        tile = Var(f"{loop.var.name}_o", INDEX)
        count: PrimExpr = Const(lanes, INDEX)
        if extent % lanes:
            rest = BinaryOp("sub", Const(extent, INDEX), BinaryOp("mul", tile, count))
            count = BinaryOp("min", Const(lanes, INDEX), rest)
        body = self.expanded(loop, vectors, statements, count, tile)
        return For(tile, Const(0, INDEX), Const(-(-extent // lanes), INDEX), "serial", body)

    def independent(self, loop: For, extent: int, accs: list[Buffer],
                    statements: list[Stmt]) -> bool:
        """The output loop's iterations are independent once each has its own
        accumulator (what the interchange reorders)."""
        wide = {a: Buffer(a.name, (extent,), a.dtype, "local") for a in accs}
        body = _Substitute(loop.var, loop.var, wide, loop.var).visit_stmt(seq(*statements))
        return loop_is_parallelizable(For(loop.var, loop.start, loop.extent, "serial", body),
                                      self.storage)

    def expanded(self, loop: For, vectors: dict[Buffer, Buffer], statements: list[Stmt],
                 count: PrimExpr, tile: Var | None) -> Stmt:
        """The accumulators as arrays and each statement under its own output loop."""
        out: list[Stmt] = []
        for k, statement in enumerate(statements):
            lane = Var(f"{loop.var.name}_{k}" if len(statements) > 1 else loop.var.name, INDEX)
            index: PrimExpr = lane if tile is None else BinaryOp(
                "add", BinaryOp("mul", tile, Const(self.tile, INDEX)), lane)
            body = _Substitute(loop.var, index, vectors, lane).visit_stmt(statement)
            out.append(_innermost(body, _LaneLoop(lane, count)))
        return seq(*(Allocate(buf) for buf in vectors.values()), *out)


def _is_const(e: PrimExpr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def _outer_bounds_free_of(s: Stmt, var: Var) -> bool:
    """The bounds of the perfectly nested loops at the top of `s` (the ones the output
    loop moves inside) do not read `var`."""
    while isinstance(s, For):
        if any(isinstance(x, Var) and x is var for x in iter_exprs(s.start, s.extent)):
            return False
        s = s.body
    return True


@dataclass(frozen=True)
class _LaneLoop:
    """Wraps a statement in the loop over accumulator lanes."""

    lane: Var
    count: PrimExpr

    def __call__(self, body: Stmt) -> Stmt:
        return For(self.lane, Const(0, INDEX), self.count, "serial", body)


def _innermost(s: Stmt, wrap: _LaneLoop) -> Stmt:
    """`s` with `wrap(body)` around the body of its innermost perfectly nested loop
    (around `s` itself when it is not a loop)."""
    if isinstance(s, For):
        return For(s.var, s.start, s.extent, s.kind, _innermost(s.body, wrap))
    return wrap(s)


class _Substitute(StmtExprMutator):
    """`var` -> `index`; one-element accumulators `acc[0]` -> `vectors[acc][lane]`."""

    def __init__(self, var: Var, index: PrimExpr, vectors: dict[Buffer, Buffer],
                 lane: PrimExpr) -> None:
        self.var = var
        self.index = index
        self.vectors = vectors
        self.lane = lane

    def visit_var(self, e: Var) -> PrimExpr:
        return self.index if e is self.var else e

    def visit_load(self, e: Load) -> PrimExpr:
        vector = self.vectors.get(e.buffer)
        if vector is not None:
            return Load(vector, (self.lane,))
        return super().visit_load(e)

    def visit_store(self, s: Store) -> Stmt:
        vector = self.vectors.get(s.buffer)
        value = self.visit_expr(s.value)
        if vector is not None:
            return Store(vector, value, (self.lane,))
        indices = tuple(self.visit_expr(i) for i in s.indices)
        return Store(s.buffer, value, indices)


__all__ = ["InterchangeReductions"]
