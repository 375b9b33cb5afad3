"""structural_equal / assert_structural_equal: alpha-equivalence and mismatch messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln.ir import (
    IRBuilder,
    IRModule,
    TensorType,
    TupleType,
    assert_structural_equal,
    structural_equal,
)
from kiln.ir import graph as g
from kiln.ir import tensor as t


def add_module(value: float = 1.0, kind: str = "serial", dtype: str = "float32",
               attrs: dict[str, Any] | None = None) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one", attrs=attrs):
        X = ib.arg("X", (4,), dtype)
        Y = ib.arg("Y", (4,), dtype)
        with ib.for_range(4, name="i", kind=kind) as i:
            ib.store(Y, [i], X[i] + value)
    return ib.get()


def mismatch(a: object, b: object, **kwargs: Any) -> str:
    assert not structural_equal(a, b, **kwargs)
    with pytest.raises(AssertionError) as info:
        assert_structural_equal(a, b, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------- equal


def test_alpha_renaming_is_equal() -> None:
    a, b = add_module(), add_module()
    assert structural_equal(a, b)
    assert_structural_equal(a, b)
    # Different name hints, same structure.
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        P = ib.arg("P", (4,), "float32")
        Q = ib.arg("Q", (4,), "float32")
        with ib.for_range(4, name="k") as k:
            ib.store(Q, [k], P[k] + 1.0)
    assert structural_equal(a, ib.get())


def test_identical_objects_and_nan_constants() -> None:
    a = add_module(float("nan"))
    assert structural_equal(a, a)
    assert structural_equal(a, add_module(float("nan")))
    data = np.array([np.nan, 1.0], np.float32)
    assert structural_equal(g.Constant(data), g.Constant(data.copy()))


def test_free_vars_by_identity_unless_mapped() -> None:
    X, Y = t.Buffer("X", (4,), "float32"), t.Buffer("X", (4,), "float32")
    i, j = t.Var("i"), t.Var("i")
    assert structural_equal(t.Store(X, X[i], (i,)), t.Store(X, X[i], (i,)))
    message = mismatch(t.Store(X, X[i], (i,)), t.Store(Y, Y[j], (j,)))
    assert "Store.buffer" in message
    assert "free buffer 'X' is a different object on each side" in message
    assert structural_equal(t.Store(X, X[i], (i,)), t.Store(Y, Y[j], (j,)), map_free_vars=True)
    # Mapped free vars stay consistent: X->Y then X->X is a mismatch.
    assert not structural_equal(t.SeqStmt((t.Store(X, X[i], (i,)), t.Store(X, X[i], (i,)))),
                                t.SeqStmt((t.Store(Y, Y[j], (j,)), t.Store(X, X[j], (j,)))),
                                map_free_vars=True)


def test_bound_variables_map_by_position() -> None:
    def transpose(swap: bool) -> IRModule:
        ib = IRBuilder()
        with ib.prim_func("f"):
            X = ib.arg("X", (3, 3), "float32")
            Y = ib.arg("Y", (3, 3), "float32")
            with ib.for_range(3, name="i") as i, ib.for_range(3, name="j") as j:
                ib.store(Y, [i, j], X[j, i] if swap else X[i, j])
        return ib.get()

    message = mismatch(transpose(False), transpose(True))
    assert "at f.body.body.body.value.indices[0]: " in message
    assert "refers to a different binding on each side" in message
    assert "lhs: i" in message and "rhs: j" in message


def test_bijection_two_lhs_vars_one_rhs_var() -> None:
    X = t.Buffer("X", (4,), "float32")
    i, j, k = t.Var("i"), t.Var("j"), t.Var("k")
    lhs = t.For(i, t.const(0), t.const(4), "serial",
                t.For(j, t.const(0), t.const(4), "serial", t.Store(X, X[i], (j,))))
    rhs = t.For(k, t.const(0), t.const(4), "serial",
                t.For(k, t.const(0), t.const(4), "serial", t.Store(X, X[k], (k,))))
    assert not structural_equal(lhs, rhs)


def test_symbolic_shape_variables_are_bound_by_parameters() -> None:
    def build() -> IRModule:
        n = t.Var("n")
        ib = IRBuilder()
        with ib.prim_func("f"):
            X = ib.arg("X", (n, 2), "float32")
            Y = ib.arg("Y", (n, 2), "float32")
            with ib.for_range(n, name="i") as i:
                ib.store(Y, [i, 0], X[i, 1])
        return ib.get()

    assert structural_equal(build(), build())


# --------------------------------------------------------------------------- unequal


def test_different_constant_reports_path_and_both_sides() -> None:
    message = mismatch(add_module(1.0), add_module(2.0))
    assert message.startswith("structural mismatch at add_one.body.body.value.b: ")
    assert "constant values differ: 1.0 vs 2.0" in message
    assert "lhs: T.float32(1.0)" in message
    assert "rhs: T.float32(2.0)" in message
    assert "in lhs: Y[i] = X[i] + T.float32(1.0)" in message
    assert "in rhs: Y[i] = X[i] + T.float32(2.0)" in message


def test_different_dtype() -> None:
    message = mismatch(add_module(dtype="float32"), add_module(dtype="float64"))
    assert "add_one.params[0]" in message
    assert "buffer dtypes differ: 'float32' vs 'float64'" in message


def test_different_loop_kind() -> None:
    message = mismatch(add_module(kind="serial"), add_module(kind="parallel"))
    assert "at add_one.body.kind: loop kinds differ: 'serial' vs 'parallel'" in message
    assert "lhs: for i in T.serial(4): ..." in message
    assert "rhs: for i in T.parallel(4): ..." in message


def test_different_attr() -> None:
    message = mismatch(add_module(attrs={"tag": 1}), add_module(attrs={"tag": 2}))
    assert "add_one.attrs['tag']" in message
    assert "attribute 'tag' differs: 1 vs 2" in message
    assert not structural_equal(add_module(attrs={"tag": 1}), add_module(attrs={"tag": True}))
    message = mismatch(add_module(attrs={"a": 1}), add_module(attrs={"b": 1}))
    assert "attribute keys differ" in message


def test_different_function_names_and_counts() -> None:
    a = add_module()
    b = IRModule({"other": a["add_one"]})
    assert "function names differ" in mismatch(a, b)


def test_node_types_and_operators() -> None:
    x = t.Var("x", "float32")
    assert "operators differ: 'add' vs 'sub'" in mismatch(x + 1.0, x - 1.0)
    assert "node types differ: BinaryOp vs Var" in mismatch(x + 1.0, x)
    assert "intrinsics differ" in mismatch(t.Intrin("exp", (x,)), t.Intrin("log", (x,)))
    assert "cast dtypes differ" in mismatch(t.Cast("int32", x), t.Cast("int64", x))
    assert not structural_equal(t.const(0.0), t.const(-0.0))


def test_extern_and_call_func() -> None:
    X = t.Buffer("X", (4,), "float32")
    x = t.Var("x", "float32")
    libm = t.ExternDependency("libm", libs=("-lm",))
    e1 = t.CallExtern("expf", (x,), "float32", libm)
    assert structural_equal(e1, t.CallExtern("expf", (x,), "float32",
                                             t.ExternDependency("libm", libs=("-lm",))))
    assert "extern dependencies differ" in mismatch(e1, t.CallExtern("expf", (x,), "float32"))
    assert "callees differ" in mismatch(t.CallFunc("f", (X,)), t.CallFunc("g", (X,)))


def test_alloc_const_data() -> None:
    def build(data: np.ndarray) -> IRModule:
        ib = IRBuilder()
        with ib.prim_func("f"):
            Y = ib.arg("Y", (3,), "float32")
            with ib.alloc_const("W", data) as W, ib.for_range(3) as i:
                ib.store(Y, [i], W[i])
        return ib.get()

    base = np.array([1.0, 2.0, 3.0], np.float32)
    assert structural_equal(build(base), build(base.copy()))
    message = mismatch(build(base), build(np.array([1.0, 2.5, 3.0], np.float32)))
    assert "f.body.body[0].data" in message
    assert "constant data differ (first at flat index 1: " in message
    assert "constant dtypes differ" in mismatch(build(base), build(base.astype(np.float64)))


# --------------------------------------------------------------------------- graph level


def graph_module(const: np.ndarray, index: int = 0) -> IRModule:
    ty = TensorType((2,), "float32")
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", ty)
        c = ib.emit(g.Constant(const, "c"), "c")
        pair = ib.emit(g.Tuple((x, c)), "pair")
        y = ib.emit(g.TupleGetItem(pair, index), "y")
        z = ib.emit(g.CallTensor("k", (y, c), TupleType((ty, ty))), "z")
        ib.ret(g.Tuple((g.TupleGetItem(z, 1), x)))
    return ib.get()


def test_graph_functions() -> None:
    data = np.array([1.0, -0.0], np.float32)
    assert structural_equal(graph_module(data), graph_module(data.copy()))
    message = mismatch(graph_module(data), graph_module(np.array([1.0, 0.0], np.float32)))
    assert "main.bindings[0].value.data" in message
    assert ('in lhs: c: G.Tensor((2,), "float32") = G.const([1.0, -0.0], "float32", '
            'name="c")') in message
    assert ('in rhs: c: G.Tensor((2,), "float32") = G.const([1.0, 0.0], "float32", '
            'name="c")') in message
    message = mismatch(graph_module(data, 0), graph_module(data, 1))
    assert "main.bindings[2].value.index" in message


def test_graph_call_attrs_and_types() -> None:
    x = g.Var("x", TensorType((2, 3), "float32"))
    ty = TensorType((3, 2), "float32")
    a = g.Call("transpose", (x,), {"perm": (1, 0)}, ty)
    assert structural_equal(a, g.Call("transpose", (x,), {"perm": [1, 0]}, ty))
    message = mismatch(a, g.Call("transpose", (x,), {"perm": (0, 1)}, ty))
    assert "attrs['perm']" in message
    message = mismatch(a, g.Call("transpose", (x,), {"perm": (1, 0)},
                                 TensorType((3, 2), "float16")))
    assert "ret_type" in message and "tensor dtypes differ" in message
    assert structural_equal(TensorType((2,), "int8"), TensorType((2,), "int8"))
    assert not structural_equal(TupleType((ty,)), TupleType((ty, ty)))
