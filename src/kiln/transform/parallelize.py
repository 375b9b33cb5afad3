"""Parallelize: mark loops whose iterations are independent `parallel`.

The backends run a `parallel` loop on the library's thread pool
(docs/abi.md, "Parallel loops"), so this pass must only mark loops whose
iterations can run in any order, at the same time. It is conservative: a loop
`for v in ...` is parallel only when

- it is a `serial` integer loop, and nothing inside it is already `parallel`;
- its body calls no other kernel (`CallFunc`) and no external function
  except pure math (`CallExtern` of a libm function on scalars);
- every buffer it writes that is not allocated inside it (those are private
  to an iteration) is accessed, by every load and store in the loop, through
  the same buffer with the same index expression `e(v)` in one dimension,
  where `e` is affine in `v` with a non-zero constant coefficient and a part
  that does not change during the loop. Indices are in range per dimension
  (docs/ir.md), so distinct iterations touch disjoint slices of that buffer
  and read nothing another iteration writes;
- it touches no `local` buffer allocated outside it (registers or the stack of
  the function around it, which another thread cannot reach);
- no other buffer that may share the written buffer's memory is accessed in
  the loop: views (`DeclBuffer`) of one allocation conflict unless their byte
  ranges are disjoint, and the parameters of a kernel that some call inside
  the module passes overlapping memory (`kiln.ir.aliasing`) all may
  alias each other;
- the estimated work, `extent * cost(body)` (cost: expression nodes, math
  intrinsics weigh more, calls into the C math library most, inner loops
  multiply), is at least `min_work`: by default the nodes the current target
  runs in PARALLEL_MIN_NS (kiln.kernels.parallel_work, the threshold every
  kernel family uses), since a launch costs a few microseconds.

Which loop: in each loop nest the outermost candidate is taken; when a
perfectly nested chain starts with short loops (fewer than `min_extent`
iterations, e.g. a batch or group of 1-3), the first loop of the chain with
at least `min_extent` iterations is taken instead (or the longest one). An
innermost loop (the one the backend vectorizes) is taken only when no loop
around it can be. A loop that cannot be parallel is searched for parallel
loops inside it; a loop a kernel's builder marked `parallel` is left as it is,
and nothing inside it is split again.
Pieces: the loops kiln.transform.partition_loops splits one loop into (a
concatenation's inputs: serial loops of one variable name, each starting where
the last ended, each with loops inside) are taken together when their union is
worth the pool and independent: one parallel loop over the union whose body
picks a piece's body by a binary search over the starts (a few compares per
iteration of an outer loop), rather than one hand-off per piece with the small
pieces left serial.
Symbolic extents: an extent bounded by a constant (`min(8, n - 8 * i)`) counts
as that constant, another one as UNKNOWN_EXTENT iterations. A chosen loop of
symbolic extent (a batch that may be 1 at run time) is merged with the
independent loops right inside it (up to COLLAPSE_EXTENT iterations of theirs)
into one parallel loop over the product, the indices recovered by division,
so that a batch of one still splits its channels or rows. In every nest with a
parallel loop, a remainder of the index arithmetic that the loops' bounds make plain
is dropped (kiln.transform.index_ranges): outlined, the parallel loop runs from the
pool's `begin` to `end` and the backend no longer sees its bound (a head split's
`(i1 * 64 + i3) % 768` over 12 heads stayed a division per element). A parallel loop of
symbolic extent runs only when its extent at run time gives `min_work`; else a
copy of the serial nest runs (fresh variables: each copy binds its own).
Graph-level functions lowered to PrimFuncs (`kiln.graph`: a sequence of
kernel calls) are left alone; their kernels are parallelized. So are kernels whose
builder chose their parallel loops by the work threshold (`kiln.parallel_decided`):
a loop it left serial is not split after all by this pass's coarser estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kiln.ir.aliasing import analyze
from kiln.ir.analysis.loop_dependence import Storage, loop_is_parallelizable, upper_bound
from kiln.ir.attrs import ATTR_GRAPH, ATTR_PARALLEL_DECIDED
from kiln.ir.module import IRModule
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
    Allocate,
    AllocConst,
    Buffer,
    CallExtern,
    CallFunc,
    Const,
    DeclBuffer,
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    SeqStmt,
    Stmt,
    Store,
    Var,
    compare,
    seq,
)
from kiln.ir.visitor import (
    StmtMutator,
    expr_children,
    fresh_copy,
    iter_exprs,
    iter_stmts,
    stmt_children,
    substitute,
)
from kiln.kernels.parallel_work import min_parallel_work
from kiln.transform.index_ranges import drop_known_mods
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass

# Cost-model weights (units: one simple expression node). Intrinsics the backends
# emit as a few instructions weigh INTRINSIC_COST; the others (exp, log, erf, tanh,
# ...) and external calls are calls into the C math library, not vectorized, each
# costing tens of cycles: LIBM_CALL_COST (bench/rows.py: a softmax element with one
# `expf` costs about as much as 60 nodes of a vectorized dense layer).
INTRINSIC_COST = 8
LIBM_CALL_COST = 64
CHEAP_INTRINSICS = frozenset({"sqrt", "rsqrt", "fma", "abs", "floor", "ceil", "trunc",
                              "round", "isnan", "isinf", CHECK_INTRINSIC})
# A loop extent that is not a constant: a symbolic size (batch x seq rows), taken to be
# large, since a loop left serial costs a whole core at large sizes while a launch at
# small ones costs a few microseconds.
UNKNOWN_EXTENT = 1024
_N = TypeVar("_N")
# A symbolic loop chosen to split is merged with the loops inside it up to this many
# iterations of theirs: a batch of one then still spreads its channels over threads.
COLLAPSE_EXTENT = 64


@dataclass(frozen=True)
class Parallelize(FunctionPass):
    """Mark loops with provably independent iterations `parallel` (module docstring)."""

    name = "parallelize"
    level = "tensor"
    # Least estimated work (extent * body cost) worth a thread-pool launch; negative:
    # PARALLEL_MIN_NS of the current target's work (kiln.kernels.parallel_work),
    # the one threshold of the kernel families too.
    min_work: int = -1
    # Prefer a loop of a perfect nest with at least this many iterations.
    min_extent: int = 8

    def least_work(self) -> int:
        """`min_work`, or when negative the target's PARALLEL_MIN_NS of work."""
        return self.min_work if self.min_work >= 0 else min_parallel_work("node", kernel_isa())

    def run(self, mod: IRModule) -> IRModule:
        funcs = mod.prim_funcs()
        info = analyze(dict(funcs))
        # Kernels some call passes overlapping memory: their parameters may alias.
        aliased = {name for name in funcs if info.noalias[name] != info.written[name]}
        changed: dict[str, PrimFunc] = {}
        for name, fn in funcs.items():
            if fn.attrs.get(ATTR_GRAPH) or fn.attrs.get(ATTR_PARALLEL_DECIDED):
                continue  # a sequence of calls; a kernel whose builder chose its loops
            body = _Scheduler(self, fn, name in aliased).visit_stmt(fn.body)
            if body is not fn.body:
                changed[name] = fn.with_body(body)
        if not changed:
            return mod
        return IRModule({n: changed.get(n, f) for n, f in mod.functions.items()}, mod.attrs)


# ------------------------------------------------------------------ choosing loops


class LoopRewriter(StmtMutator):
    """Rebuilds a statement tree, handing every outermost `For` to `visit_for` (which
    subclasses override) and recording the constants and views met on the way in
    `storage`. The schedule passes (parallelize, interchange-reductions) share this walk."""

    storage: Storage

    def visit_alloc_const(self, s: AllocConst) -> Stmt:
        self.storage.bind_const(s.buffer)
        return super().visit_alloc_const(s)

    def visit_decl_buffer(self, s: DeclBuffer) -> Stmt:
        self.storage.bind_view(s)
        return super().visit_decl_buffer(s)


class _Scheduler(LoopRewriter):
    def __init__(self, options: Parallelize, fn: PrimFunc, params_alias: bool) -> None:
        self.options = options
        self.min_work = options.least_work()
        self.storage = Storage(fn, params_alias)

    def visit_for(self, loop: For) -> Stmt:
        """The loop nest with its chosen loop marked parallel (same object if none)."""
        return self.loop_nest(loop)

    def loop_nest(self, top: For) -> Stmt:
        chain = [top]
        while isinstance(chain[-1].body, For):
            chain.append(chain[-1].body)
        if any(loop.kind == "parallel" for loop in chain):
            # marked by the kernel's builder (rows of a symbolic count): its body already
            # runs on the pool, so nothing in or around it is split again
            return top
        safe = [loop for loop in chain if self.worth_it(loop) and self.independent(loop)]
        if not safe:
            # Nothing in this nest's chain: look for parallel loops deeper inside.
            return self.below(chain[-1], chain)
        # An innermost loop is what the backend vectorizes: split it only if nothing
        # else can be parallel.
        outer = [loop for loop in safe if _has_loop(loop.body)] or safe
        long = [loop for loop in outer if _extent(loop) >= self.options.min_extent]
        chosen = long[0] if long else max(outer, key=_extent)  # max keeps the first of ties
        group = _collapsible(chain, chosen, self.independent)
        loop = _collapsed(group) if len(group) > 1 else For(
            chosen.var, chosen.start, chosen.extent, "parallel", chosen.body)
        # outlined, the parallel loop runs from the pool's `begin` to `end`: the backend
        # no longer sees its bounds, so the remainders they made plain go now
        # (kiln.transform.index_ranges: a head split's `(i1 * 64 + i3) % 768`)
        return drop_known_mods(
            _rebuild(chain, chosen, self.when_worth_it(loop, chosen, group[-1].body)))

    def when_worth_it(self, loop: For, serial: For, body: Stmt) -> Stmt:
        """`loop` (parallel, each iteration running `body`), or for a symbolic extent: the
        parallel loop when the extent at run time gives `min_work`, else a copy of the
        serial nest `serial` (a launch costs more than a small loop gains)."""
        if isinstance(loop.extent, Const):
            return loop
        least = -(-self.min_work // max(_cost(body), 1))  # iterations that pay
        if least <= 2:
            return loop
        return IfThenElse(compare("ge", loop.extent, Const(least, loop.extent.dtype)), loop,
                          fresh_copy(serial))

    def below(self, innermost: For, chain: list[For]) -> Stmt:
        body = self.visit_stmt(innermost.body)
        if body is innermost.body:
            return chain[0]
        return _rebuild(chain, innermost, For(innermost.var, innermost.start, innermost.extent,
                                              innermost.kind, body))

    def visit_seq_stmt(self, s: SeqStmt) -> Stmt:
        """`s` with each run of pieces of one partitioned loop (`_piece_runs`) that may
        run in parallel as one parallel loop over all of them (`_merged`): one hand-off
        for a concatenation's inputs rather than one per input, pieces too small on
        their own included. Other statements as the base class rewrites them."""
        out: list[Stmt] = []
        for run in _piece_runs(s.body):
            loops = [x for x in run if isinstance(x, For)]
            # pieces with loops inside: an innermost loop is vector code, which a choice
            # per iteration would end
            merged = _merged(run) if len(loops) > 1 and all(
                _has_loop(lp.body) for lp in loops) else None
            if merged is not None:
                views, loop = merged
                for view in views:
                    self.storage.bind_view(view)
                if self.worth_it(loop) and self.independent(loop):
                    out += [*views, For(loop.var, loop.start, loop.extent, "parallel",
                                        loop.body)]
                    continue
            out += [self.visit_stmt(x) for x in run]
        body = tuple(out)
        return s if _same_stmts(body, s.body) else seq(*body)

    def worth_it(self, loop: For) -> bool:
        return (_extent(loop) >= 2
                and _extent(loop) * _cost(loop.body) >= self.min_work)

    def independent(self, loop: For) -> bool:
        return loop_is_parallelizable(loop, self.storage) and not _outer_locals(loop)


def _rebuild(chain: list[For], old: For, new: Stmt) -> Stmt:
    """The chain's top loop with `old` (a loop of the chain) replaced by `new`."""
    index = chain.index(old)
    out: Stmt = new
    for loop in reversed(chain[:index]):
        out = For(loop.var, loop.start, loop.extent, loop.kind, out)
    return out


def _collapsible(chain: list[For], chosen: For, independent: Callable[[For], bool]
                 ) -> list[For]:
    """`chosen` and the loops right inside it to split as one loop: when `chosen` has a
    symbolic extent (a batch that may be 1 at run time, a seq that may be short), the
    next independent loops of the chain (not the innermost, which the backend
    vectorizes) join it until their constant extents reach COLLAPSE_EXTENT. Each of
    them is independent with the others fixed, so every combination of their indices
    touches its own slice."""
    if isinstance(chosen.extent, Const):
        return [chosen]
    group = [chosen]
    constant = 1
    for loop in chain[chain.index(chosen) + 1:]:
        if constant >= COLLAPSE_EXTENT or not _has_loop(loop.body) or not independent(loop):
            break
        group.append(loop)
        if isinstance(loop.extent, Const):
            constant *= int(loop.extent.value)
    if any(not (isinstance(x.start, Const) and x.start.value == 0) for x in group):
        return [chosen]
    return group


def _collapsed(group: list[For]) -> For:
    """The perfect nest `group` (loops from 0) as one `parallel` loop over the product of
    their extents, each loop's variable recovered from the flat index."""
    flat = Var(f"{group[0].var.name}_flat", group[0].var.dtype)
    lets: list[Stmt] = []
    rest: PrimExpr = flat
    for k in range(len(group) - 1, -1, -1):
        loop = group[k]
        lets.append(LetStmt(loop.var, rest if k == 0 else rest % loop.extent))
        rest = rest // loop.extent
    lets.reverse()
    extent: PrimExpr = group[0].extent
    for loop in group[1:]:
        extent = extent * loop.extent
    # the merged loops' bounds, hidden from the backend behind the divisions, given back
    # to the index arithmetic that relied on them (kiln.transform.index_ranges)
    return For(flat, Const(0, flat.dtype), extent, "parallel",
               drop_known_mods(seq(*lets, group[-1].body)))


def _piece_runs(body: tuple[Stmt, ...]) -> list[list[Stmt]]:
    """`body` in runs: the statements of loops that continue one another (the pieces
    kiln.transform.partition_loops splits a loop into: serial loops of one variable
    name, constant bounds, each starting where the last ended, with the views
    FlattenLoops declares before each), each other statement a run of its own."""
    runs: list[list[Stmt]] = []
    pending: list[Stmt] = []  # views not yet placed: they go with the next statement
    current: list[Stmt] | None = None
    last: For | None = None
    for x in body:
        if isinstance(x, DeclBuffer):
            pending.append(x)
            continue
        if isinstance(x, For) and current is not None and last is not None and \
                _continues(last, x):
            current += [*pending, x]
        else:
            if current is not None:
                runs.append(current)
            current = [*pending, x] if isinstance(x, For) and x.kind == "serial" else None
            if current is None:
                runs += [[d] for d in pending] + [[x]]
        pending = []
        last = x if current is not None and isinstance(x, For) else None
    if current is not None:
        runs.append(current)
    return runs + [[d] for d in pending]


def _continues(prev: For, loop: For) -> bool:
    """Whether `loop` is the piece after `prev` (see `_piece_runs`)."""
    starts = [x.start for x in (prev, loop)]
    if loop.kind != "serial" or loop.var.name != prev.var.name or \
            not all(isinstance(v, Const) for v in (*starts, prev.extent, loop.extent)):
        return False
    end = int(prev.start.value) + int(prev.extent.value)  # type: ignore[attr-defined]
    return end == int(loop.start.value)  # type: ignore[attr-defined]


def _merged(run: list[Stmt]) -> tuple[list[DeclBuffer], For] | None:
    """The pieces of `run` as one serial loop over their union, its body choosing a
    piece's body by a binary search over their starts; the views first, those of one
    storage, offset and shape as one view (so that the analysis sees one buffer
    written at one index). None when a view's offset is not an int."""
    views: list[DeclBuffer] = []
    same: dict[Buffer, Buffer] = {}
    for x in run:
        if isinstance(x, DeclBuffer):
            if not isinstance(x.byte_offset, int):
                return None
            first = next((v for v in views if (v.source, v.byte_offset, v.buffer.shape,
                                               v.buffer.dtype) == (x.source, x.byte_offset,
                                                                   x.buffer.shape,
                                                                   x.buffer.dtype)), None)
            if first is None:
                views.append(x)
            else:
                same[x.buffer] = first.buffer
    loops = [x for x in run if isinstance(x, For)]
    var = Var(loops[0].var.name, loops[0].var.dtype)
    bodies = [substitute(lp.body, {lp.var: var}, same) for lp in loops]

    def choose(lo: int, hi: int) -> Stmt:
        if hi - lo == 1:
            return bodies[lo]
        mid = (lo + hi) // 2
        return IfThenElse(compare("lt", var, loops[mid].start), choose(lo, mid),
                          choose(mid, hi))

    last = loops[-1]
    extent = Const(int(last.start.value) + int(last.extent.value)  # type: ignore[attr-defined]
                   - int(loops[0].start.value), var.dtype)  # type: ignore[attr-defined]
    return views, For(var, loops[0].start, extent, "serial", choose(0, len(loops)))


def _same_stmts(a: tuple[Stmt, ...], b: tuple[Stmt, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _outer_locals(loop: For) -> bool:
    """Whether `loop` touches a `local` buffer allocated outside it (registers or the
    stack of the function around it: a GEMM tile's `stage`, read by its store loop),
    which the iterations run on another thread could not reach."""
    inside = {s.buffer for s in iter_stmts(loop.body) if isinstance(s, Allocate)}
    for s in iter_stmts(loop.body):
        used = [s.buffer] if isinstance(s, Store) else []
        used += [e.buffer for x in expr_children(s) if isinstance(x, PrimExpr)
                 for e in iter_exprs(x) if isinstance(e, Load)]
        if any(b.scope == "local" and b not in inside for b in used):
            return True
    return False


def _has_loop(s: Stmt) -> bool:
    return any(isinstance(x, For) for x in iter_stmts(s))


def _extent(loop: For) -> int:
    """The loop's iteration count, or its constant bound (`min(8, n - i)`), else
    UNKNOWN_EXTENT."""
    bound = upper_bound(loop.extent)
    return bound if bound is not None else UNKNOWN_EXTENT


# ------------------------------------------------------------------ cost model


def _expr_cost(e: PrimExpr) -> int:
    total = 0
    for node in iter_exprs(e):
        if isinstance(node, Intrin):
            total += INTRINSIC_COST if node.name in CHEAP_INTRINSICS else LIBM_CALL_COST
        else:
            total += LIBM_CALL_COST if isinstance(node, CallExtern) else 1
    return total


def _cost(s: Stmt) -> int:
    """Estimated work of one execution of `s` (expression nodes; loops multiply)."""
    if isinstance(s, For):
        return max(_extent(s), 0) * (1 + _cost(s.body))
    if isinstance(s, IfThenElse):
        other = _cost(s.else_body) if s.else_body is not None else 0
        return _expr_cost(s.cond) + max(_cost(s.then_body), other)
    if isinstance(s, CallFunc):
        return 1
    own = sum(_expr_cost(e) for e in expr_children(s) if isinstance(e, PrimExpr))
    return own + int(isinstance(s, Store)) + sum(_cost(x) for x in stmt_children(s))


# ------------------------------------------------------------------ storage


__all__ = ["Parallelize"]
