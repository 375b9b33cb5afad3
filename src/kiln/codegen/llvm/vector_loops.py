"""`vectorized` loops of constant extent, emitted as LLVM vector instructions.

kiln's kernels spell the lanes of a register tile (kiln.ops.conv_kernels) as an innermost
`for v in T.vectorized(n)` loop. When its body is straight-line arithmetic, the loop
becomes one `<n x float>` load, operation or store per IR node, instead of `n` scalar
copies that LLVM's SLP vectorizer would have to put back together: a tile's IR is `n`
times smaller, compiles that much faster, and its vector shape does not depend on what
the SLP vectorizer happens to find.

A loop is emitted this way when (`vector_lanes` checks it):

- its extent is a constant from 2 to `MAX_LANES` (LLVM splits wide vectors into registers);
- its body holds stores and lets only (a let whose value depends on the loop variable
  binds a vector);
- every expression that depends on the loop variable is a float32/float64 `add`, `sub`,
  `mul`, `div`, `min`, `max`, `neg` or `fma`, an int32 `dot4_u8s8` (the target's
  dot-product instructions, int_dot.py), such a let variable, or a load whose
  element moves by exactly one when the variable grows by one (a contiguous load);
  expressions that do not depend on it are computed once and broadcast;
- every store is contiguous;
- the buffers the loop writes are touched only contiguously, at element distances that
  keep different iterations apart (0, or at least the extent), and no other buffer of
  the loop may share their memory (stack buffers, constants and `noalias` parameters
  cannot).

Any other `vectorized` loop is emitted as a scalar loop with LLVM's vectorize hint, which
is always correct: the check keeps a wrong independence promise from changing a result.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from llvmlite import ir

from kiln.codegen.llvm import arith
from kiln.codegen.llvm.dtypes import I32, storage_type
from kiln.codegen.llvm.intrinsics import emit_intrinsic
from kiln.ir import dtype as dt
from kiln.ir.affine import constant_offset, flat_coefficient, mentions
from kiln.ir.tensor import (
    DOT4_U8S8,
    BinaryOp,
    Buffer,
    Const,
    For,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    SeqStmt,
    Stmt,
    Store,
    UnaryOp,
    Var,
)
from kiln.ir.visitor import iter_exprs

if TYPE_CHECKING:
    from kiln.codegen.llvm.lower_to_llvm import FunctionLowering

MAX_LANES = 256
VECTOR_DTYPES = frozenset({"float32", "float64"})
VECTOR_BINARY = frozenset({"add", "sub", "mul", "div", "min", "max"})
VECTOR_INTRINSICS = frozenset({"fma"})
# int32 lanes: loads, stores and the integer dot product (the quantized kernels' tiles)
INT_VECTOR_DTYPE = "int32"

Access = tuple[Buffer, tuple[PrimExpr, ...], bool]  # buffer, indices, contiguous


class _Checker:
    """Decides whether a loop body can be emitted as vector statements."""

    def __init__(self, var: Var) -> None:
        self.var = var
        self.vectors: set[Var] = set()  # let variables bound to vectors
        self.accesses: list[Access] = []
        self.written: set[Buffer] = set()

    def lane_invariant(self, e: PrimExpr) -> bool:
        return not mentions(e, {self.var, *self.vectors})

    def stmt(self, s: Stmt) -> bool:
        if isinstance(s, SeqStmt):
            return all(self.stmt(x) for x in s.body)
        if isinstance(s, LetStmt):
            if s.var.dtype != s.value.dtype or not self.expr(s.value):
                return False
            if not self.lane_invariant(s.value):
                self.vectors.add(s.var)
            return True
        if isinstance(s, Store):
            if (s.buffer.dtype not in (*VECTOR_DTYPES, INT_VECTOR_DTYPE)
                    or s.value.dtype != s.buffer.dtype
                    or not self.expr(s.value) or not self.contiguous(s.buffer, s.indices)):
                return False
            self.accesses.append((s.buffer, s.indices, True))
            self.written.add(s.buffer)
            return True
        return False

    def contiguous(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> bool:
        if any(mentions(i, self.vectors) for i in indices):
            return False  # indexed by a computed vector: a gather
        return flat_coefficient(buf, indices, self.var) == 1

    def expr(self, e: PrimExpr) -> bool:
        """True if `e` can be computed for all lanes at once."""
        if self.lane_invariant(e):
            self.accesses += [(x.buffer, x.indices, False) for x in iter_exprs(e)
                              if isinstance(x, Load)]
            return True
        if isinstance(e, Var):
            return e in self.vectors  # the loop variable as a value: not handled
        if e.dtype == INT_VECTOR_DTYPE:
            return self.int_expr(e)
        if e.dtype not in VECTOR_DTYPES:
            return False
        if isinstance(e, Load):
            if not self.contiguous(e.buffer, e.indices):
                return False
            self.accesses.append((e.buffer, e.indices, True))
            return True
        if isinstance(e, BinaryOp):
            return (e.op in VECTOR_BINARY and e.a.dtype == e.b.dtype == e.dtype
                    and self.expr(e.a) and self.expr(e.b))
        if isinstance(e, UnaryOp):
            return e.op == "neg" and self.expr(e.a)
        if isinstance(e, Intrin):
            return (e.name in VECTOR_INTRINSICS and all(a.dtype == e.dtype for a in e.args)
                    and all(self.expr(a) for a in e.args))
        return False

    def int_expr(self, e: PrimExpr) -> bool:
        """int32 lanes: a contiguous load or `dot4_u8s8` of such (or broadcast) values."""
        if isinstance(e, Load):
            if not self.contiguous(e.buffer, e.indices):
                return False
            self.accesses.append((e.buffer, e.indices, True))
            return True
        return (isinstance(e, Intrin) and e.name == DOT4_U8S8
                and all(a.dtype == INT_VECTOR_DTYPE and self.expr(a) for a in e.args))

    def independent(self, lanes: int, private: set[Buffer]) -> bool:
        """Different iterations never touch one element of a written buffer, and nothing
        else the loop reads may share a written buffer's memory."""
        for w in self.written:
            mine = [a for a in self.accesses if a[0] is w]
            if not all(contiguous for _, _, contiguous in mine):
                return False
            for k, (_, first, _) in enumerate(mine):
                for _, second, _ in mine[k + 1:]:
                    d = constant_offset(w, first, second)
                    if d is None or 0 < abs(d) < lanes:
                        return False
            others = {a[0] for a in self.accesses if a[0] is not w}
            if others and w not in private and not others <= private:
                return False
        return True


def vector_lanes(fl: FunctionLowering, loop: For) -> int:
    """The lane count to emit `loop` with as vector code, or 0 for a scalar loop."""
    if not isinstance(loop.extent, Const):
        return 0
    lanes = int(loop.extent.value)
    if not 2 <= lanes <= MAX_LANES:
        return 0
    checker = _Checker(loop.var)
    if not checker.stmt(loop.body):
        return 0
    if any(b in fl.readonly for b in checker.written):
        return 0  # the scalar path reports the store into a constant
    return lanes if checker.independent(lanes, fl.private_buffers()) else 0


def emit_vector_loop(fl: FunctionLowering, loop: For, lanes: int) -> None:
    """Emit `loop` (checked by `vector_lanes`) as straight-line vector code."""
    _VectorBody(fl, loop.var, lanes).run(loop)


class _VectorBody:
    def __init__(self, fl: FunctionLowering, var: Var, lanes: int) -> None:
        self.fl = fl
        self.b = fl.b
        self.var = var
        self.lanes = lanes
        self.vectors: dict[Var, ir.Value] = {}

    def run(self, loop: For) -> None:
        fl = self.fl
        previous = fl.scalars.get(self.var)
        # Lane 0's addresses: every contiguous access starts there.
        fl.scalars[self.var] = fl.expr(loop.start)
        self.block(loop.body)
        if previous is None:
            fl.scalars.pop(self.var, None)
        else:
            fl.scalars[self.var] = previous

    def block(self, s: Stmt) -> None:
        bound: list[tuple[Var, bool, ir.Value | None]] = []
        for item in _items(s):
            if isinstance(item, SeqStmt):
                self.block(item)
            elif isinstance(item, LetStmt):
                table: dict[Var, ir.Value]
                if self.lane_invariant(item.value):
                    table, value = self.fl.scalars, self.fl.expr(item.value)
                else:
                    table, value = self.vectors, self.vexpr(item.value)
                bound.append((item.var, table is self.vectors, table.get(item.var)))
                table[item.var] = value
            else:
                assert isinstance(item, Store)
                value = self.vexpr(item.value)
                ptr = self.fl.element_ptr(item.buffer, item.indices)
                self.b.store(value, ptr, align=dt.itemsize(item.buffer.dtype))
        for var, is_vector, previous in reversed(bound):
            table = self.vectors if is_vector else self.fl.scalars
            if previous is None:
                table.pop(var, None)
            else:
                table[var] = previous

    def lane_invariant(self, e: PrimExpr) -> bool:
        return not mentions(e, {self.var, *self.vectors})

    def vexpr(self, e: PrimExpr) -> ir.Value:
        fl, b = self.fl, self.b
        if self.lane_invariant(e):
            return self.broadcast(fl.expr(e))
        if isinstance(e, Var):
            return self.vectors[e]
        if isinstance(e, Load):
            ptr = fl.element_ptr(e.buffer, e.indices)
            vt = ir.VectorType(storage_type(e.buffer.dtype), self.lanes)
            return b.load(ptr, typ=vt, align=dt.itemsize(e.buffer.dtype))
        if isinstance(e, BinaryOp):
            return arith.binary(fl.math, b, e.op, e.dtype, self.vexpr(e.a), self.vexpr(e.b))
        if isinstance(e, UnaryOp):
            return arith.unary(fl.math, b, e.op, e.dtype, self.vexpr(e.a))
        assert isinstance(e, Intrin)
        return emit_intrinsic(fl.math, b, e.name, e.dtype, [self.vexpr(a) for a in e.args])

    def broadcast(self, value: ir.Value) -> ir.Value:
        vt = ir.VectorType(value.type, self.lanes)
        undef = ir.Constant(vt, ir.Undefined)
        one = self.b.insert_element(undef, value, ir.Constant(I32, 0))
        zeros = ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes)
        return self.b.shuffle_vector(one, undef, zeros)


def _items(s: Stmt) -> Iterator[Stmt]:
    yield from s.body if isinstance(s, SeqStmt) else (s,)
