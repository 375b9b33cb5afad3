"""kiln.compile and Executable: targets, pipelines, metadata, the python backend, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kiln
import kiln.ops
from kiln.driver import Executable, executable_metadata
from kiln.errors import CompileError, ExportError, IRError, KilnError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.target import Target
from kiln.transform import PassContext, TimingInstrument
from support import ir_samples
from support.ir_samples import F32, N, call


def test_python_backend_runs_graph_and_kernels() -> None:
    ex = kiln.compile(ir_samples.chain_module(), "python")
    assert isinstance(ex, Executable)
    assert ex.target == Target("python")
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(ex["main"](x, y), ir_samples.chain_reference(x, y), rtol=1e-6)
    np.testing.assert_allclose(ex(x, y=y), ir_samples.chain_reference(x, y), rtol=1e-6)
    out = np.empty(N, np.float32)
    ex["add"](x, y, out)
    np.testing.assert_array_equal(out, x + y)
    assert ex.jit() is ex.jit()
    assert ex.jit(force_recompile=True) is not None
    assert ex.jit().kind == "host"


def test_python_backend_tuple_results_and_out() -> None:
    ex = kiln.compile(ir_samples.tuple_module(), "python")
    x = np.arange(N, dtype=np.float32)
    got = ex["main"](x)
    assert isinstance(got, tuple) and len(got) == 5
    for a, b in zip(got, ir_samples.tuple_reference(x)):
        np.testing.assert_array_equal(a, b)
    outs = tuple(np.zeros(N, np.float32) for _ in range(5))
    assert ex["main"](x, out=outs) is outs
    np.testing.assert_array_equal(outs[4], x * 2)


@pytest.mark.parametrize(("args", "message"), [
    ((np.zeros(N, np.float32),), "main: missing argument 1 'y'"),
    ((np.zeros(N, np.float32),) * 3, "main: expected 2 arguments, got 3"),
    ((np.zeros(N, np.float64), np.zeros(N, np.float32)),
     "main: argument 0 'x': expected dtype float32, got float64"),
    ((np.zeros(N, np.float32), np.zeros(N + 1, np.float32)),
     r"main: argument 1 'y': expected shape \[8\], got \[9\]"),
    ((np.zeros(2 * N, np.float32)[::2], np.zeros(N, np.float32)),
     "main: argument 0 'x': expected a contiguous tensor"),
])
def test_python_backend_checks_arguments_like_native(args: tuple, message: str) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "python")
    with pytest.raises(KilnError, match=message):
        ex["main"](*args)


def test_python_backend_scalar_params() -> None:
    ib = IRBuilder()
    with ib.prim_func("axpy"):
        x, o = ib.arg("x", (4,), "float32"), ib.arg("o", (4,), "float32")
        a = ib.scalar_arg("a", "float32")
        k = ib.scalar_arg("k", "int32")
        with ib.for_range(4) as i:
            ib.store(o, [i], x[i] * a + k.astype("float32"))
    ex = kiln.compile(ib.get(), "python")
    x, o = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    ex["axpy"](x, o, 2.5, 3)
    np.testing.assert_allclose(o, x * 2.5 + 3)
    with pytest.raises(KilnError, match="argument 3 'k': value 4294967296 out of range"):
        ex["axpy"](x, o, 1.0, 2**32)
    with pytest.raises(KilnError, match="argument 3 'k': expected an integer scalar"):
        ex["axpy"](x, o, 1.0, 1.5)


def test_exporting_python_backend_raises_export_error(tmp_path: Path) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "python")
    for name in ("lib.so", "lib.tar"):
        with pytest.raises(ExportError, match="lives in memory"):
            ex.export_library(tmp_path / name)
    assert not (tmp_path / "lib.so").exists()


def test_metadata_lists_functions_and_workspace() -> None:
    ex = kiln.compile(ir_samples.chain_module(), "python", system_lib_prefix="net_")
    meta = ex.metadata
    assert meta["format"] == "kiln.library" and meta["prefix"] == "net_"
    assert meta["functions"]["main"]["symbol"] == "net_main"
    assert meta["workspace_bytes"] == {"main": 128}
    assert ex.ir["main"].attrs["kiln.workspace_bytes"] == 128
    assert ex.function_names() == ["add", "mul", "scale2", "neg", "square", "main"]
    text = ex.inspect()
    assert "main(x: float32[8], y: float32[8]) -> out0: float32[8]" in text
    assert "[workspace 128 bytes]" in text and "module.kir" in text
    assert "python" in repr(ex)


def test_legalized_ops_compile_and_run() -> None:
    ib = IRBuilder()
    with ib.function("main", attrs={"output_names": ("prob",)}):
        x = ib.param("x", (2, 4), "float32")
        w = g.Constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
        h = ib.emit(kiln.ops.call("matmul", x, w), "h")
        r = ib.emit(kiln.ops.call("relu", h), "r")
        ib.ret(ib.emit(kiln.ops.call("softmax", r, axis=-1), "p"))
    ex = kiln.compile(ib.get(), "python")
    assert ex.metadata["functions"]["main"]["results"][0]["name"] == "prob"
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    h = np.maximum(x @ np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), 0)
    e = np.exp(h - h.max(-1, keepdims=True))
    np.testing.assert_allclose(ex(x), e / e.sum(-1, keepdims=True), rtol=1e-5)
    # matmul (on the packed GEMM kernel) + relu fuse into one kernel; softmax stays alone
    assert set(ex.function_names()) >= {"main", "fused_matmul_packed_relu", "softmax"}


def test_unknown_op_fails_at_compile_with_all_names() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", F32)
        a = ib.emit(g.Call("mystery", (x,), {}, F32), "a")
        ib.ret(ib.emit(g.Call("mystery2", (a,), {}, F32), "b"))
    with pytest.raises(CompileError, match=r"mystery \(x1\), mystery2 \(x1\)"):
        kiln.compile(ib.get(), "python")


def test_pipelines_none_and_custom() -> None:
    mod = ir_samples.chain_module()
    with pytest.raises(CompileError, match=r"\['main'\] were not lowered"):
        kiln.compile(mod, "c", graph_pipeline=None)
    # The python backend runs unlowered graph functions at graph level.
    graph_level = kiln.compile(mod, "python", graph_pipeline=None)
    x = np.arange(N, dtype=np.float32)
    np.testing.assert_allclose(graph_level(x, x), ir_samples.chain_reference(x, x), rtol=1e-6)
    tup = kiln.compile(ir_samples.tuple_module(), "python", graph_pipeline=None)
    for a, b in zip(tup(x), ir_samples.tuple_reference(x)):
        np.testing.assert_array_equal(a, b)
    seen: list[str] = []

    def custom(m: IRModule) -> IRModule:
        seen.append(",".join(sorted(m)))
        return m

    ex = kiln.compile(mod, "python", tensor_pipeline=custom)
    assert seen == ["add,main,mul,neg,scale2,square"]
    assert isinstance(ex.ir["main"], t.PrimFunc)
    ex2 = kiln.compile(mod, "python", graph_pipeline="legalize-ops,lower-graph-to-tensor",
                       tensor_pipeline=None)
    assert ex2.ir["main"].attrs["kiln.graph"] is True


def test_passes_run_under_the_current_context_and_target() -> None:
    timing = TimingInstrument()
    seen: list[Target | None] = []

    def probe(m: IRModule) -> IRModule:
        seen.append(Target.current())
        return m

    with PassContext(instruments=[timing]):
        kiln.compile(ir_samples.chain_module(), "python", tensor_pipeline=probe)
    assert [x.name for x in timing.timings if x.depth == 0] == ["graph-default", "probe"]
    assert seen == [Target("python")]


def test_lone_function_becomes_main() -> None:
    mod = ir_samples.chain_module()
    ex = kiln.compile(mod["scale2"], "python")
    assert ex.function_names() == ["main"]
    x, o = np.ones(N, np.float32), np.zeros(N, np.float32)
    ex(x, o)
    np.testing.assert_array_equal(o, 2 * x)
    with pytest.raises(CompileError, match="expects an IRModule"):
        kiln.compile(42, "python")
    with pytest.raises(kiln.FrontendError, match="does not exist"):
        kiln.compile("no-such-model.onnx", "python")


def test_target_selection() -> None:
    mod = ir_samples.chain_module()
    with Target("python"):
        assert kiln.compile(mod).target.kind.name == "python"
    assert kiln.compile(mod, {"kind": "python"}).target.kind.name == "python"
    tagged = mod.with_function("main", mod["main"].with_attrs(target="python"))
    assert kiln.compile(tagged).target.kind.name == "python"
    with pytest.raises(CompileError, match=r"has target attribute .* but kiln.compile was "
                                           "asked for"):
        kiln.compile(tagged, "c")
    mixed = tagged.with_function("add", mod["add"].with_attrs(target="c"))
    with pytest.raises(CompileError, match=r"different targets \(add -> c, main -> python\)"):
        kiln.compile(mixed)
    # Composite targets split the module (tests/driver/test_split_targets.py); a device
    # kind without a code generator is named before any pass runs.
    with pytest.raises(CompileError, match="target kind 'vulkan' has no code generator"):
        kiln.compile(mod, {"kind": "composite", "devices": ["c", "vulkan"], "host": "llvm"})
    with pytest.raises(kiln.TargetError, match="unknown target kind"):
        kiln.compile(mod, "pythno")


def test_default_target_is_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Target, "from_host", staticmethod(lambda: Target("python")))
    assert kiln.compile(ir_samples.chain_module()).target == Target("python")


def test_invalid_ir_is_rejected_before_passes() -> None:
    ib = IRBuilder()
    with ib.prim_func("bad"):
        x = ib.arg("x", (4,), "float32")
        stray = t.Var("stray")
        ib.store(x, [stray], 1.0)
    with pytest.raises(IRError, match="the input module is not valid IR"):
        kiln.compile(ib.get(), "python")


def test_pass_that_breaks_ir_is_caught_after_pipelines() -> None:
    def vandal(m: IRModule) -> IRModule:
        fn = m["add"]
        return m.with_function("add", fn.with_body(t.Store(
            fn.params[2], t.Load(fn.params[0], (t.Var("ghost"),)), (t.Const(0, "int64"),))))

    with pytest.raises(IRError, match="after the graph and tensor pipelines is not valid IR"):
        kiln.compile(ir_samples.chain_module(), "python", tensor_pipeline=vandal)


def test_executable_metadata_for_unlowered_graph_functions() -> None:
    mod = ir_samples.chain_module()
    meta = executable_metadata(mod, "kiln_")
    assert "main" not in meta["functions"] and "add" in meta["functions"]
    ext = meta["external_functions"]["main"]
    assert ext["kind"] == "graph" and [p["name"] for p in ext["params"]] == ["x", "y"]
    assert ext["results"] == [{"name": "out0", "kind": "tensor", "shape": [N],
                               "dtype": "float32"}]


def test_call_tensor_graph_with_dead_binding_is_cleaned() -> None:
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    with ib.function("main"):
        x = ib.param("x", F32)
        ib.emit(call("neg", x), "dead")
        ib.ret(ib.emit(call("scale2", x), "y"))
    ex = kiln.compile(ib.get(), "python")
    body_calls = [s.func for s in _iter_calls(ex.ir["main"].body)]
    assert body_calls == ["scale2"]
    assert ex.metadata["workspace_bytes"] == {"main": 0}


def _iter_calls(stmt: t.Stmt) -> list[t.CallFunc]:
    from kiln.ir.visitor import iter_stmts

    return [s for s in iter_stmts(stmt) if isinstance(s, t.CallFunc)]


def test_llvm_asks_for_the_cpu_features_beside_the_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kiln.codegen.prepare: the llvm codegen's probe of the CPU features the code may use
    (MachineConfig.to_json) starts on a thread of its own before the graph pipeline runs;
    code generation waits for it and finds the answer."""
    import threading

    import kiln.codegen.llvm.codegen as llvm_codegen
    from kiln.codegen.llvm.target_machine import MachineConfig, machine_config

    callers: list[str] = []
    to_json = MachineConfig.to_json
    monkeypatch.setattr(MachineConfig, "to_json", lambda self: callers.append(
        threading.current_thread().name) or to_json(self))
    seen: list[list[str]] = []

    def graph(mod: IRModule) -> IRModule:
        llvm_codegen._wait_for_prepare("kiln_", machine_config(Target("llvm")))
        seen.append(list(callers))
        raise RuntimeError("stop: the passes were reached")

    with pytest.raises(RuntimeError, match="stop"):
        kiln.compile(ir_samples.chain_module(), "llvm", graph_pipeline=graph)
    assert seen == [["kiln-prepare-llvm"]]
