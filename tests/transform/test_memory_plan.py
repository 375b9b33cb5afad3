"""The static memory planner: unit cases and properties over random live ranges and DAGs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import tensor as t
from kiln.ir.visitor import iter_stmts
from kiln.transform.lower_graph import lower_function
from kiln.transform.memory_plan import (
    STRATEGIES,
    Block,
    MemoryPlan,
    check_plan,
    live_ranges,
    plan_memory,
)
from support import ir_samples


def test_disjoint_lifetimes_share_memory() -> None:
    blocks = [Block("a", 100, 0, 1), Block("b", 100, 2, 3), Block("c", 100, 4, 5)]
    plan = plan_memory(blocks)
    assert set(plan.offsets.values()) == {0}
    assert plan.total == 128  # 100 rounded up to the 64-byte alignment


def test_overlapping_lifetimes_do_not_share() -> None:
    blocks = [Block("a", 10, 0, 2), Block("b", 10, 1, 3), Block("c", 10, 2, 2)]
    plan = plan_memory(blocks)
    assert sorted(plan.offsets.values()) == [0, 64, 128]
    assert plan.total == 192
    check_plan(blocks, plan)


def test_greedy_by_size_beats_first_fit_on_a_classic_case() -> None:
    # first-fit places the small early block at 0 and pushes the big one up.
    blocks = [Block("small", 64, 0, 1), Block("big", 1024, 1, 2), Block("small2", 64, 2, 3)]
    greedy = plan_memory(blocks, strategy="greedy-by-size")
    first = plan_memory(blocks, strategy="first-fit")
    check_plan(blocks, greedy)
    check_plan(blocks, first)
    assert greedy.total == 1024 + 64
    assert first.total >= greedy.total


def test_zero_size_and_empty() -> None:
    assert plan_memory([]).total == 0
    plan = plan_memory([Block("z", 0, 0, 5), Block("a", 8, 0, 5)])
    assert plan.offsets["a"] == 0 and plan.total == 64


def test_bad_arguments() -> None:
    with pytest.raises(CompileError, match="power of two"):
        plan_memory([], alignment=48)
    with pytest.raises(CompileError, match="unknown memory plan strategy"):
        plan_memory([], strategy="best")
    with pytest.raises(CompileError, match="unique"):
        plan_memory([Block("a", 1, 0, 0), Block("a", 1, 0, 0)])
    with pytest.raises(CompileError, match="ends"):
        Block("a", 1, 3, 2)
    with pytest.raises(CompileError, match="negative size"):
        Block("a", -1, 0, 0)


def test_check_plan_catches_overlap() -> None:
    blocks = [Block("a", 64, 0, 1), Block("b", 64, 1, 2)]
    with pytest.raises(CompileError, match="overlap while both are live"):
        check_plan(blocks, MemoryPlan({"a": 0, "b": 32}, 128, 32))
    with pytest.raises(CompileError, match="not aligned"):
        check_plan(blocks, MemoryPlan({"a": 0, "b": 65}, 192, 64))


def test_live_ranges() -> None:
    ranges = live_ranges({"a": 0, "b": 1, "c": 2}, {"a": [1, 3], "b": [2]})
    assert ranges == {"a": (0, 3), "b": (1, 2), "c": (2, 2)}


blocks_strategy = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 10)),
    max_size=40,
).map(lambda items: [Block(i, size, start, start + length)
                     for i, (size, start, length) in enumerate(items)])


@given(blocks=blocks_strategy, strategy=st.sampled_from(STRATEGIES),
       alignment=st.sampled_from([1, 16, 64, 4096]))
def test_plan_never_overlaps_live_blocks(blocks: list[Block], strategy: str,
                                         alignment: int) -> None:
    plan = plan_memory(blocks, alignment=alignment, strategy=strategy)
    check_plan(blocks, plan)
    assert plan.total % alignment == 0
    # Never worse than giving every block its own aligned slot.
    assert plan.total <= sum(-(-b.size // alignment) * alignment for b in blocks)
    # Never better than the peak of simultaneously live bytes.
    steps = {s for b in blocks for s in range(b.start, b.end + 1)}
    peak = max((sum(b.size for b in blocks if b.start <= s <= b.end) for s in steps), default=0)
    assert plan.total >= peak


# ----------------------------------------------------------------- random graph DAGs

@st.composite
def random_dags(draw: st.DrawFn) -> tuple[IRModule, int]:
    """A graph function over f32[N] vectors: random kernels reading random earlier values."""
    n_params = draw(st.integers(1, 3))
    n_steps = draw(st.integers(1, 14))
    ib = IRBuilder()
    ir_samples.add_kernels(ib)
    choices = sorted(ir_samples.KERNEL_ARITY)
    with ib.function("main"):
        values = [ib.param(f"p{i}", ir_samples.F32) for i in range(n_params)]
        for k in range(n_steps):
            kernel = draw(st.sampled_from(choices))
            args = [values[draw(st.integers(0, len(values) - 1))]
                    for _ in range(ir_samples.KERNEL_ARITY[kernel])]
            values.append(ib.emit(ir_samples.call(kernel, *args), f"v{k}"))
        n_out = draw(st.integers(1, 3))
        outs = [values[draw(st.integers(0, len(values) - 1))] for _ in range(n_out)]
        from kiln.ir import graph as g
        ib.ret(outs[0] if n_out == 1 else g.Tuple(tuple(outs)))
    return ib.get(), n_params


def _arena_views(stmt: t.Stmt) -> dict[t.Buffer, tuple[int, int]]:
    return {s.buffer: (s.byte_offset, s.buffer.nbytes())
            for s in iter_stmts(stmt) if isinstance(s, t.DeclBuffer)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_dags(), strategy=st.sampled_from(STRATEGIES))
def test_lowered_random_dag_has_no_overlapping_live_views(case: tuple[IRModule, int],
                                                           strategy: str) -> None:
    """Read liveness back from the emitted IR (not the planner's input) and check it."""
    mod, _ = case
    lowered = lower_function("main", mod["main"], mod, strategy=strategy)  # type: ignore[arg-type]
    fn = lowered.func
    views = _arena_views(fn.body)
    calls = [s for s in iter_stmts(fn.body) if isinstance(s, t.CallFunc)]
    first: dict[t.Buffer, int] = {}
    last: dict[t.Buffer, int] = {}
    for step, c in enumerate(calls):
        for a in c.args:
            if isinstance(a, t.Buffer) and a in views:
                first.setdefault(a, step)
                last[a] = step
    # Every view is first touched as the output (the last argument) of its defining call.
    for buf in views:
        assert calls[first[buf]].args[-1] is buf
    bufs = list(views)
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if first[a] <= last[b] and first[b] <= last[a]:
                (oa, sa), (ob, sb) = views[a], views[b]
                assert oa + sa <= ob or ob + sb <= oa, (a.name, b.name)
    assert fn.attrs["kiln.workspace_bytes"] >= max(
        (o + s for o, s in views.values()), default=0)
    assert all(o % 64 == 0 for o, _ in views.values())


def _numpy_reference(mod: IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    from kiln.ir import graph as g

    fn = mod["main"]
    assert isinstance(fn, g.Function)
    env: dict[g.Var, np.ndarray] = dict(zip(fn.params, inputs))
    for b in fn.bindings:
        call = b.value
        assert isinstance(call, g.CallTensor)
        env[b.var] = ir_samples.KERNEL_REFS[call.func](*(env[a] for a in call.args))
    result = fn.result
    fields = result.fields if isinstance(result, g.Tuple) else (result,)
    return [env[f] for f in fields]  # type: ignore[index]


@pytest.mark.skipif(importlib.util.find_spec("kiln.ir.evaluate") is None,
                    reason="kiln.ir.evaluate not written yet")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_dags(), strategy=st.sampled_from(STRATEGIES))
def test_lowered_random_dag_computes_the_graph(case: tuple[IRModule, int], strategy: str) -> None:
    """The interpreter poisons fresh arenas, so a reuse bug shows up as a wrong answer."""
    from kiln.ir.evaluate import evaluate
    from kiln.transform import LowerGraphToTensor

    mod, n_params = case
    lowered = LowerGraphToTensor(strategy=strategy)(mod)
    fn = lowered["main"]
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-2, 2, ir_samples.N).astype(np.float32) for _ in range(n_params)]
    outs = [np.full(p.shape, np.nan, np.float32) for p in fn.params[n_params:]]
    evaluate(lowered, "main", *inputs, *outs)
    for got, want in zip(outs, _numpy_reference(mod, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def _reference_plan(blocks: list[Block], alignment: int, strategy: str) -> dict[object, int]:
    """The planner's rule checked against every placed block (quadratic): the oracle."""
    order = sorted(range(len(blocks)), key=(
        (lambda i: (-blocks[i].size, blocks[i].start, i)) if strategy == "greedy-by-size"
        else (lambda i: (blocks[i].start, i))))
    placed: list[tuple[Block, int]] = []
    out: dict[object, int] = {}
    for i in order:
        b = blocks[i]
        candidate = 0
        if b.size:
            busy = sorted((o, o + p.size) for p, o in placed
                          if p.size > 0 and p.overlaps_in_time(b))
            for lo, hi in busy:
                if candidate + b.size <= lo:
                    break
                candidate = max(candidate, -(-hi // alignment) * alignment)
        out[b.key] = candidate
        placed.append((b, candidate))
    return out


@pytest.mark.parametrize("strategy", ["greedy-by-size", "first-fit"])
@pytest.mark.parametrize("seed", range(6))
def test_time_buckets_give_the_reference_plan(strategy: str, seed: int) -> None:
    """Looking for conflicts only among time neighbours places every block exactly where
    checking all placed blocks does: short and long lives, zero sizes, equal sizes."""
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(5, 400))
    blocks = []
    for k in range(int(rng.integers(1, 300))):
        start = int(rng.integers(0, steps))
        life = int(rng.choice([0, 1, 2, int(rng.integers(0, steps))]))
        size = int(rng.choice([0, 64, 64, int(rng.integers(1, 5000))]))
        blocks.append(Block(f"b{k}", size, start, start + life))
    alignment = int(rng.choice([1, 16, 64]))
    plan = plan_memory(blocks, alignment=alignment, strategy=strategy)
    assert dict(plan.offsets) == _reference_plan(blocks, alignment, strategy)
    check_plan(blocks, plan)


def test_a_long_chain_plans_in_linear_time() -> None:
    """A chain whose values live two steps each: conflicts are found among a bucket's
    few neighbours (the count of overlap tests grows linearly, not quadratically)."""
    calls = 0
    original = Block.overlaps_in_time

    def counting(self: Block, other: Block) -> bool:
        nonlocal calls
        calls += 1
        return original(self, other)

    counts = []
    for n in (2_000, 8_000):
        calls = 0
        Block.overlaps_in_time = counting  # type: ignore[method-assign]
        try:
            plan_memory([Block(k, 256, k, k + 1) for k in range(n)])
        finally:
            Block.overlaps_in_time = original  # type: ignore[method-assign]
        counts.append(calls)
    assert counts[1] < 5 * counts[0]
