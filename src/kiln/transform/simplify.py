"""Simplify: small, always-correct cleanups of tensor-level code.

- constant folding of arithmetic, comparisons and casts whose operands are all
  `Const`, with the IR's exact semantics (integers wrap at their width, `div`
  truncates on integers, `mod` is C remainder); division by zero, float
  `div`/`pow` and float -> int casts are left alone (their results are
  target- or rounding-sensitive, or undefined);
- identities: `x * 1`, `1 * x`, `x + 0`, `0 + x`, `x - 0` for integers;
  `x * 1`, `1 * x`, `x - 0.0`, `x + -0.0` for floats (`x + 0.0` is not an
  identity: it turns -0.0 into +0.0);
- `Select` / `IfThenElse` on a constant condition keep the taken branch;
- a loop of extent 1 starting at a constant or a variable is replaced by its
  body with the start substituted, and a `let` bound to a constant or a variable
  is dropped and substituted into the rest of its statement list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import StmtExprMutator
from kiln.transform.pass_base import FunctionPass


@dataclass(frozen=True)
class Simplify(FunctionPass):
    """Fold constants, drop identities, unwrap single-iteration loops."""

    name = "simplify"
    level = "tensor"

    def run_on_function(self, func: t.PrimFunc, name: str, mod: IRModule) -> t.PrimFunc:
        body = _Simplifier().visit_stmt(func.body)
        return func if body is func.body else func.with_body(body)


def simplify_expr(e: t.PrimExpr) -> t.PrimExpr:
    """`e` simplified (same object when nothing changed)."""
    return _Simplifier().visit_expr(e)


def simplify_stmt(s: t.Stmt) -> t.Stmt:
    """`s` simplified (same object when nothing changed)."""
    return _Simplifier().visit_stmt(s)


def _np_scalar(c: t.Const) -> Any:
    return dt.to_numpy(c.dtype).type(c.value)


def _const(value: Any, dtype: str) -> t.Const | None:
    """A Const from a numpy result, or None if it is not representable exactly."""
    if dt.is_float(dtype):
        return t.Const(float(value), dtype)
    if dt.is_bool(dtype):
        return t.Const(bool(value), dtype)
    return t.Const(int(value), dtype)


def _is_const(e: t.PrimExpr, value: float) -> bool:
    return isinstance(e, t.Const) and not dt.is_bool(e.dtype) and e.value == value


def _is_zero(e: t.PrimExpr, *, negative: bool) -> bool:
    """`e` is a float zero with the given sign."""
    return (isinstance(e, t.Const) and e.value == 0
            and bool(np.signbit(float(e.value))) == negative)


_INT_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum,
    "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
_FLOAT_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}
_COMPARE = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


def fold_binary(op: str, a: t.Const, b: t.Const) -> t.Const | None:
    """`a op b` as a Const, or None when folding is unsafe or unsupported."""
    dtype = a.dtype
    if dtype in ("float16", "bfloat16"):  # computed in float32 by the backends
        return None
    if dt.is_float(dtype):
        fn = _FLOAT_BINARY.get(op)
        if fn is None:
            return None
        with np.errstate(all="ignore"):
            return _const(fn(_np_scalar(a), _np_scalar(b)), dtype)
    if dt.is_bool(dtype):
        if op in ("and", "or", "xor"):
            lhs, rhs = bool(a.value), bool(b.value)
            return t.Const({"and": lhs and rhs, "or": lhs or rhs, "xor": lhs != rhs}[op], dtype)
        return None
    x, y = int(a.value), int(b.value)
    if op in _INT_BINARY:
        with np.errstate(all="ignore"):
            return _const(_INT_BINARY[op](_np_scalar(a), _np_scalar(b)), dtype)
    if y == 0 and op in ("div", "mod", "floordiv", "floormod"):
        return None
    if op == "floordiv":
        return _wrap(x // y, dtype)
    if op == "floormod":
        return _wrap(x % y, dtype)
    if op == "div":  # truncating
        q = abs(x) // abs(y)
        return _wrap(q if (x >= 0) == (y >= 0) else -q, dtype)
    if op == "mod":  # C remainder: sign of the dividend
        r = abs(x) % abs(y)
        return _wrap(r if x >= 0 else -r, dtype)
    return None


def _wrap(value: int, dtype: str) -> t.Const:
    """`value` wrapped to the integer dtype's width (two's complement)."""
    bits = dt.bits(dtype)
    value &= (1 << bits) - 1
    if dt.is_signed(dtype) and value >= 1 << (bits - 1):
        value -= 1 << bits
    return t.Const(value, dtype)


def fold_cast(dtype: str, c: t.Const) -> t.Const | None:
    """`Cast(dtype, c)` folded to a Const, or None where folding would not be exact."""
    src = c.dtype
    if "float16" in (src, dtype) or "bfloat16" in (src, dtype):
        return None
    if dt.is_float(src) and not dt.is_float(dtype):
        return None  # float -> int/bool: truncation of out-of-range values is undefined
    if dt.is_bool(dtype):
        return t.Const(bool(c.value), dtype)
    if dt.is_float(dtype):
        return t.Const(float(dt.to_numpy(dtype).type(c.value)), dtype)
    return _wrap(int(c.value), dtype)


class _Simplifier(StmtExprMutator):
    def __init__(self) -> None:
        self.subst: dict[t.Var, t.PrimExpr] = {}

    # ------------------------------------------------------------------ expressions

    def visit_var(self, e: t.Var) -> t.PrimExpr:
        return self.subst.get(e, e)

    def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr:
        e2 = super().visit_binary_op(e)
        if not isinstance(e2, t.BinaryOp):
            return e2
        a, b, op = e2.a, e2.b, e2.op
        if isinstance(a, t.Const) and isinstance(b, t.Const):
            folded = fold_binary(op, a, b)
            if folded is not None:
                return folded
        if dt.is_bool(a.dtype):
            return e2
        if op == "mul":
            if _is_const(b, 1):
                return a
            if _is_const(a, 1):
                return b
        if dt.is_float(a.dtype):
            # x - (+0.0) and x + (-0.0) are exact identities; x + (+0.0) maps -0.0 to +0.0.
            if op == "sub" and _is_zero(b, negative=False):
                return a
            if op == "add" and _is_zero(b, negative=True):
                return a
            if op == "add" and _is_zero(a, negative=True):
                return b
            return e2
        if op == "sub" and _is_const(b, 0):
            return a
        if op == "add":
            if _is_const(b, 0):
                return a
            if _is_const(a, 0):
                return b
        return e2

    def visit_compare(self, e: t.Compare) -> t.PrimExpr:
        e2 = super().visit_compare(e)
        if (isinstance(e2, t.Compare) and isinstance(e2.a, t.Const)
                and isinstance(e2.b, t.Const) and e2.a.dtype not in ("float16", "bfloat16")):
            return t.Const(bool(_COMPARE[e2.op](_np_scalar(e2.a), _np_scalar(e2.b))), "bool")
        return e2

    def visit_unary_op(self, e: t.UnaryOp) -> t.PrimExpr:
        e2 = super().visit_unary_op(e)
        if isinstance(e2, t.UnaryOp) and isinstance(e2.a, t.Const):
            c = e2.a
            if e2.op == "neg" and dt.is_float(c.dtype) and c.dtype in ("float32", "float64"):
                return t.Const(-float(c.value), c.dtype)
            if e2.op == "neg" and dt.is_int(c.dtype):
                return _wrap(-int(c.value), c.dtype)
            if e2.op == "not" and dt.is_bool(c.dtype):
                return t.Const(not c.value, c.dtype)
            if e2.op == "not" and dt.is_int(c.dtype):
                return _wrap(~int(c.value), c.dtype)
        return e2

    def visit_cast(self, e: t.Cast) -> t.PrimExpr:
        e2 = super().visit_cast(e)
        if isinstance(e2, t.Cast):
            if e2.value.dtype == e2.dtype:
                return e2.value
            if isinstance(e2.value, t.Const):
                folded = fold_cast(e2.dtype, e2.value)
                if folded is not None:
                    return folded
        return e2

    def visit_select(self, e: t.Select) -> t.PrimExpr:
        e2 = super().visit_select(e)
        if isinstance(e2, t.Select) and isinstance(e2.cond, t.Const):
            return e2.true_value if e2.cond.value else e2.false_value
        return e2

    # ------------------------------------------------------------------ statements

    def visit_for(self, s: t.For) -> t.Stmt:
        extent = self.visit_expr(s.extent)
        start = self.visit_expr(s.start)
        if (isinstance(extent, t.Const) and extent.value == 1
                and isinstance(start, (t.Const, t.Var))):
            previous = self.subst.get(s.var)
            self.subst[s.var] = start
            try:
                return self.visit_stmt(s.body)
            finally:
                self._restore(s.var, previous)
        body = self.visit_stmt(s.body)
        if start is s.start and extent is s.extent and body is s.body:
            return s
        return t.For(s.var, start, extent, s.kind, body)

    def _restore(self, var: t.Var, previous: t.PrimExpr | None) -> None:
        if previous is None:
            del self.subst[var]
        else:
            self.subst[var] = previous

    def visit_seq_stmt(self, s: t.SeqStmt) -> t.Stmt:
        # A let is in scope for the rest of its list: a substituted one is dropped
        # and its substitution ends with the list.
        out: list[t.Stmt] = []
        bound: list[tuple[t.Var, t.PrimExpr | None]] = []
        try:
            for x in s.body:
                if isinstance(x, t.LetStmt):
                    value = self.visit_expr(x.value)
                    if isinstance(value, (t.Const, t.Var)):
                        bound.append((x.var, self.subst.get(x.var)))
                        self.subst[x.var] = value
                        continue
                    out.append(x if value is x.value else t.LetStmt(x.var, value))
                else:
                    out.append(self.visit_stmt(x))
        finally:
            for var, previous in reversed(bound):
                self._restore(var, previous)
        if len(out) == len(s.body) and all(a is b for a, b in zip(out, s.body)):
            return s
        return t.seq(*out)

    def visit_let_stmt(self, s: t.LetStmt) -> t.Stmt:
        # A let alone in its block (nothing follows it to substitute into).
        value = self.visit_expr(s.value)
        return s if value is s.value else t.LetStmt(s.var, value)

    def visit_if_then_else(self, s: t.IfThenElse) -> t.Stmt:
        cond = self.visit_expr(s.cond)
        if isinstance(cond, t.Const):
            if cond.value:
                return self.visit_stmt(s.then_body)
            if s.else_body is not None:
                return self.visit_stmt(s.else_body)
            return t.Evaluate(t.Const(0, "int32"))
        return super().visit_if_then_else(s)
