"""The pass framework: passes, Sequential, PassContext, instruments, registry, pipelines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln.errors import CompileError
from kiln.ir import IRModule
from kiln.ir.tensor import PrimFunc
from kiln.target import Target, TargetKind, register_kind, unregister_kind
from kiln.transform import (
    DeadCodeElimination,
    DumpIRInstrument,
    FunctionPass,
    LegalizeOps,
    LowerGraphToTensor,
    Pass,
    PassContext,
    PassInstrument,
    Sequential,
    Simplify,
    TimingInstrument,
    function_pass,
    get_pass,
    get_pipeline,
    list_passes,
    parse_passes,
    register_pass,
    register_pipeline,
)
from kiln.transform.registry import PASSES
from support import ir_samples


@dataclass(frozen=True)
class TagPass(FunctionPass):
    """Adds attribute `key`=`value` to every PrimFunc."""

    name = "test-tag"
    level = "tensor"
    key: str = "tagged"
    value: int = 1

    def run_on_function(self, func: PrimFunc, name: str, mod: IRModule) -> PrimFunc:
        return func.with_attrs(**{self.key: self.value})


def _module() -> IRModule:
    return ir_samples.chain_module()


def test_function_pass_touches_only_its_level() -> None:
    mod = _module()
    out = TagPass(value=7)(mod)
    assert out is not mod
    for name, fn in out.items():
        if isinstance(fn, PrimFunc):
            assert fn.attrs["tagged"] == 7
        else:
            assert fn is mod[name]  # graph function untouched


def test_unchanged_function_pass_returns_same_module() -> None:
    @function_pass("noop", level="all")
    def noop(func: Any, name: str, mod: IRModule) -> Any:
        return func

    mod = _module()
    assert noop(mod) is mod


def test_pass_options_and_repr() -> None:
    p = TagPass(key="k", value=3)
    assert p.options() == {"key": "k", "value": 3}
    assert repr(p) == "TagPass(key='k', value=3)"
    assert TagPass(key="k", value=3) == p


def test_sequential_runs_in_order_and_nests() -> None:
    seen: list[str] = []

    def step(tag: str) -> Any:
        def fn(mod: IRModule) -> IRModule:
            seen.append(tag)
            return mod
        fn.__name__ = tag
        return fn

    seq = Sequential([step("a"), Sequential([step("b"), step("c")], name="inner"), step("d")])
    seq(_module())
    assert seen == ["a", "b", "c", "d"]
    assert Sequential([])(_module()) is not None


def test_pass_must_return_a_module() -> None:
    bad = Sequential([lambda mod: None], name="bad")  # type: ignore[arg-type, return-value]
    with pytest.raises(CompileError, match="must return an IRModule"):
        bad(_module())


def test_unexpected_exception_is_wrapped_with_pass_name() -> None:
    class Boom(Pass):
        name = "boom"

        def run(self, mod: IRModule) -> IRModule:
            raise ZeroDivisionError("oops")

    with pytest.raises(CompileError, match="pass 'boom' failed: ZeroDivisionError: oops"):
        Boom()(_module())


def test_disabled_pass_is_skipped() -> None:
    mod = _module()
    with PassContext(disabled_passes=["test-tag"]):
        assert TagPass()(mod) is mod
    assert TagPass()(mod) is not mod


def test_pass_context_nests_and_current() -> None:
    outer = PassContext(config={"a": 1})
    inner = PassContext(config={"a": 2})
    base = PassContext.current()
    with outer:
        assert PassContext.current() is outer
        with inner:
            assert PassContext.current().config["a"] == 2
        assert PassContext.current() is outer
    assert PassContext.current() is base


def test_instrument_hooks_order_and_should_run() -> None:
    events: list[str] = []

    class Recorder(PassInstrument):
        def enter_pass_ctx(self) -> None:
            events.append("enter")

        def exit_pass_ctx(self) -> None:
            events.append("exit")

        def should_run(self, mod: IRModule, p: Pass) -> bool:
            return p.name != "simplify"

        def run_before_pass(self, mod: IRModule, p: Pass) -> None:
            events.append(f"before {p.name}")

        def run_after_pass(self, mod: IRModule, p: Pass) -> None:
            events.append(f"after {p.name}")

    with PassContext(instruments=[Recorder()]):
        Sequential([TagPass(), Simplify()], name="s")(_module())
    assert events == ["enter", "before s", "before test-tag", "after test-tag", "after s", "exit"]


def test_timing_instrument_reports_nested_passes() -> None:
    timing = TimingInstrument()
    with PassContext(instruments=[timing]):
        get_pipeline("default", "graph")(_module())
    names = [t.name for t in timing.timings]
    assert names == ["graph-default", "quantize-ops", "quant-layout", "quant-residual",
                     "fold-constants",
                     "recognize-composites", "fold-batchnorm", "merge-copies",
                     "pool-before-pointwise", "block-convolutions", "nchwc-layout",
                     "block-matmuls", "block-attention", "last-position", "fuse-ops",
                     "legalize-ops", "dead-code-elimination", "lower-graph-to-tensor"]
    assert [t.depth for t in timing.timings] == [0] + [1] * 17
    assert all(t.seconds >= 0 for t in timing.timings)
    assert timing.total() == timing.timings[0].seconds
    report = timing.report().splitlines()
    assert report[0].split() == ["pass", "ms", "%"]
    assert report[2].startswith("  quantize-ops")
    assert report[-1].startswith("total")


def test_dump_ir_to_directory_and_callback(tmp_path: Path) -> None:
    dump = DumpIRInstrument(tmp_path / "dumps")
    texts: list[tuple[str, str]] = []
    cb = DumpIRInstrument(lambda name, text: texts.append((name, text)))
    with PassContext(instruments=[dump, cb]):
        get_pipeline("default", "graph")(_module())
    files = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    passes = ["quantize-ops", "quant-layout", "quant-residual", "fold-constants",
              "recognize-composites",
              "fold-batchnorm", "merge-copies", "pool-before-pointwise", "block-convolutions",
              "nchwc-layout", "block-matmuls", "block-attention", "last-position", "fuse-ops",
              "legalize-ops", "dead-code-elimination", "lower-graph-to-tensor"]
    assert files == [f"{i:03d}_{name}.py" for i, name in enumerate(passes)]
    assert [n for n, _ in texts] == passes
    last = (tmp_path / "dumps" / files[-1]).read_text()
    assert "def main(" in last and last == texts[-1][1]  # kiln.script text


def test_registry_lists_builtins_and_rejects_duplicates() -> None:
    assert {"legalize-ops", "dead-code-elimination", "lower-graph-to-tensor",
            "simplify"} <= set(list_passes())
    register_pass(TagPass)
    try:
        assert isinstance(get_pass("test-tag", value=5), TagPass)
        with pytest.raises(CompileError, match="already registered"):
            register_pass(TagPass)
    finally:
        PASSES.unregister("test-tag")


def test_get_pass_errors_teach() -> None:
    with pytest.raises(CompileError, match="did you mean 'simplify'"):
        get_pass("simplfy")
    with pytest.raises(CompileError, match="Options: alignment, strategy"):
        get_pass("lower-graph-to-tensor", bogus=1)


def test_parse_passes_with_options() -> None:
    passes = parse_passes("legalize-ops, dead-code-elimination{bindings=false},"
                          "lower-graph-to-tensor{alignment=128 strategy=first-fit}")
    assert passes == [LegalizeOps(), DeadCodeElimination(bindings=False),
                      LowerGraphToTensor(alignment=128, strategy="first-fit")]
    with pytest.raises(CompileError, match="no option 'x'"):
        parse_passes("simplify{x=1}")
    with pytest.raises(CompileError, match="not a boolean"):
        parse_passes("dead-code-elimination{bindings=maybe}")
    with pytest.raises(CompileError, match="cannot parse pipeline spec"):
        parse_passes("simplify{")


def test_get_pipeline_forms() -> None:
    mod = _module()
    empty = get_pipeline(None, "graph")
    assert isinstance(empty, Sequential) and empty.passes == ()
    assert get_pipeline("none", "tensor").passes == ()  # type: ignore[attr-defined]
    assert [p.name for p in get_pipeline("default", "tensor").passes] == [  # type: ignore[attr-defined]
        "simplify", "partition-loops", "flatten-loops", "interchange-reductions", "parallelize",
        "expand-math", "vectorize-loops"]
    named = get_pipeline("simplify", "tensor")
    assert isinstance(named, Sequential) and named.passes == (Simplify(),)
    listed = get_pipeline(["legalize-ops", DeadCodeElimination()], "graph")
    assert listed.passes == (LegalizeOps(), DeadCodeElimination())  # type: ignore[attr-defined]
    p = TagPass()
    assert get_pipeline(p, "tensor") is p
    called: list[IRModule] = []
    fn_pass = get_pipeline(lambda m: called.append(m) or m, "graph")
    assert fn_pass(mod) is mod and called == [mod]
    with pytest.raises(CompileError, match="unknown graph pipeline 'fast'"):
        get_pipeline("fast", "graph")
    with pytest.raises(CompileError, match="level must be one of"):
        get_pipeline("default", "schedule")
    with pytest.raises(CompileError, match="got int 3"):
        get_pipeline(3, "graph")


def test_registered_pipeline_and_target_kind_override() -> None:
    register_pipeline("tag-only", lambda: Sequential([TagPass()], name="tag-only"),
                      level="tensor")
    assert get_pipeline("tag-only", "tensor").name == "tag-only"
    kind = TargetKind("passtest", {}, ("cpu",))
    kind.set_attr("tensor_pipeline", "tag-only")
    kind.set_attr("graph_pipeline", "none")
    register_kind(kind)
    try:
        t = Target("passtest")
        assert get_pipeline("default", "tensor", target=t).name == "tag-only"
        assert get_pipeline("default", "graph", target=t).passes == ()  # type: ignore[attr-defined]
        # A kind without its own pipeline gets kiln's default.
        assert get_pipeline("default", "graph", target=Target("c")).name == "graph-default"
    finally:
        unregister_kind("passtest")
