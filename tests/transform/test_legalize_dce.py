"""LegalizeOps (operator calls -> PrimFuncs) and DeadCodeElimination."""

from __future__ import annotations

import numpy as np
import pytest

import kiln.ops
from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.transform import ATTR_PRIVATE, DeadCodeElimination, LegalizeOps
from kiln.transform.legalize_ops import find_legalizer
from support import ir_samples
from support.ir_samples import F32, call


def _op_module(ops: list[str]) -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", F32)
        v: g.Expr = x
        for i, op in enumerate(ops):
            v = ib.emit(g.Call(op, (v,), {}, F32), f"v{i}")
        ib.ret(v)
    return ib.get()


def test_unknown_ops_are_all_listed_with_counts() -> None:
    mod = _op_module(["frobnicate", "relu", "frobnicate", "twiddle"])
    with pytest.raises(CompileError) as info:
        LegalizeOps()(mod)
    text = str(info.value)
    assert "cannot legalize 3 operator call(s) of 2 operator(s)" in text
    assert "frobnicate (x2), twiddle (x1)" in text
    assert "relu" not in text  # kiln.ops knows relu


def test_legalize_with_real_ops_shares_kernels() -> None:
    mod = _op_module(["relu", "exp", "relu"])
    out = LegalizeOps()(mod)
    main = out["main"]
    assert isinstance(main, g.Function)
    calls = [b.value for b in main.bindings]
    assert all(isinstance(c, g.CallTensor) for c in calls)
    names = [c.func for c in calls]  # type: ignore[union-attr]
    assert names[0] == names[2] and names[0] != names[1]
    for name in set(names):
        fn = out[name]
        assert isinstance(fn, t.PrimFunc) and fn.attrs[ATTR_PRIVATE] is True
        assert len(fn.params) == 2
    assert set(out) == {"main", *names}


def test_legalized_names_avoid_existing_functions() -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib, names=("neg",))
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.ret(ib.emit(g.Call("mine", (x,), {"k": 1}, F32), "y"))
    mod = ib.get()
    kernel = mod["neg"]

    class Op:
        def legalize(self, c: g.Call) -> tuple[t.PrimFunc, str]:
            assert c.attrs["k"] == 1
            return kernel, "neg"  # type: ignore[return-value]

    # The pass takes its operators from the op resolver it is given.
    out = LegalizeOps(ops=lambda name: Op())(mod)
    main = out["main"]
    assert main.bindings[0].value.func == "neg_1"  # type: ignore[union-attr]
    assert out["neg"] is kernel


def test_bad_legalize_rule() -> None:
    class Op:
        def legalize(self, c: g.Call) -> object:
            return "not a function"

    with pytest.raises(CompileError, match="legalize rule of operator 'mine' returned"):
        LegalizeOps(ops=lambda name: Op())(_op_module(["mine"]))
    # kiln.ops itself has no operator 'mine'.
    with pytest.raises(CompileError, match=r"mine \(x1\)"):
        LegalizeOps()(_op_module(["mine"]))


def test_no_calls_means_same_module() -> None:
    mod = ir_samples.chain_module()
    assert LegalizeOps()(mod) is mod
    assert find_legalizer("definitely-not-an-op") is None


def test_dce_removes_dead_bindings_and_private_functions() -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    with ib.prim_func("helper", attrs={ATTR_PRIVATE: True}):
        x = ib.arg("x", (8,), "float32")
        with ib.for_range(8) as i:
            ib.store(x, [i], 0.0)
    with ib.prim_func("used_helper", attrs={ATTR_PRIVATE: True}):
        x, o = ib.arg("x", (8,), "float32"), ib.arg("o", (8,), "float32")
        with ib.for_range(8) as i:
            ib.store(o, [i], x[i])
    with ib.function("main"):
        x = ib.param("x", F32)
        dead = ib.emit(call("neg", x), "dead")
        ib.emit(call("add", dead, dead), "dead2")
        live = ib.emit(call("used_helper", x), "live")
        ib.emit(g.Tuple((live, x)), "unused_tuple")
        ib.ret(live)
    mod = ib.get()
    out = DeadCodeElimination()(mod)
    main = out["main"]
    assert [b.var.name for b in main.bindings] == ["live"]  # type: ignore[union-attr]
    assert "helper" not in out and "used_helper" in out
    # Public kernels stay even when unused: every public function keeps its name.
    assert {"add", "neg", "mul", "scale2", "square"} <= set(out)
    assert DeadCodeElimination()(out) is out
    only_functions = DeadCodeElimination(bindings=False)(mod)
    assert len(only_functions["main"].bindings) == 4  # type: ignore[union-attr]
    assert "helper" not in only_functions


def test_dce_keeps_private_function_reached_through_callfunc() -> None:
    ib = IRBuilder()
    with ib.prim_func("inner", attrs={ATTR_PRIVATE: True}):
        ib.arg("x", (1,), "int32")
        ib.evaluate(t.Const(0, "int32"))
    with ib.prim_func("outer"):
        x = ib.arg("x", (1,), "int32")
        ib.call_func("inner", [x])
    mod = ib.get()
    assert DeadCodeElimination()(mod) is mod


def test_graph_default_pipeline_legalizes_and_lowers_ops() -> None:
    from kiln.transform import get_pipeline

    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", F32)
        a = ib.emit(kiln.ops.call("relu", x), "a")
        ib.emit(kiln.ops.call("exp", x), "dead")
        b = ib.emit(kiln.ops.call("add", a, g.Constant(np.ones(8, np.float32), "one")), "b")
        ib.ret(b)
    out = get_pipeline("default", "graph")(ib.get())
    assert not out.graph_funcs()
    assert set(out) == {"main", "relu", "add"}
    main = out["main"]
    assert isinstance(main, t.PrimFunc)
    assert main.attrs["kiln.graph"] is True
