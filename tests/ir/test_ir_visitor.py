"""Generic traversal and rewriting helpers of kiln.ir.visitor."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, TensorType, evaluate, structural_equal
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.visitor import (
    GraphMutator,
    GraphVisitor,
    StmtExprMutator,
    StmtExprVisitor,
    StmtMutator,
    StmtVisitor,
    child_fields,
    definitions,
    expr_children,
    graph_children,
    iter_exprs,
    iter_nodes,
    iter_stmts,
    operands,
    post_order_visit,
    pre_order_visit,
    stmt_children,
    substitute,
)


def sample() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        X = ib.arg("X", (4, 4), "float32")
        Y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i, ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], t.const(0.0, "float32"))
            with ib.for_range(4, name="j") as j:
                ib.store(acc, [0], acc[0] + X[i, j] * 2.0)
            ib.store(Y, [i], acc[0])
    return ib.get()


def test_visitor_counts_nodes_and_sees_definitions() -> None:
    class Count(StmtExprVisitor):
        def __init__(self) -> None:
            self.loads = 0
            self.stores = 0
            self.var_defs: list[str] = []
            self.buffer_defs: list[str] = []

        def visit_load(self, e: t.Load) -> None:
            self.loads += 1
            super().visit_load(e)

        def visit_store(self, s: t.Store) -> None:
            self.stores += 1
            super().visit_store(s)

        def visit_var_def(self, v: t.Var) -> None:
            self.var_defs.append(v.name)

        def visit_buffer_def(self, b: t.Buffer) -> None:
            self.buffer_defs.append(b.name)

    c = Count()
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    c.visit_func(fn)
    assert (c.loads, c.stores) == (3, 3)
    assert c.var_defs == ["i", "j"]
    assert c.buffer_defs == ["X", "Y", "acc"]


def test_post_order_visits_children_first() -> None:
    x = t.Var("x", "float32")
    expr = (x + 1.0) * x
    seen: list[str] = []
    post_order_visit(expr, lambda n: seen.append(type(n).__name__))
    assert seen == ["Var", "Const", "BinaryOp", "Var", "BinaryOp"]
    assert expr_children(expr) == (expr.a, expr.b)  # type: ignore[attr-defined]


def test_mutator_preserves_identity_when_nothing_changes() -> None:
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    assert StmtExprMutator().visit_func(fn) is fn


def test_mutator_rewrites_and_keeps_the_rest() -> None:
    class DoubleToAdd(StmtExprMutator):
        def visit_binary_op(self, e: t.BinaryOp) -> t.PrimExpr:
            e2 = super().visit_binary_op(e)
            if isinstance(e2, t.BinaryOp) and e2.op == "mul" and isinstance(e2.b, t.Const) \
                    and e2.b.value == 2.0:
                return e2.a + e2.a
            return e2

    mod = sample()
    fn = mod["f"]
    assert isinstance(fn, t.PrimFunc)
    new = DoubleToAdd().visit_func(fn)
    assert new is not fn and not structural_equal(new, fn)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    y1, y2 = np.zeros(4, np.float32), np.zeros(4, np.float32)
    evaluate(mod, "f", x, y1)
    evaluate(mod.with_function("f", new), "f", x, y2)
    np.testing.assert_array_equal(y1, y2)


def test_buffer_remapping() -> None:
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    X = fn.params[0]
    assert isinstance(X, t.Buffer)
    X2 = t.Buffer("X2", X.shape, X.dtype)

    class Remap(StmtExprMutator):
        def visit_buffer(self, b: t.Buffer) -> t.Buffer:
            return X2 if b is X else b

    new = Remap().visit_func(fn)
    assert new.params[0] is X2
    assert structural_equal(new, fn)  # a consistent renaming of a bound buffer


def test_substitute() -> None:
    x, y = t.Var("x"), t.Var("y")
    expr = x * 3 + y
    out = substitute(expr, {x: t.const(2)})
    assert structural_equal(out, t.const(2) * 3 + y)
    assert substitute(expr, {}) is expr
    with pytest.raises(IRError, match="substitute: expected a PrimFunc, Stmt or PrimExpr"):
        substitute("x", {})  # type: ignore[type-var]


def test_unknown_node_type_is_an_error() -> None:
    class Weird(t.Stmt):
        __slots__ = ()

    with pytest.raises(IRError, match="StmtExprVisitor: no visit method for statement Weird"):
        StmtExprVisitor().visit_stmt(Weird())


def graph_sample() -> g.Function:
    ty = TensorType((2,), "float32")
    x = g.Var("x", ty)
    a = g.Var("a", ty)
    b = g.Var("b", ty)
    return g.Function((x,), (g.Binding(a, g.CallTensor("k1", (x,), ty)),
                             g.Binding(b, g.CallTensor("k2", (a, g.Constant(np.ones(2))), ty))),
                      g.Tuple((a, b)))


def test_graph_visitor_and_children() -> None:
    calls: list[str] = []

    class Calls(GraphVisitor):
        def visit_call_tensor(self, e: g.CallTensor) -> None:
            calls.append(e.func)
            super().visit_call_tensor(e)

    fn = graph_sample()
    Calls().visit_function(fn)
    assert calls == ["k1", "k2"]
    assert graph_children(fn.bindings[1].value)[0] is fn.bindings[0].var


def test_graph_mutator_renames_and_drops() -> None:
    class Rename(GraphMutator):
        def visit_call_tensor(self, e: g.CallTensor) -> g.Expr:
            e2 = super().visit_call_tensor(e)
            assert isinstance(e2, g.CallTensor)
            return g.CallTensor(e2.func + "_v2", e2.args, e2.ret_type)

    fn = graph_sample()
    assert GraphMutator().visit_function(fn) is fn
    new = Rename().visit_function(fn)
    assert [b.value.func for b in new.bindings] == ["k1_v2", "k2_v2"]  # type: ignore[attr-defined]

    class DropLast(GraphMutator):
        def visit_binding(self, b: g.Binding) -> g.Binding | list[g.Binding] | None:
            return None if b is fn.bindings[-1] else b

    assert len(DropLast().visit_function(fn).bindings) == 1


# --------------------------------------------------------------------------- derived fields


def test_child_fields_are_derived_from_the_dataclass_fields() -> None:
    assert child_fields(t.For).walk == (
        ("start", "expr"), ("extent", "expr"), ("var", "var_def"), ("body", "stmt"))
    assert child_fields(t.Store).of("expr") == ("value", "indices")
    assert child_fields(t.Load).of("buffer") == ("buffer",)
    assert child_fields(t.CallExtern).of("expr") == ("args",)  # buffers may be among them
    assert child_fields(t.Const).walk == ()
    assert child_fields(g.TupleGetItem).of("expr") == ("tuple_value",)


@dataclass(frozen=True, eq=False, slots=True)
class Repeat(t.Stmt):
    """A node class the walkers were never written for."""

    count: t.PrimExpr
    body: t.Stmt
    label: str = ""


def test_a_new_node_class_is_walked_without_new_walking_code() -> None:
    n = t.Var("n")
    Y = t.Buffer("Y", (4,), "int64")
    store = t.Store(Y, n * 2, (t.const(0),))
    node = Repeat(n + 1, store, "twice")
    assert stmt_children(node) == (store,)
    assert expr_children(node) == (node.count,)
    assert list(iter_stmts(node)) == [node, store]

    class Sub(StmtExprMutator):
        def visit_repeat(self, s: Repeat) -> t.Stmt:
            return self.generic_visit(s)

        def visit_var(self, e: t.Var) -> t.PrimExpr:
            return t.const(3) if e is n else e

    new = Sub().visit_stmt(node)
    assert isinstance(new, Repeat) and new.label == "twice"
    assert structural_equal(new.count, t.const(3) + 1)
    assert isinstance(new.body, t.Store) and new.body.buffer is Y
    assert structural_equal(new.body.value, t.const(3) * 2)
    untouched = Repeat(t.const(1), t.Evaluate(t.const(0)))
    assert Sub().visit_stmt(untouched) is untouched


def test_statement_visitor_does_not_enter_expressions() -> None:
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    seen: list[str] = []

    class Stmts(StmtVisitor):
        def visit_store(self, s: t.Store) -> None:
            seen.append("store")
            super().visit_store(s)

        def visit_load(self, e: t.Load) -> None:  # never called: expressions are not entered
            seen.append("load")

    Stmts().visit_func(fn)
    assert seen == ["store", "store", "store"]


def test_statement_mutator_rewrites_statements_only() -> None:
    mod = sample()
    fn = mod["f"]
    assert isinstance(fn, t.PrimFunc)
    assert StmtMutator().visit_func(fn) is fn

    class Unroll(StmtMutator):
        def visit_for(self, s: t.For) -> t.Stmt:
            body = self.visit_stmt(s.body)
            return t.For(s.var, s.start, s.extent, "unrolled", body)

    new = Unroll().visit_func(fn)
    assert [s.kind for s in iter_stmts(new.body) if isinstance(s, t.For)] == ["unrolled"] * 2
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    y1, y2 = np.zeros(4, np.float32), np.zeros(4, np.float32)
    evaluate(mod, "f", x, y1)
    evaluate(mod.with_function("f", new), "f", x, y2)
    np.testing.assert_array_equal(y1, y2)


def test_pre_order_visit_prunes_when_told() -> None:
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    everything: list[str] = []
    pre_order_visit(fn, lambda n: everything.append(type(n).__name__))
    assert everything[0] == "For" and everything.count("Load") == 3
    assert everything == [type(n).__name__ for n in iter_nodes(fn.body)]

    outer: list[str] = []

    def stop_at_inner_loop(n: object) -> bool:
        outer.append(type(n).__name__)
        return not (isinstance(n, t.For) and n.var.name == "j")

    pre_order_visit(fn, stop_at_inner_loop)
    assert outer.count("For") == 2 and outer.count("Load") == 1  # only Y[i] = acc[0]


def test_operands_and_definitions_in_evaluation_order() -> None:
    fn = sample()["f"]
    assert isinstance(fn, t.PrimFunc)
    loops = [s for s in iter_stmts(fn.body) if isinstance(s, t.For)]
    assert [v.name for s in loops for v in definitions(s)] == ["i", "j"]  # type: ignore[union-attr]
    store = next(s for s in iter_stmts(loops[1]) if isinstance(s, t.Store))
    assert operands(store)[0] is store.buffer
    load = next(e for e in iter_exprs(store.value) if isinstance(e, t.Load))
    assert operands(load) == (load.buffer, *load.indices)


def test_long_statement_lists_are_walked_without_recursion() -> None:
    Y = t.Buffer("Y", (1,), "int64")
    n = 5 * sys.getrecursionlimit()
    body = t.SeqStmt(tuple(t.Store(Y, t.const(k), (t.const(0),)) for k in range(n)))
    fn = t.PrimFunc((Y,), body)
    StmtExprVisitor().visit_func(fn)
    assert StmtExprMutator().visit_func(fn) is fn
    assert sum(1 for _ in iter_stmts(body)) == n + 1
    assert sum(1 for _ in iter_nodes(body)) == 1 + 3 * n
