"""`vector` loops emitted as LLVM vector instructions.

The `vectorize-loops` pass (transform/vectorize_loops.py) marks a register tile's lane
loop `for v in T.vector(n)` when its body is straight-line vector code with independent
iterations (kiln.ir.analysis.vector_loops). Such a loop becomes one `<n x float>` load,
operation or store per IR node, instead of `n` scalar copies that LLVM's SLP vectorizer
would have to put back together: a tile's IR is `n` times smaller, compiles that much
faster, and its vector shape does not depend on what the SLP vectorizer happens to find.
Expressions that do not depend on the loop variable are computed once and broadcast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from llvmlite import ir

from kiln.codegen.llvm import arith
from kiln.codegen.llvm.dtypes import F32, I32, storage_type
from kiln.codegen.llvm.intrinsics import emit_intrinsic
from kiln.codegen.llvm.vector_constants import splat, undef
from kiln.ir import dtype as dt
from kiln.ir.affine import mentions_memoized
from kiln.ir.analysis.vector_loops import narrowed, vector_shape_fault
from kiln.ir.tensor import (
    BinaryOp,
    Cast,
    Compare,
    Const,
    For,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    Reinterpret,
    Select,
    SeqStmt,
    Stmt,
    Store,
    UnaryOp,
    Var,
)
from kiln.ir.visitor import iter_stmts

if TYPE_CHECKING:
    from kiln.codegen.llvm.lower_to_llvm import FunctionLowering


def emit_vector_loop(fl: FunctionLowering, loop: For) -> None:
    """Emit `vector` loop `loop` as straight-line vector code, all lanes at once."""
    fault = vector_shape_fault(loop)
    if fault is not None:
        raise fl.error(f"vector loop {loop.var.name!r} is not straight-line vector code: "
                       f"{fault}")
    for s in iter_stmts(loop.body):
        if isinstance(s, Store) and s.buffer in fl.readonly:
            raise fl.error(f"store into constant buffer {s.buffer.name!r}: AllocConst data "
                           "is read-only (it lives in the library's read-only data)")
    assert isinstance(loop.extent, Const)
    _VectorBody(fl, loop.var, int(loop.extent.value)).run(loop)


class _VectorBody:
    def __init__(self, fl: FunctionLowering, var: Var, lanes: int) -> None:
        self.fl = fl
        self.b = fl.b
        self.var = var
        self.lanes = lanes
        self.vectors: dict[Var, ir.Value] = {}
        # id(expression) -> (expression, lane-variant): `vexpr` asks this of every node
        # on its way down (kiln.ir.affine.mentions_memoized)
        self._variant: dict[int, tuple[PrimExpr, bool]] = {}

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
                self._forget(item.var)
            else:
                assert isinstance(item, Store)
                narrow = narrowed(item)
                if narrow is None:
                    value = self.vexpr(item.value)
                else:  # int32 lanes truncated to bytes or words (vpmovdb / vpmovdw)
                    value = self.b.trunc(self.vexpr(narrow), ir.VectorType(
                        storage_type(item.buffer.dtype), self.lanes))
                ptr = self.fl.element_ptr(item.buffer, item.indices)
                self.b.store(value, ptr, align=dt.itemsize(item.buffer.dtype))
        for var, is_vector, previous in reversed(bound):
            table = self.vectors if is_vector else self.fl.scalars
            if previous is None:
                table.pop(var, None)
            else:
                table[var] = previous
            self._forget(var)

    def _forget(self, var: Var) -> None:
        """Drop the answers of `lane_invariant` when `var` (a let variable just bound or
        unbound) was among the nodes they looked at."""
        if id(var) in self._variant:
            self._variant.clear()

    def lane_invariant(self, e: PrimExpr) -> bool:
        """Whether `e` mentions neither the loop variable nor a vector let."""
        return not mentions_memoized(e, self._lane_variable, self._variant)

    def _lane_variable(self, v: Var) -> bool:
        return v is self.var or v in self.vectors

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
        if isinstance(e, BinaryOp) and e.op in ("shl", "shr"):
            # by a constant in range (the analysis checks): no range select needed
            assert isinstance(e.b, Const)
            amount = self.broadcast(ir.Constant(I32, int(e.b.value)))
            x = self.vexpr(e.a)
            return b.shl(x, amount) if e.op == "shl" else b.ashr(x, amount)
        if isinstance(e, BinaryOp):
            return arith.binary(fl.math, b, e.op, e.dtype, self.vexpr(e.a), self.vexpr(e.b))
        if isinstance(e, UnaryOp):
            return arith.unary(fl.math, b, e.op, e.dtype, self.vexpr(e.a))
        if isinstance(e, Select):
            return b.select(self.vexpr(e.cond), self.vexpr(e.true_value),
                            self.vexpr(e.false_value))
        if isinstance(e, Compare):
            return arith.compare(b, e.op, e.a.dtype, self.vexpr(e.a), self.vexpr(e.b))
        if isinstance(e, Reinterpret):
            return arith.reinterpret(b, self.vexpr(e.value), e.dtype)
        if isinstance(e, Cast):
            return self.cast(self.vexpr(e.value), e.value.dtype, e.dtype)
        assert isinstance(e, Intrin)
        return emit_intrinsic(fl.math, b, e.name, e.args[0].dtype,
                              [self.vexpr(a) for a in e.args])

    def cast(self, x: ir.Value, src: str, dst: str) -> ir.Value:
        """The casts `vector_cast_fault` accepts: int32 -> float32, bytes or words widened
        (`uitofp` / `zext` from uint8 and uint16, `sitofp` / `sext` from int8, int16 and
        int32), int32 truncated to bytes."""
        b = self.b
        vt = ir.VectorType(F32 if dst == "float32" else storage_type(dst), self.lanes)
        signed = dt.kind(src) == "int"
        if dst == "float32":
            return b.sitofp(x, vt) if signed else b.uitofp(x, vt)
        if dt.bits(dst) < dt.bits(src):
            return b.trunc(x, vt)
        return b.sext(x, vt) if signed else b.zext(x, vt)

    def broadcast(self, value: ir.Value) -> ir.Value:
        undef_vector = undef(ir.VectorType(value.type, self.lanes))
        one = self.b.insert_element(undef_vector, value, _LANE_0)
        return self.b.shuffle_vector(one, undef_vector, splat(I32, self.lanes, 0))


_LANE_0 = ir.Constant(I32, 0)


def _items(s: Stmt) -> Iterator[Stmt]:
    yield from s.body if isinstance(s, SeqStmt) else (s,)
