"""The decorators parse source files: @ir_module classes, @T.prim_func / @G.function."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from dsl_strict_equal import assert_roundtrip_equal

from kiln.errors import IRError
from kiln.ir import IRBuilder, TensorType, evaluate
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.script import G, I, ScriptError, T, from_source, ir_module, print_module
from kiln.script.decorators import DeferredFunction

N = 4  # a module-level constant the DSL below reads


@ir_module
class MyModule:
    @T.prim_func
    def add_one(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
        for i in T.serial(4):  # also T.parallel / T.vectorized / T.unrolled
            Y[i] = X[i] + T.float32(1)

    @G.function
    def main(x: G.Tensor((4,), "float32")) -> G.Tensor((4,), "float32"):
        y: G.Tensor((4,), "float32") = G.call_tensor("add_one", [x], G.Tensor((4,), "float32"))
        return y


def _hand_built() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        X = ib.arg("X", (4,), "float32")
        Y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(Y, [i], X[i] + t.Const(1.0, "float32"))
    with ib.function("main"):
        x = ib.param("x", TensorType((4,), "float32"))
        y = ib.emit(g.CallTensor("add_one", (x,), TensorType((4,), "float32")), "y")
        ib.ret(y)
    return ib.get()


def test_ir_module_class_equals_hand_built_ir() -> None:
    assert isinstance(MyModule, IRModule)
    assert list(MyModule) == ["add_one", "main"]
    assert_roundtrip_equal(MyModule, _hand_built(), names=True)
    assert_roundtrip_equal(from_source(MyModule.script()), MyModule, names=True)
    out = evaluate(MyModule, "main", np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(out, [1, 2, 3, 4])


def test_standalone_prim_func_is_a_one_function_module() -> None:
    @T.prim_func
    def scale(A: T.Buffer((N,), "float32"), B: T.Buffer((N,), "float32")):
        for i in T.serial(N):
            B[i] = A[i] * T.float32(2)

    assert isinstance(scale, IRModule) and list(scale) == ["scale"]
    assert scale["scale"].params[0].shape == (4,)  # type: ignore[union-attr]
    a, b = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    evaluate(scale, "scale", a, b)
    np.testing.assert_array_equal(b, a * 2)


def test_closure_values_arrays_and_meta_dict() -> None:
    rows, dtype = 2, "float32"
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    meta = {"bias": np.array([0.5, -0.5], np.float32)}

    @ir_module
    class Mod:
        @T.prim_func
        def k(X: T.Buffer((rows, 3), dtype), Y: T.Buffer((rows,), dtype)):
            W = T.alloc_const(weights)
            Bias = T.alloc_const(meta["bias"])
            for i in T.serial(rows):
                Y[i] = Bias[i]
                for j in T.serial(3):
                    Y[i] = Y[i] + W[i, j] * X[i, j]

        @G.function
        def main(x: G.Tensor((rows, 3), dtype)) -> G.Tensor((rows,), dtype):
            y: G.Tensor((rows,), dtype) = G.call_tensor("k", [x], G.Tensor((rows,), dtype))
            return y

    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(evaluate(Mod, "main", x), weights.sum(axis=1) + meta["bias"])
    text = print_module(Mod)
    assert_roundtrip_equal(from_source(text), Mod)


def test_explicit_metadata_argument() -> None:
    table = {"w": np.full((3,), 7, np.int32)}

    @G.function(metadata=table)
    def main() -> G.Tensor((3,), "int32"):
        return G.const(meta["w"])  # noqa: F821 (DSL name, never executed)

    np.testing.assert_array_equal(evaluate(main, "main"), [7, 7, 7])


def test_methods_defer_to_the_class_decorator() -> None:
    class Plain:
        @T.prim_func
        def f(X: T.Buffer((1,), "int64")):
            X[0] = 1

    assert isinstance(Plain.f, DeferredFunction)
    assert "awaiting @ir_module" in repr(Plain.f)
    with pytest.raises(IRError, match="decorate the class with @ir_module"):
        Plain.f()


def test_keyword_name_and_module_attrs_and_I_namespace() -> None:
    @I.ir_module
    class Mod:
        I.module_attrs({"origin": "test"})

        @T.prim_func(name="T_add")
        def add(A: T.Buffer((2,), "int32"), B: T.Buffer((2,), "int32")):
            T.func_attr({"fast": True})
            for i in T.vectorized(2):
                B[i] = A[i] + 1

    assert list(Mod) == ["T_add"] and dict(Mod.attrs) == {"origin": "test"}
    assert dict(Mod["T_add"].attrs) == {"fast": True}
    assert_roundtrip_equal(from_source(print_module(Mod)), Mod)


def test_decorator_errors_point_into_this_file() -> None:
    with pytest.raises(ScriptError) as info:
        @T.prim_func
        def broken(X: T.Buffer((4,), "float32")):
            for i in T.serial(4):
                X[i] = T.expp(X[i])

    line = inspect.currentframe().f_lineno - 2  # type: ignore[union-attr]
    err = info.value
    assert err.line == line
    assert err.col == 24
    assert __file__ in str(err) and "did you mean 'exp'?" in str(err)
    assert str(err).splitlines()[-2].strip() == "X[i] = T.expp(X[i])"


def test_decorators_need_source_and_the_right_object() -> None:
    namespace: dict[str, object] = {"T": T}
    with pytest.raises(IRError, match="cannot read the source"):
        exec("@T.prim_func\ndef f(X: T.Buffer((1,), 'int64')):\n    X[0] = 1\n", namespace)
    with pytest.raises(IRError, match="decorates a class"):
        ir_module(len)  # type: ignore[arg-type]
    with pytest.raises(IRError, match="decorates a function"):
        T.prim_func(len)
    with pytest.raises(IRError, match="is kiln DSL syntax"):
        T.serial(4)
    with pytest.raises(AttributeError, match="did you mean 'serial'"):
        T.serail  # noqa: B018


def test_namespace_objects_at_runtime() -> None:
    assert T.Buffer((2, 3), "int8").shape == (2, 3)
    assert G.Tensor((2,), "float32") == TensorType((2,), "float32")
    assert G.Tuple(G.Tensor((1,), "int8")).fields == (TensorType((1,), "int8"),)
    c = T.float32("inf")
    assert isinstance(c, t.Const) and c.value == float("inf") and c.dtype == "float32"
    with pytest.raises(IRError, match="unknown dtype"):
        T.Buffer((1,), "float31")


def test_namespaces_reached_through_a_module_attribute() -> None:
    import kiln.script as ks

    @ks.T.prim_func
    def f(X: ks.T.Buffer((1,), "int64")):
        X[0] = ks.T.int64(1)

    assert_roundtrip_equal(from_source(print_module(f)), f)
