"""Every concrete IR node class has a handler in every dispatch table.

A node class added to `kiln.ir.tensor` or `kiln.ir.graph` must be taught to the
walkers, structural equality, both backends, the interpreters and the printer;
this test names the table that misses it.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Iterable
from types import ModuleType

import pytest

from kiln.codegen.c import expr as c_expr
from kiln.codegen.c import kernel as c_kernel
from kiln.codegen.llvm import lower_to_llvm
from kiln.ir import _interp_compiler, printer, structural, visitor
from kiln.ir import graph as g
from kiln.ir import tensor as t

# `kiln.ir.evaluate` the attribute is the function; the module holds the graph interpreter.
graph_interpreter = importlib.import_module("kiln.ir.evaluate")


def _concrete(module: ModuleType, base: type) -> set[type]:
    return {c for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, base) and c is not base
            and dataclasses.is_dataclass(c)}


STMTS = _concrete(t, t.Stmt)
EXPRS = _concrete(t, t.PrimExpr)
GRAPH_EXPRS = _concrete(g, g.Expr)


def test_the_node_classes_are_found() -> None:
    assert {t.For, t.SeqStmt, t.Store, t.CallFunc} <= STMTS
    assert {t.Var, t.Load, t.BinaryOp, t.CallExtern} <= EXPRS
    assert {g.Var, g.Call, g.CallTensor, g.TupleGetItem} <= GRAPH_EXPRS


def _snake(cls: type) -> str:
    return "visit_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def _methods(walker: type) -> Callable[[], Iterable[type]]:
    """The node classes `walker` has a `visit_<node>` method for."""
    def handled() -> Iterable[type]:
        return {c for c in STMTS | EXPRS | GRAPH_EXPRS if hasattr(walker, _snake(c))}
    return handled


def _keys(table: dict[type, object]) -> Callable[[], Iterable[type]]:
    return lambda: set(table)


TABLES: list[tuple[str, Callable[[], Iterable[type]], set[type]]] = [
    ("visitor.StmtVisitor", _methods(visitor.StmtVisitor), STMTS),
    ("visitor.StmtMutator", _methods(visitor.StmtMutator), STMTS),
    ("visitor.StmtExprVisitor", _methods(visitor.StmtExprVisitor), STMTS | EXPRS),
    ("visitor.StmtExprMutator", _methods(visitor.StmtExprMutator), STMTS | EXPRS),
    ("visitor.GraphVisitor", _methods(visitor.GraphVisitor), GRAPH_EXPRS),
    ("visitor.GraphMutator", _methods(visitor.GraphMutator), GRAPH_EXPRS),
    ("structural equality", _keys(structural._DISPATCH), STMTS | EXPRS | GRAPH_EXPRS),
    ("C expression emitters", _keys(c_expr._EMITTERS), EXPRS),
    ("C statement emitters", _keys(c_kernel._STATEMENTS), STMTS),
    ("LLVM expression rules", _keys(lower_to_llvm.EXPR_RULES), EXPRS),
    ("LLVM statement rules", _keys(lower_to_llvm.STMT_RULES), STMTS),
    ("interpreter expressions", _keys(_interp_compiler._EXPR_RULES), EXPRS),
    ("interpreter statements", _keys(_interp_compiler._STMT_RULES), STMTS),
    ("graph interpreter", _keys(graph_interpreter._GRAPH_RULES), GRAPH_EXPRS),
    ("DSL printer expressions", _keys(printer._EXPR_RULES), EXPRS),
    ("DSL printer statements", _keys(printer._PrimPrinter._HANDLERS), STMTS),
    ("DSL printer graph expressions", _keys(printer._GRAPH_RULES), GRAPH_EXPRS),
]


@pytest.mark.parametrize(("name", "handled", "classes"), TABLES, ids=[n for n, _, _ in TABLES])
def test_every_node_class_has_a_handler(name: str, handled: Callable[[], Iterable[type]],
                                        classes: set[type]) -> None:
    missing = sorted(c.__name__ for c in classes - set(handled()))
    assert not missing, f"{name} has no handler for {missing}"


# Sorted by module and name: graph.Var and tensor.Var share a name, and every
# pytest-xdist worker must collect the same tests in the same order.
@pytest.mark.parametrize("cls", sorted(STMTS | EXPRS | GRAPH_EXPRS,
                                       key=lambda c: (c.__module__, c.__name__)),
                         ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_every_ir_field_is_a_child_or_a_plain_attribute(cls: type) -> None:
    """The walkers' derived child fields cover every field holding IR: a field left out
    holds plain data (names, ops, dtypes, arrays, types), never a node."""
    fields = visitor.child_fields(cls)
    walked = {name for name, _ in fields.walk}
    ir_words = re.compile(r"\b(Stmt|PrimExpr|Expr|Var|Buffer|Load|BinaryOp)\b")
    for f in dataclasses.fields(cls):
        mentions_ir = bool(ir_words.search(str(f.type)))
        assert (f.name in walked) == mentions_ir, (
            f"{cls.__name__}.{f.name}: annotated {f.type!r}, walked: {f.name in walked}")
