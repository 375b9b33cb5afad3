"""LowerGraphToTensor: the lowered function's ABI shape, direct writes, copies, errors."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from kiln.codegen.naming import function_signature
from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.types import TensorType, TupleType
from kiln.ir.visitor import iter_stmts
from kiln.transform import LowerGraphToTensor
from support import ir_samples
from support.ir_samples import F32, N, call

HAVE_EVALUATE = importlib.util.find_spec("kiln.ir.evaluate") is not None
needs_evaluate = pytest.mark.skipif(not HAVE_EVALUATE, reason="kiln.ir.evaluate not written yet")


def _lower(mod: IRModule, **options: object) -> IRModule:
    return LowerGraphToTensor(**options)(mod)  # type: ignore[arg-type]


def _stmts(fn: t.PrimFunc, kind: type) -> list:
    return [s for s in iter_stmts(fn.body) if isinstance(s, kind)]


def test_chain_signature_attrs_and_direct_output() -> None:
    lowered = _lower(ir_samples.chain_module())
    fn = lowered["main"]
    assert isinstance(fn, t.PrimFunc)
    assert [p.name for p in fn.params] == ["x", "y", "out0"]
    assert fn.attrs["kiln.graph"] is True
    assert fn.attrs["kiln.num_outputs"] == 1
    assert fn.attrs["kiln.tuple_result"] is False
    assert fn.attrs["kiln.output_names"] == ("out0",)
    calls = _stmts(fn, t.CallFunc)
    assert [c.func for c in calls] == ["add", "scale2", "mul", "square", "add"]
    # The last call writes straight into the output parameter: no copy loop.
    assert calls[-1].args[-1] is fn.params[-1]
    assert not _stmts(fn, t.For)
    # Two constants, embedded read-only.
    consts = _stmts(fn, t.AllocConst)
    assert [c.buffer.name for c in consts] == ["weight", "bias"]
    np.testing.assert_array_equal(consts[0].data, ir_samples.WEIGHT)
    # Four f32[8] intermediates in a chain: two 64-byte slots suffice.
    assert fn.attrs["kiln.workspace_bytes"] == 128
    (arena,) = _stmts(fn, t.Allocate)
    assert arena.buffer.dtype == "uint8" and arena.buffer.shape == (128,)
    assert arena.buffer.scope == "global"
    views = {d.buffer.name: d.byte_offset for d in _stmts(fn, t.DeclBuffer)}
    assert views == {"a": 0, "b": 64, "c": 0, "d": 64}
    sig = function_signature("main", fn, "kiln_")
    assert sig["kind"] == "graph"
    assert [p["name"] for p in sig["params"]] == ["x", "y"]
    assert sig["results"] == [{"name": "out0", "kind": "tensor", "shape": [N],
                               "dtype": "float32"}]


def test_kernels_are_untouched() -> None:
    mod = ir_samples.chain_module()
    lowered = _lower(mod)
    for name in ("add", "mul", "scale2", "square", "neg"):
        assert lowered[name] is mod[name]


def test_tuple_result_copies_params_constants_and_duplicates() -> None:
    fn = _lower(ir_samples.tuple_module())["main"]
    assert isinstance(fn, t.PrimFunc)
    assert [p.name for p in fn.params] == ["x", "n1", "ident", "n2", "w", "s"]
    assert fn.attrs["kiln.num_outputs"] == 5
    assert fn.attrs["kiln.tuple_result"] is True
    assert fn.attrs["kiln.output_names"] == ("n1", "ident", "n2", "w", "s")
    assert "output_names" not in fn.attrs
    calls = _stmts(fn, t.CallFunc)
    params = {p.name: p for p in fn.params}
    assert [(c.func, c.args[-1].name) for c in calls] == [("neg", "n1"), ("scale2", "s")]
    # Copies: x -> ident, n1 -> n2 (the same value returned twice), W -> w.
    stores = _stmts(fn, t.Store)
    copies = {(s.buffer.name, s.value.buffer.name) for s in stores}
    assert copies == {("ident", "x"), ("n2", "n1"), ("w", "w")}
    assert params["n2"] in {s.buffer for s in stores}
    # Nothing lives in a workspace.
    assert fn.attrs["kiln.workspace_bytes"] == 0
    assert not _stmts(fn, t.Allocate)


def test_multi_output_kernel_and_tuple_get_item() -> None:
    fn = _lower(ir_samples.multi_output_module())["main"]
    calls = _stmts(fn, t.CallFunc)
    assert [c.func for c in calls] == ["split2", "add"]
    split, add = calls
    out0, out1 = fn.params[-2:]
    # `hi` is returned: split2 writes it straight into out1; `lo` is a workspace view.
    assert split.args[2] is out1
    assert add.args[2] is out0
    assert add.args[1] is out1
    (view,) = _stmts(fn, t.DeclBuffer)
    assert split.args[1] is view.buffer
    assert fn.attrs["kiln.workspace_bytes"] == 64


def test_result_that_is_only_a_param() -> None:
    ib = IRBuilder()
    with ib.function("identity"):
        x = ib.param("x", TensorType((2, 3), "int32"))
        ib.ret(x)
    fn = _lower(ib.get())["identity"]
    loops = _stmts(fn, t.For)
    assert [int(lp.extent.value) for lp in loops] == [2, 3]
    (store,) = _stmts(fn, t.Store)
    assert store.buffer is fn.params[1] and store.value.buffer is fn.params[0]


def test_zero_dim_constant_result() -> None:
    ib = IRBuilder()
    with ib.function("k"):
        ib.ret(g.Constant(np.array(3.5, dtype=np.float64), "c"))
    fn = _lower(ib.get())["k"]
    assert [p.shape for p in fn.params] == [()]
    (store,) = _stmts(fn, t.Store)
    assert store.indices == ()


def test_dead_value_still_gets_workspace() -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.emit(call("neg", x), "unused")
        y = ib.emit(call("scale2", x), "y")
        ib.ret(y)
    fn = _lower(ib.get())["main"]
    assert [c.func for c in _stmts(fn, t.CallFunc)] == ["neg", "scale2"]
    assert fn.attrs["kiln.workspace_bytes"] == 64


def test_alignment_option() -> None:
    fn = _lower(ir_samples.chain_module(), alignment=256)["main"]
    views = {d.buffer.name: d.byte_offset for d in _stmts(fn, t.DeclBuffer)}
    assert views == {"a": 0, "b": 256, "c": 0, "d": 256}
    assert fn.attrs["kiln.workspace_bytes"] == 512


def test_output_names_must_match_results() -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    with ib.function("main", attrs={"output_names": ("a", "b")}):
        x = ib.param("x", F32)
        ib.ret(ib.emit(call("neg", x), "y"))
    with pytest.raises(CompileError, match="must list 1 non-empty name"):
        _lower(ib.get())


def test_unlegalized_call_is_rejected() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.ret(ib.emit(g.Call("relu", (x,), {}, F32), "y"))
    with pytest.raises(CompileError, match=r"still calls operator 'relu'.*LegalizeOps"):
        _lower(ib.get())


@pytest.mark.parametrize(("kernel", "args", "ty", "message"), [
    ("nope", 1, F32, "no such function in the module"),
    ("add", 1, F32, "takes 3 parameters but the call passes 1 inputs"),
    ("neg", 1, TensorType((N,), "float64"), "parameter 1 'out' is \\[8\\] float32 but the "
                                            "output passed is \\[8\\] float64"),
])
def test_bad_call_tensor(kernel: str, args: int, ty: TensorType, message: str) -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.ret(ib.emit(call(kernel, *([x] * args), ty=ty), "y"))
    with pytest.raises(CompileError, match=message):
        _lower(ib.get())


def test_call_into_graph_function_and_scalar_param_rejected() -> None:
    ib = IRBuilder()
    with ib.prim_func("scaled"):
        x, o = ib.arg("x", (N,), "float32"), ib.arg("o", (N,), "float32")
        s = ib.scalar_arg("s", "float32")
        with ib.for_range(N) as i:
            ib.store(o, [i], x[i] * s)
    with ib.function("helper"):
        ib.ret(ib.param("x", F32))
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.ret(ib.emit(call("helper", x), "y"))
    with ib.function("main2"):
        x = ib.param("x", F32)
        ib.ret(ib.emit(call("scaled", x, x), "y"))
    mod = ib.get()
    with pytest.raises(CompileError, match="'helper' is a graph function, not a PrimFunc"):
        _lower(mod.without("main2"))
    with pytest.raises(CompileError, match="parameter 2 's' is a scalar"):
        _lower(mod.without("main"))


def test_unbound_variable_and_tuple_param() -> None:
    stray = g.Var("stray", F32)
    fn = g.Function((g.Var("x", F32),), (), stray)
    with pytest.raises(CompileError, match="uses variable 'stray' before it is bound"):
        _lower(IRModule({"main": fn}))
    tup = g.Function((g.Var("t", TupleType((F32, F32))),), (), g.Constant(np.zeros(2)))
    with pytest.raises(CompileError, match=r"parameter 't' is a tuple .* separate parameters"):
        _lower(IRModule({"main": tup}))


# ----------------------------------------------------------------- numerics

@needs_evaluate
@pytest.mark.parametrize(("build", "ref", "n_in"), [
    (ir_samples.chain_module, ir_samples.chain_reference, 2),
    (ir_samples.tuple_module, ir_samples.tuple_reference, 1),
    (ir_samples.multi_output_module, ir_samples.multi_output_reference, 1),
])
def test_lowered_matches_graph_reference(build, ref, n_in) -> None:  # type: ignore[no-untyped-def]
    from kiln import evaluate  # the graph-level run needs kiln's operators

    mod = build()
    lowered = _lower(mod)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(N).astype(np.float32) for _ in range(n_in)]
    fn = lowered["main"]
    outs = [np.full(p.shape, np.nan, dtype=p.dtype)
            for p in fn.params[len(inputs):]]
    evaluate(lowered, "main", *inputs, *outs)
    expected = ref(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(outs, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # The graph-level interpretation of the unlowered module agrees too.
    graph_out = evaluate(mod, "main", *inputs)
    graph_out = graph_out if isinstance(graph_out, tuple) else (graph_out,)
    for got, want in zip(graph_out, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
