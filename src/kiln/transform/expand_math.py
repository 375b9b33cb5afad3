"""expand-math: float32 exp/tanh/sigmoid/erf intrinsics as vectorizable arithmetic on CPUs.

The C math library's `expf`, `tanhf` and `erff` are scalar calls, so a loop
computing one per element is not vectorized (no vector math library is
linked). On CPU targets (the kinds of kiln.kernels.math.CPU_KINDS) this
pass replaces every float32 `exp`, `tanh`, `sigmoid` and `erf` intrinsic in a
stored value (a `Store`'s or a `LetStmt`'s) with kiln.kernels.math's
polynomial forms, which the loop vectorizer widens; their intermediate values
are let variables bound just before the statement, so the expression stays a
tree of a few dozen nodes instead of a DAG every later walk would copy out.
Multiply-adds are `fma` where the target's ISA has FMA. On targets that compute in
bfloat16 (`precision=bf16`) `erf` is the short form (kiln.kernels.math.erf_short_f32,
within 2e-6): their GELUs feed products whose operands keep 8 significant bits.

Hoisting a value out of a `Select` arm changes nothing: the IR evaluates both
arms of a select. Other dtypes and targets keep the intrinsics (the backend's
libm or device math calls).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import StmtExprMutator, iter_nodes
from kiln.kernels.math import BUILDERS, CPU_KINDS, erf_short_f32
from kiln.target.isa import isa_for
from kiln.target.target import Target
from kiln.transform.pass_base import FunctionPass

F32 = "float32"


@dataclass(frozen=True)
class ExpandMath(FunctionPass):
    """Replace float32 exp/tanh/sigmoid/erf intrinsics with vectorizable arithmetic
    when the current target is a CPU (a no-op elsewhere)."""

    name = "expand-math"
    level = "tensor"

    def run_on_function(self, func: t.PrimFunc, name: str, mod: IRModule) -> t.PrimFunc:
        target = Target.current()
        if target is None or target.kind.name not in CPU_KINDS:
            return func
        if not any(isinstance(x, t.Intrin) and x.name in BUILDERS and x.dtype == F32
                   for x in iter_nodes(func.body)):
            return func  # nothing to expand: one walk, not a rewrite of every node
        isa = isa_for(target)
        body = _Expander(isa.fma, isa.precision == "bf16").visit_stmt(func.body)
        return func if body is func.body else func.with_body(body)


class _Expander(StmtExprMutator):
    def __init__(self, fused: bool, short_erf: bool = False) -> None:
        self.fused = fused
        self.builders = {**BUILDERS, "erf": erf_short_f32} if short_erf else BUILDERS
        self.lets: list[t.Stmt] | None = None  # set while a stored value is rewritten
        self.count = 0

    def bind(self, e: t.PrimExpr) -> t.PrimExpr:
        if isinstance(e, (t.Var, t.Const)):
            return e
        assert self.lets is not None
        self.count += 1
        v = t.Var(f"m{self.count}", e.dtype)
        self.lets.append(t.LetStmt(v, e))
        return v

    def visit_intrin(self, e: t.Intrin) -> t.PrimExpr:
        rewritten = self.generic_visit(e)
        build = self.builders.get(e.name)
        if build is None or self.lets is None or e.dtype != F32:
            return rewritten
        assert isinstance(rewritten, t.Intrin)
        return self.bind(build(rewritten.args[0], fused=self.fused, bind=self.bind))

    def _with_lets(self, s: t.Stmt) -> t.Stmt:
        outer, self.lets = self.lets, []
        try:
            new = self.generic_visit(s)
            lets = self.lets
        finally:
            self.lets = outer
        return t.seq(*lets, new) if lets else new

    def visit_store(self, s: t.Store) -> t.Stmt:
        return self._with_lets(s)

    def visit_let_stmt(self, s: t.LetStmt) -> t.Stmt:
        return self._with_lets(s)

    def visit_seq_stmt(self, s: t.SeqStmt) -> t.Stmt:
        # splice: a let's scope is the rest of its statement list, so the lets put
        # before a statement (and that statement, if it is a let) must stay in this list
        body = [self.visit_stmt(x) for x in s.body]
        if all(a is b for a, b in zip(body, s.body)):
            return s
        return t.seq(*body)
