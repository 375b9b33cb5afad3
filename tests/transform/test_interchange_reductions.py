"""InterchangeReductions: the output loop moves inside reductions, results stay identical.

Every check compares the interpreter's results before and after the pass bit
for bit: each output element must see the same operations in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_parallelize import CORPUS, check_parallel_loops, fresh_args, op_graphs, same

from kiln import ops
from kiln.errors import CallError
from kiln.ir import IRBuilder, IRModule, evaluate, verify
from kiln.ir.tensor import Allocate, Buffer, Const, For, PrimExpr, PrimFunc, Var
from kiln.ir.visitor import iter_stmts
from kiln.transform import PassContext
from kiln.transform.interchange_reductions import InterchangeReductions
from kiln.transform.parallelize import Parallelize
from kiln.transform.pipeline import get_pipeline

I64 = "int64"


def accumulators(fn: PrimFunc) -> list[tuple[int, ...]]:
    return [s.buffer.shape for s in iter_stmts(fn.body)
            if isinstance(s, Allocate) and s.buffer.scope == "local"]


def loops(fn: PrimFunc) -> list[str]:
    return [s.var.name for s in iter_stmts(fn.body) if isinstance(s, For)]


def assert_same_results(before: IRModule, after: IRModule, name: str, args: list[Any]) -> None:
    want = fresh_args(args)
    try:
        evaluate(before, name, *want)
    except CallError:
        return  # invalid random inputs for this function
    got = fresh_args(args)
    evaluate(after, name, *got)
    for k, (a, b) in enumerate(zip(want, got)):
        assert same(a, b), f"{name}: argument {k} differs after the interchange"


def lowered(build: Callable[[IRBuilder], Any]) -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        ib.ret(build(ib))
    # matrix products keep their tensor-expression loop nests (the samples of this pass)
    # instead of the GEMM micro-kernel
    with PassContext(disabled_passes=["block-matmuls"]):
        return get_pipeline("simplify", "tensor")(get_pipeline("default", "graph")(ib.get()))


def dense(n_in: int, n_out: int) -> IRModule:
    rng = np.random.default_rng(0)

    def build(ib: IRBuilder) -> Any:
        x = ib.param("x", (1, n_in), "float32")
        from kiln.ir import graph as g
        w = g.Constant(rng.standard_normal((n_in, n_out)).astype(np.float32), "w")
        return ib.emit(ops.call("matmul", x, w), "y")

    return lowered(build)


def kernel_name(mod: IRModule) -> str:
    (name,) = [n for n, f in mod.prim_funcs().items() if not f.attrs.get("kiln.graph")]
    return name


def test_dense_layer_gets_tiled_accumulators() -> None:
    mod = dense(40, 150)
    name = kernel_name(mod)
    after = InterchangeReductions().run(mod)
    fn = after[name]
    assert isinstance(fn, PrimFunc)
    assert accumulators(mod[name]) == [(1,)]  # type: ignore[arg-type]
    assert accumulators(fn) == [(64,)]
    assert loops(fn)[0] == "i1_o"  # 150 outputs: tiles of 64, 64 and 22
    verify(after)
    x = np.random.default_rng(1).standard_normal((1, 40)).astype(np.float32)
    assert_same_results(mod, after, "main", [x, np.zeros((1, 150), np.float32)])
    # The tiles are what Parallelize then runs in parallel.
    scheduled = Parallelize(min_work=0).run(after)
    assert [s.var.name for s in iter_stmts(scheduled[name].body)  # type: ignore[union-attr]
            if isinstance(s, For) and s.kind == "parallel"] == ["i1_o"]
    check_parallel_loops(scheduled, name, [x, np.zeros((40, 150), np.float32),
                                           np.zeros((1, 150), np.float32)])


def test_short_output_loops_are_not_tiled() -> None:
    mod = dense(8, 10)
    name = kernel_name(mod)
    fn = InterchangeReductions().run(mod)[name]
    assert accumulators(fn) == [(10,)]  # type: ignore[arg-type]
    assert "i1_o" not in loops(fn)  # type: ignore[arg-type]


def test_pass_changes_nothing_without_reductions() -> None:
    mod = lowered(lambda ib: ib.emit(ops.call("relu", ib.param("x", (4, 4), "float32")), "y"))
    assert InterchangeReductions().run(mod) is mod


def reduction(make: Callable[[IRBuilder, Var, Var, Buffer, Buffer, Buffer], None],
              *, n: int = 8) -> IRModule:
    """`for j: acc = 0; for k: <make>; Y[j] = acc` with X, Y: float32[n]."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (n,), "float32")
        y = ib.arg("Y", (n,), "float32")
        with ib.for_range(n, name="j") as j, \
                ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], 0.0)
            with ib.for_range(n, name="k") as k:
                make(ib, j, k, acc, x, y)
            ib.store(y, [j], acc[0])
    return ib.get()


LEGAL: dict[str, tuple[Callable[..., None], bool]] = {
    "dot": (lambda ib, j, k, acc, x, y: ib.store(acc, [0], acc[0] + x[k] * x[j]), True),
    "reads the output being written": (
        lambda ib, j, k, acc, x, y: ib.store(acc, [0], acc[0] + y[k]), False),
    "writes another buffer": (
        lambda ib, j, k, acc, x, y: (ib.store(acc, [0], acc[0] + x[k]), ib.store(x, [k], 1.0)),
        False),
}


@pytest.mark.parametrize("case", sorted(LEGAL))
def test_legality(case: str) -> None:
    make, expected = LEGAL[case]
    mod = reduction(make)
    after = InterchangeReductions().run(mod)
    assert (after is not mod) is expected
    rng = np.random.default_rng(3)
    assert_same_results(mod, after, "f", [rng.standard_normal(8).astype(np.float32),
                                          rng.standard_normal(8).astype(np.float32)])


def test_triangular_reductions_keep_their_order() -> None:
    """`for k in range(j)`: the reduction's bounds depend on the output loop."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.for_range(8, name="j") as j, \
                ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], 0.0)
            with ib.for_range(j, name="k") as k:
                ib.store(acc, [0], acc[0] + x[k])
            ib.store(y, [j], acc[0])
    mod = ib.get()
    assert InterchangeReductions().run(mod) is mod


@pytest.mark.parametrize("graph", sorted(op_graphs()))
def test_lowered_operator_graphs_compute_the_same(graph: str) -> None:
    try:
        mod = lowered(op_graphs()[graph])
    except CallError as exc:
        pytest.skip(f"{graph}: {exc}")
    after = InterchangeReductions(tile=4).run(mod)  # a small tile: tiling happens too
    verify(after)
    rng = np.random.default_rng(5)
    for name, fn in mod.prim_funcs().items():
        args = [rng.standard_normal([int(d) for d in p.shape]).astype(p.dtype)
                if isinstance(p, Buffer) else 0 for p in fn.params]
        assert_same_results(mod, after, name, args)
        scheduled = Parallelize(min_work=0, min_extent=2).run(after)
        check_parallel_loops(scheduled, name, args)


def _corpus_functions() -> list[tuple[str, str]]:
    return [(case, fname) for case in sorted(CORPUS)
            for fname, fn in CORPUS[case].module().prim_funcs().items()
            if not fn.attrs.get("kiln.graph")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.sampled_from(_corpus_functions()), seed=st.integers(0, 2**32 - 1),
       tile=st.sampled_from([1, 3, 64]))
def test_corpus_functions_compute_the_same(pick: tuple[str, str], seed: int, tile: int) -> None:
    case_name, fname = pick
    case = CORPUS[case_name]
    mod = case.module()
    after = InterchangeReductions(tile=tile).run(mod)
    try:
        args = case.args(fname, np.random.default_rng(seed))
    except ValueError:
        return
    assert_same_results(mod, after, fname, args)


N = 5
FORMS: dict[str, Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]] = {
    "i": lambda i, j, k: i, "j": lambda i, j, k: j, "k": lambda i, j, k: k,
    "N-1-k": lambda i, j, k: (N - 1) - k, "(j+k)%N": lambda i, j, k: (j + k) % N,
    "0": lambda i, j, k: Const(0, I64),
}


@st.composite
def random_reductions(draw: st.DrawFn) -> IRModule:
    """`for i: for j: acc = init; for k: acc = acc (+|max) a * b; T[..] = acc (+ c)` over
    X, W, T: float32[N, N] with random index forms (T may also be read)."""
    two = st.lists(st.sampled_from(list(FORMS)), min_size=2, max_size=2)
    loads = draw(st.lists(st.tuples(st.sampled_from(["X", "W", "T"]), two), min_size=1,
                          max_size=2))
    combine = draw(st.sampled_from(["add", "max"]))
    target = draw(two.filter(lambda f: "k" not in "".join(f)))
    init_from = draw(st.sampled_from([None, "X", "T"]))
    ib = IRBuilder()
    with ib.prim_func("r"):
        bufs = {b: ib.arg(b, (N, N), "float32") for b in ("X", "W", "T")}
        with ib.for_range(N, name="i") as i, ib.for_range(N, name="j") as j, \
                ib.allocate("acc", (1,), "float32", "local") as acc:
            zero = Const(0, I64)
            init: PrimExpr = Const(0.0, "float32")
            if init_from is not None:
                init = bufs[init_from][i, j]
            ib.store(acc, [0], init)
            with ib.for_range(N, name="k") as k:
                term: PrimExpr = Const(1.0, "float32")
                for name, forms in loads:
                    term = term * bufs[name][tuple(FORMS[f](i, j, k) for f in forms)]
                new = acc[0] + term if combine == "add" else \
                    ops_max(acc[0], term)
                ib.store(acc, [0], new)
            ib.store(bufs["T"], [FORMS[f](i, j, zero) for f in target], acc[0])
    return ib.get()


def ops_max(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    from kiln.ir.tensor import max_
    return max_(a, b)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mod=random_reductions(), seed=st.integers(0, 2**16), tile=st.sampled_from([2, 64]))
def test_random_reductions_compute_the_same(mod: IRModule, seed: int, tile: int) -> None:
    after = InterchangeReductions(tile=tile).run(mod)
    rng = np.random.default_rng(seed)
    args = [rng.integers(-3, 4, (N, N)).astype(np.float32) for _ in range(3)]
    assert_same_results(mod, after, "r", args)


def test_random_reductions_are_often_interchanged() -> None:
    changed = examples = 0

    @settings(max_examples=80, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(mod=random_reductions())
    def count(mod: IRModule) -> None:
        nonlocal changed, examples
        examples += 1
        changed += InterchangeReductions().run(mod) is not mod

    count()
    assert examples // 5 <= changed < examples, (changed, examples)
