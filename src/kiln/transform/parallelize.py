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
- no other buffer that may share the written buffer's memory is accessed in
  the loop: views (`DeclBuffer`) of one allocation conflict unless their byte
  ranges are disjoint, and the parameters of a kernel that some call inside
  the module passes overlapping memory (`kiln.ir.aliasing`) all may
  alias each other;
- the estimated work, `extent * cost(body)` (cost: expression nodes, math
  intrinsics weigh more, calls into the C math library most, inner loops
  multiply), is at least `min_work`: a launch costs a few microseconds, more
  on a busy machine.

Which loop: in each loop nest the outermost candidate is taken; when a
perfectly nested chain starts with short loops (fewer than `min_extent`
iterations, e.g. a batch or group of 1-3), the first loop of the chain with
at least `min_extent` iterations is taken instead (or the longest one). An
innermost loop (the one the backend vectorizes) is taken only when no loop
around it can be. A loop that cannot be parallel is searched for parallel
loops inside it; a loop a kernel's builder marked `parallel` is left as it is,
and nothing inside it is split again.
Symbolic extents: an extent bounded by a constant (`min(8, n - 8 * i)`) counts
as that constant, another one as UNKNOWN_EXTENT iterations. A chosen loop of
symbolic extent (a batch that may be 1 at run time) is merged with the
independent loops right inside it (up to COLLAPSE_EXTENT iterations of theirs)
into one parallel loop over the product, the indices recovered by division,
so that a batch of one still splits its channels or rows. A parallel loop of
symbolic extent runs only when its extent at run time gives `min_work`; else a
copy of the serial nest runs (fresh variables: each copy binds its own).
Graph-level functions lowered to PrimFuncs (`kiln.graph`: a sequence of
kernel calls) are left alone; their kernels are parallelized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from kiln.ir import dtype as dt
from kiln.ir.aliasing import Region, analyze
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.module import IRModule
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
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
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    UnaryOp,
    Var,
    compare,
    seq,
)
from kiln.ir.visitor import (
    VAR_DEF,
    StmtExprMutator,
    StmtMutator,
    child_fields,
    definitions,
    expr_children,
    iter_exprs,
    iter_stmts,
    stmt_children,
)
from kiln.transform.pass_base import FunctionPass

# Pure C math functions a parallel loop may call (scalars in, scalar out).
PURE_EXTERNS = frozenset(
    base + suffix
    for base in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt",
                 "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh",
                 "acosh", "atanh", "erf", "erfc", "fabs", "floor", "ceil", "trunc", "round",
                 "rint", "nearbyint", "pow", "atan2", "fmod", "hypot", "fmin", "fmax",
                 "copysign", "tgamma", "lgamma")
    for suffix in ("", "f"))

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
    # Least estimated work (extent * body cost) worth a thread-pool launch: about
    # 10-50 us of one thread's work. A launch costs a few microseconds on idle
    # cores, far more when the other cores are busy (the caller waits for a chunk a
    # descheduled worker took), so loops of a few microseconds stay serial.
    min_work: int = 1_000_000
    # Prefer a loop of a perfect nest with at least this many iterations.
    min_extent: int = 8

    def run(self, mod: IRModule) -> IRModule:
        funcs = mod.prim_funcs()
        info = analyze(dict(funcs))
        # Kernels some call passes overlapping memory: their parameters may alias.
        aliased = {name for name in funcs if info.noalias[name] != info.written[name]}
        changed: dict[str, PrimFunc] = {}
        for name, fn in funcs.items():
            if fn.attrs.get(ATTR_GRAPH):
                continue
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
        return _rebuild(chain, chosen, self.when_worth_it(loop, chosen, group[-1].body))

    def when_worth_it(self, loop: For, serial: For, body: Stmt) -> Stmt:
        """`loop` (parallel, each iteration running `body`), or for a symbolic extent: the
        parallel loop when the extent at run time gives `min_work`, else a copy of the
        serial nest `serial` (a launch costs more than a small loop gains)."""
        if isinstance(loop.extent, Const):
            return loop
        least = -(-self.options.min_work // max(_cost(body), 1))  # iterations that pay
        if least <= 2:
            return loop
        return IfThenElse(compare("ge", loop.extent, Const(least, loop.extent.dtype)), loop,
                          _FreshCopy().visit_stmt(serial))

    def below(self, innermost: For, chain: list[For]) -> Stmt:
        body = self.visit_stmt(innermost.body)
        if body is innermost.body:
            return chain[0]
        return _rebuild(chain, innermost, For(innermost.var, innermost.start, innermost.extent,
                                              innermost.kind, body))

    def worth_it(self, loop: For) -> bool:
        return (_extent(loop) >= 2
                and _extent(loop) * _cost(loop.body) >= self.options.min_work)

    def independent(self, loop: For) -> bool:
        return loop_is_parallelizable(loop, self.storage)


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
    return For(flat, Const(0, flat.dtype), extent, "parallel", seq(*lets, group[-1].body))


class _FreshCopy(StmtExprMutator):
    """A copy of a statement binding fresh variables and buffers of the same names (a
    loop emitted twice: each copy binds its own)."""

    def __init__(self) -> None:
        self.vars: dict[Var, Var] = {}
        self.buffers: dict[Buffer, Buffer] = {}

    def visit_stmt(self, s: Stmt) -> Stmt:
        for d in definitions(s):
            if isinstance(d, Var):
                self.vars.setdefault(d, Var(d.name, d.dtype))
            elif d not in self.buffers:
                shape = tuple(x if isinstance(x, int) else self.visit_expr(x) for x in d.shape)
                self.buffers[d] = Buffer(d.name, shape, d.dtype, d.scope)
        return super().visit_stmt(s)

    def generic_visit(self, node: _N) -> _N:
        new: dict[str, object] = {}
        for name, role in child_fields(type(node)).walk:
            value = getattr(node, name)
            new[name] = (self.vars.get(value, value) if role == VAR_DEF
                         else self._rewrite(value, role))
        return replace(node, **new)  # type: ignore[type-var]

    def visit_var(self, e: Var) -> PrimExpr:
        return self.vars.get(e, e)

    def visit_buffer(self, b: Buffer) -> Buffer:
        return self.buffers.get(b, b)


def _has_loop(s: Stmt) -> bool:
    return any(isinstance(x, For) for x in iter_stmts(s))


def _extent(loop: For) -> int:
    """The loop's iteration count, or its constant bound (`min(8, n - i)`), else
    UNKNOWN_EXTENT."""
    bound = _upper_bound(loop.extent)
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


_PARAMS = object()  # the one root of all parameters of a kernel whose parameters may alias


@dataclass
class Storage:
    """Regions of the buffers in scope of a function (parameters, allocations, views).

    Walk the function in order and `bind_const` / `bind_view` each AllocConst and
    DeclBuffer met, so a loop is analysed with the buffers around it.
    """

    fn: PrimFunc
    params_alias: bool
    regions: dict[Buffer, Region] = field(default_factory=dict)
    consts: set[Buffer] = field(default_factory=set)

    def __post_init__(self) -> None:
        for p in self.fn.buffer_params:
            root = _PARAMS if self.params_alias else p
            self.regions[p] = Region(root, None if self.params_alias else 0, _nbytes(p))

    def region(self, buf: Buffer) -> Region:
        # Allocations outside the loop and unknown buffers: their own storage.
        return self.regions.get(buf) or Region(buf, 0, _nbytes(buf))

    def bind_const(self, buf: Buffer) -> None:
        self.consts.add(buf)

    def bind_view(self, s: DeclBuffer) -> None:
        src = self.region(s.source)
        offset = None  # an offset expression (symbolic sizes): unknown here
        if src.offset is not None and isinstance(s.byte_offset, int):
            offset = src.offset + s.byte_offset
        self.regions[s.buffer] = Region(src.root, offset, _nbytes(s.buffer))
        if s.source in self.consts:
            self.consts.add(s.buffer)


def _nbytes(buf: Buffer) -> int | None:
    if all(isinstance(d, int) for d in buf.shape):
        return buf.nbytes()
    return None


# ------------------------------------------------------------------ independence


@dataclass
class _Access:
    buffer: Buffer
    indices: tuple[PrimExpr, ...]
    store: bool


def loop_is_parallelizable(loop: For, storage: Storage) -> bool:
    """True when distinct iterations of `loop` provably touch disjoint memory
    (see the module docstring); `storage` describes the buffers in scope."""
    if loop.kind != "serial" or not dt.is_int(loop.var.dtype):
        return False
    if loop.start.dtype != loop.var.dtype or loop.extent.dtype != loop.var.dtype:
        return False
    private: set[Buffer] = set()
    inner_vars: set[Var] = {loop.var}
    # Inner loop variables with a known range [lo, hi] (lets have none).
    ranges: dict[Var, tuple[int, int]] = {}
    accesses: list[_Access] = []
    for s in iter_stmts(loop.body):
        if isinstance(s, For):
            if s.kind == "parallel":
                return False
            inner_vars.add(s.var)
            span = _loop_range(s)
            if span is not None:
                ranges[s.var] = span
        elif isinstance(s, LetStmt):
            inner_vars.add(s.var)
        elif isinstance(s, (Allocate, AllocConst)):
            private.add(s.buffer)
        elif isinstance(s, DeclBuffer):
            if s.source in private:
                private.add(s.buffer)
            else:
                return False  # a view of outer storage made inside the loop: keep it simple
        elif isinstance(s, CallFunc):
            return False
        if isinstance(s, Store):
            accesses.append(_Access(s.buffer, s.indices, True))
        for e in _stmt_exprs(s):
            for node in iter_exprs(e):
                if isinstance(node, Load):
                    accesses.append(_Access(node.buffer, node.indices, False))
                elif isinstance(node, CallExtern) and not _pure_extern(node):
                    return False
                elif isinstance(node, Intrin) and node.name == CHECK_INTRINSIC:
                    return False  # a failing check returns from the kernel: serial only
    shared = [a for a in accesses if a.buffer not in private]
    written = {a.buffer for a in shared if a.store}
    for buf in written:
        if buf in storage.consts:
            return False
        region = storage.region(buf)
        # Nothing else in the loop may reach the written bytes.
        for a in shared:
            if a.buffer is not buf and storage.region(a.buffer).may_overlap(region):
                return False
        same = [a for a in shared if a.buffer is buf]
        if not any(_owned_dimension(same, d, loop.var, inner_vars)
                   or _owned_window(same, d, loop.var, inner_vars, ranges)
                   for d in range(buf.ndim)):
            return False
    return True


def _owned_dimension(accesses: list[_Access], d: int, var: Var, inner: set[Var]) -> bool:
    """Every access uses the same index in dimension `d`, affine in `var` with a non-zero
    constant coefficient and an otherwise loop-invariant part."""
    first = accesses[0].indices[d]
    if not _injective_in(first, var, inner):
        return False
    return all(_same_expr(a.indices[d], first) for a in accesses[1:])


def _owned_window(accesses: list[_Access], d: int, var: Var, inner: set[Var],
                  ranges: dict[Var, tuple[int, int]]) -> bool:
    """Tiled indices: every access's index in dimension `d` is `c * var + w + s`, with
    one non-zero constant `c` and one invariant part `s` (outer variables with the
    same coefficients) for all, and `w` a combination of inner loop variables whose
    values, over all accesses, span fewer than |c| elements (e.g. `jo * 64 + ji`
    with `0 <= ji < 64`). Iteration `var` then stays inside its own window."""
    forms = [_linear(a.indices[d]) for a in accesses]
    if any(f is None for f in forms):
        return False
    coeff: int | None = None
    outer: dict[Var, int] | None = None
    low, high = None, None
    for form in forms:
        assert form is not None
        terms, offset = form
        c = terms.get(var, 0)
        if c == 0 or (coeff is not None and c != coeff):
            return False
        coeff = c
        here = {v: k for v, k in terms.items() if v is not var and v not in inner and k}
        if outer is not None and here != outer:
            return False
        outer = here
        lo = hi = offset
        for v, k in terms.items():
            if v is var or v not in inner or k == 0:
                continue
            if v not in ranges:
                return False  # a let, or a loop of unknown extent
            a, b = ranges[v]
            lo += min(k * a, k * b)
            hi += max(k * a, k * b)
        low = lo if low is None else min(low, lo)
        high = hi if high is None else max(high, hi)
    assert coeff is not None and low is not None and high is not None
    return high - low < abs(coeff)


def _linear(e: PrimExpr) -> tuple[dict[Var, int], int] | None:
    """`e` as sum(k * var) + constant with integer k, in 64-bit arithmetic (no
    wrap-around for in-range indices); None for anything else."""
    if isinstance(e, Var):
        return ({e: 1}, 0) if dt.is_int(e.dtype) else None
    if isinstance(e, Const):
        return ({}, int(e.value)) if dt.is_int(e.dtype) else None
    if isinstance(e, Cast):
        # A widened variable keeps its value; other casts may wrap.
        if (isinstance(e.value, Var) and dt.is_int(e.dtype) and dt.is_int(e.value.dtype)
                and dt.bits(e.dtype) == 64 and dt.kind(e.value.dtype) == "int"):
            return _linear(e.value)
        return None
    if not isinstance(e, BinaryOp) or dt.bits(e.dtype) != 64 or not dt.is_int(e.dtype):
        return None
    if e.op in ("add", "sub"):
        a, b = _linear(e.a), _linear(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        terms = dict(a[0])
        for v, k in b[0].items():
            terms[v] = terms.get(v, 0) + sign * k
        return terms, a[1] + sign * b[1]
    if e.op == "mul":
        a, b = _linear(e.a), _linear(e.b)
        if a is None or b is None:
            return None
        if not b[0]:
            a, b = b, a
        if a[0]:  # a product of two variables
            return None
        return {v: k * a[1] for v, k in b[0].items()}, b[1] * a[1]
    return None


def _loop_range(loop: For) -> tuple[int, int] | None:
    """[first, last] values of a loop's variable when the start is a constant and the
    extent is at most a constant (`n` or `min(n, ...)`); None otherwise."""
    if not isinstance(loop.start, Const):
        return None
    bound = _upper_bound(loop.extent)
    if bound is None or bound < 1:
        return None
    start = int(loop.start.value)
    return start, start + bound - 1


def _upper_bound(e: PrimExpr) -> int | None:
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, BinaryOp) and e.op == "min":
        bounds = [b for b in (_upper_bound(e.a), _upper_bound(e.b)) if b is not None]
        return min(bounds) if bounds else None
    return None


def _injective_in(e: PrimExpr, var: Var, inner: set[Var]) -> bool:
    coeff = _coefficient(e, var, inner)
    return coeff is not None and coeff != 0


def _coefficient(e: PrimExpr, var: Var, inner: set[Var]) -> int | None:
    """The coefficient of `var` if `e` is `c * var + rest` with `rest` invariant in the
    loop (no inner variable, no load); None when `e` has no such form."""
    if e is var:
        return 1
    if isinstance(e, (Const,)):
        return 0
    if isinstance(e, Var):
        return None if e in inner else 0
    if isinstance(e, Cast):
        # Widening an integer keeps distinct values distinct.
        if (dt.is_int(e.dtype) and dt.is_int(e.value.dtype)
                and dt.bits(e.dtype) >= dt.bits(e.value.dtype)
                and (dt.kind(e.dtype) == dt.kind(e.value.dtype)
                     or dt.bits(e.dtype) > dt.bits(e.value.dtype))):
            return _coefficient(e.value, var, inner)
        return None
    if isinstance(e, UnaryOp) and e.op == "neg":
        c = _coefficient(e.a, var, inner)
        return None if c is None else -c
    if isinstance(e, BinaryOp) and e.op in ("add", "sub"):
        a, b = _coefficient(e.a, var, inner), _coefficient(e.b, var, inner)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, BinaryOp) and e.op == "mul":
        a, b = _coefficient(e.a, var, inner), _coefficient(e.b, var, inner)
        if a is None or b is None:
            return None
        if a == 0 and b == 0:
            return 0
        # Only a constant factor keeps it linear and known non-zero; and it must not
        # wrap distinct values together: 64-bit index arithmetic (in-range indices
        # never come near 2**63), or an odd factor (a bijection modulo 2**bits).
        factor = e.b if a != 0 else e.a
        if not isinstance(factor, Const):
            return None
        if dt.bits(e.dtype) < 64 and int(factor.value) % 2 == 0:
            return None
        return (a or b) * int(factor.value)
    if all(_coefficient(c, var, inner) == 0 for c in _children(e)) and not isinstance(e, Load):
        return 0  # any other invariant expression
    return None


def _same_expr(a: PrimExpr, b: PrimExpr) -> bool:
    """Structural equality of two expressions (variables and buffers by identity)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.dtype == b.dtype and a.value == b.value  # type: ignore[attr-defined]
    if isinstance(a, Var):
        return False
    if isinstance(a, (BinaryOp, Compare, UnaryOp, Intrin, CallExtern)):
        if getattr(a, "op", None) != getattr(b, "op", None):
            return False
        if getattr(a, "name", None) != getattr(b, "name", None):
            return False
    if isinstance(a, Cast) and a.dtype != b.dtype:
        return False
    if isinstance(a, Load) and a.buffer is not b.buffer:  # type: ignore[attr-defined]
        return False
    ca, cb = _children(a), _children(b)
    return len(ca) == len(cb) and all(_same_expr(x, y) for x, y in zip(ca, cb))


def _pure_extern(e: CallExtern) -> bool:
    return e.name in PURE_EXTERNS and not any(isinstance(a, Buffer) for a in e.args)


# ------------------------------------------------------------------ walks


def _children(e: PrimExpr) -> tuple[PrimExpr, ...]:
    """Operand expressions of `e` (buffer arguments of extern calls left out)."""
    return tuple(c for c in expr_children(e) if isinstance(c, PrimExpr))


def _stmt_exprs(s: Stmt) -> tuple[PrimExpr, ...]:
    """Expressions a statement holds directly, including symbolic sizes it allocates."""
    exprs = tuple(e for e in expr_children(s) if isinstance(e, PrimExpr))
    if isinstance(s, Allocate):
        exprs += tuple(d for d in s.buffer.shape if isinstance(d, PrimExpr))
    return exprs


__all__ = ["Parallelize", "Storage", "loop_is_parallelizable"]
