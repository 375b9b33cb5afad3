"""Dimension expressions (`kiln.dim_expr`) as LLVM IR with kiln_dim.c's checked arithmetic.

A buffer whose size is an expression of symbolic dimensions (the one workspace of a
graph function, a temporary of a kernel) is sized here: every `+ - *` and unary
minus uses LLVM's `s*.with.overflow` intrinsics, `//` and `%` refuse a zero
divisor and `INT64_MIN // -1`, and a failed node gives 0 and sets the returned
flag, as the C helpers and `kiln.dim_expr.compute` do. The caller turns the flag
into the kernel's ERROR_SIZE_OVERFLOW instead of allocating a wrapped size.
"""

from __future__ import annotations

from collections.abc import Mapping

from llvmlite import ir

from kiln import dim_expr
from kiln.dim_expr import Op

I1 = ir.IntType(1)
I64 = ir.IntType(64)
_OVERFLOWING = {Op.ADD: "sadd_with_overflow", Op.SUB: "ssub_with_overflow",
                Op.MUL: "smul_with_overflow"}


def checked_dim(b: ir.IRBuilder, e: dim_expr.Expr,
                names: Mapping[str, ir.Value]) -> tuple[ir.Value, ir.Value]:
    """(i64 value, i1 failed) of `e`, each variable the i64 `names[name]`."""
    failed: ir.Value = ir.Constant(I1, 0)
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)

    def leaf(n: dim_expr.Const | dim_expr.Var) -> ir.Value:
        return ir.Constant(I64, n.value) if isinstance(n, dim_expr.Const) else names[n.name]

    def fail_if(bad: ir.Value, value: ir.Value) -> ir.Value:
        nonlocal failed
        failed = b.or_(failed, bad)
        return b.select(bad, zero, value)

    def node(n: dim_expr.Neg | dim_expr.Binary, args: list[object]) -> ir.Value:
        ops = [a for a in args if isinstance(a, ir.Value)]
        if isinstance(n, dim_expr.Neg):
            pair = b.ssub_with_overflow(zero, ops[0])
            return fail_if(b.extract_value(pair, 1), b.extract_value(pair, 0))
        x, y = ops
        if n.op in _OVERFLOWING:
            pair = getattr(b, _OVERFLOWING[n.op])(x, y)
            return fail_if(b.extract_value(pair, 1), b.extract_value(pair, 0))
        if n.op in (Op.MIN, Op.MAX):
            return b.select(b.icmp_signed("<" if n.op == Op.MIN else ">", y, x), y, x)
        by_zero = b.icmp_signed("==", y, zero)
        minus_one = b.icmp_signed("==", y, ir.Constant(I64, -1))
        # x // -1 is -x and x % -1 is 0: divide by 1 instead, so no INT64_MIN / -1 traps
        safe = b.select(b.or_(by_zero, minus_one), one, y)
        r = b.srem(x, safe)
        # Python's rounding: a remainder whose sign differs from the divisor's moves one step
        adjust = b.and_(b.icmp_signed("!=", r, zero),
                        b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                      b.icmp_signed("<", y, zero)))
        if n.op == Op.FLOORMOD:
            return fail_if(by_zero, b.select(minus_one, zero, b.select(adjust, b.add(r, y), r)))
        q = b.sdiv(x, safe)
        q = b.select(adjust, b.sub(q, one), q)
        neg = b.ssub_with_overflow(zero, x)  # x // -1
        q = b.select(minus_one, b.extract_value(neg, 0), q)
        return fail_if(b.or_(by_zero, b.and_(minus_one, b.extract_value(neg, 1))), q)

    value = dim_expr.fold(e, leaf, node)
    assert isinstance(value, ir.Value)
    return value, failed
