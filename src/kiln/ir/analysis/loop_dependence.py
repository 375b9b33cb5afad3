"""Loop dependence: may the iterations of a loop run in any order, at once?

`loop_is_parallelizable(loop, storage)` is the test kiln.transform.parallelize
applies (its module docstring lists the conditions); the GPU schedule and the
reduction interchange ask the same question. `Storage` describes the buffers in
scope of the loop (parameters that may alias, allocations, views, constants).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir import dtype as dt
from kiln.ir.aliasing import Region
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
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    UnaryOp,
    Var,
)
from kiln.ir.visitor import expr_children, iter_exprs, iter_stmts

# Pure C math functions a parallel loop may call (scalars in, scalar out).
PURE_EXTERNS = frozenset(
    base + suffix
    for base in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt",
                 "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh",
                 "acosh", "atanh", "erf", "erfc", "fabs", "floor", "ceil", "trunc", "round",
                 "rint", "nearbyint", "pow", "atan2", "fmod", "hypot", "fmin", "fmax",
                 "copysign", "tgamma", "lgamma")
    for suffix in ("", "f"))


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
    bound = upper_bound(loop.extent)
    if bound is None or bound < 1:
        return None
    start = int(loop.start.value)
    return start, start + bound - 1


def upper_bound(e: PrimExpr) -> int | None:
    """A constant bound of `e` (a constant, or a `min` with one), else None."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, BinaryOp) and e.op == "min":
        bounds = [b for b in (upper_bound(e.a), upper_bound(e.b)) if b is not None]
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


__all__ = ["PURE_EXTERNS", "Storage", "loop_is_parallelizable", "upper_bound"]
