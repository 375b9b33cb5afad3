"""PartitionLoops: a loop split at the constants its index is compared with, the
comparisons decided per piece, results unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import IRModule
from kiln.ir import tensor as t
from kiln.ir.evaluate import evaluate
from kiln.ir.visitor import StmtExprVisitor, iter_stmts
from kiln.transform.partition_loops import MAX_PIECES, PartitionLoops
from kiln.transform.pipeline import default_tensor_pipeline
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs, ort_session


class _Count(StmtExprVisitor):
    def __init__(self) -> None:
        self.selects = 0
        self.loops: list[t.For] = []

    def visit_select(self, e: t.Select) -> None:
        self.selects += 1
        self.generic_visit(e)

    def visit_for(self, s: t.For) -> None:
        self.loops.append(s)
        self.generic_visit(s)


def counted(s: t.Stmt) -> _Count:
    c = _Count()
    c.visit_stmt(s)
    return c


def picker(n: int, cuts: list[tuple[str, int]]) -> IRModule:
    """`out[i] = select(i op c, a[i], select(..., b[i]))` over n elements."""
    a, b, out = (t.Buffer(name, (n,), "float32") for name in ("a", "b", "out"))
    i = t.Var("i", "int64")
    value: t.PrimExpr = t.Load(b, (i,))
    for k, (op, c) in enumerate(cuts):
        taken = t.BinaryOp("add", t.Load(a, (i,)), t.Const(float(k), "float32"))
        value = t.Select(t.Compare(op, i, t.Const(c, "int64")), taken, value)
    body = t.For(i, t.Const(0, "int64"), t.Const(n, "int64"), "serial",
                 t.Store(out, value, (i,)))
    return IRModule({"f": t.PrimFunc((a, b, out), body)})


def test_split_at_the_compared_constants_and_results_unchanged() -> None:
    mod = picker(20, [("ge", 5), ("lt", 12), ("gt", 15), ("eq", 7)])
    split = PartitionLoops()(mod)
    c = counted(split["f"].body)
    # cuts at 5, 12, 16: four pieces; `i == 7` cannot be decided inside [5, 12)
    assert [(int(f.start.value), int(f.extent.value)) for f in c.loops] == \
        [(0, 5), (5, 7), (12, 4), (16, 4)]
    assert c.selects == 1
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(20).astype(np.float32) for _ in range(2))
    want, got = (np.zeros(20, np.float32) for _ in range(2))
    evaluate(mod, "f", a, b, want)
    evaluate(split, "f", a, b, got)
    np.testing.assert_array_equal(got, want)


def test_too_many_pieces_left_alone() -> None:
    mod = picker(4 * MAX_PIECES, [("ge", k) for k in range(1, MAX_PIECES + 1)])
    assert PartitionLoops()(mod)["f"].body is mod["f"].body


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_concat_reads_each_input_in_its_own_loop(kind: str) -> None:
    b = GraphBuilder()
    shapes = [(1, 3, 4, 5), (1, 2, 4, 5), (1, 4, 4, 5)]
    xs = [b.input(f"x{k}", list(s)) for k, s in enumerate(shapes)]
    b.output(b.op("Relu", b.op("Concat", *xs, axis=1)), [1, 9, 4, 5])
    model = b.model(opset=17)
    ex = kiln.compile(model, target=kind)
    lowered = default_tensor_pipeline()(ex.ir)
    (name,) = [n for n in lowered.functions if "concat" in n]
    c = counted(lowered[name].body)
    assert c.selects == 0 and len([f for f in c.loops if f.var.name.startswith("i1")]) == 3
    rng = np.random.default_rng(5)
    feeds = {f"x{k}": rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    want = ort_session(model).run(None, feeds)[0]
    got = ex.jit()["main"](*feeds.values())
    np.testing.assert_array_equal(np.asarray(got), want)


class _Clamps(StmtExprVisitor):
    def __init__(self) -> None:
        self.found = 0

    def visit_binary_op(self, e: t.BinaryOp) -> None:
        self.found += e.op in ("min", "max")
        self.generic_visit(e)


def test_clamps_the_piece_decides_are_dropped() -> None:
    """A concat's `a[clamp(i - 5)]` / `b[clamp(i)]` pieces index their inputs by offsets
    of `i`; a clamp no piece decides (`min(i, 7)` over [5, 12)) stays."""
    n, i = 12, t.Var("i", "int64")
    a, b, c, out = (t.Buffer(name, (n,), "float32") for name in ("a", "b", "c", "out"))

    def clamp(e: t.PrimExpr, hi: int) -> t.PrimExpr:
        return t.BinaryOp("min", t.BinaryOp("max", e, t.Const(0, "int64")), t.Const(hi, "int64"))

    shifted = t.BinaryOp("sub", i, t.Const(5, "int64"))
    kept = t.Load(c, (t.BinaryOp("min", i, t.Const(7, "int64")),))
    value = t.Select(t.Compare("ge", i, t.Const(5, "int64")),
                     t.BinaryOp("add", t.Load(a, (clamp(shifted, 6),)), kept),
                     t.Load(b, (clamp(i, 4),)))
    body = t.For(i, t.Const(0, "int64"), t.Const(n, "int64"), "serial", t.Store(out, value, (i,)))
    mod = IRModule({"f": t.PrimFunc((a, b, c, out), body)})
    split = PartitionLoops()(mod)
    clamps = _Clamps()
    clamps.visit_stmt(split["f"].body)
    assert clamps.found == 1  # the min(i, 7) of the second piece
    rng = np.random.default_rng(4)
    ins = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    want, got = (np.zeros(n, np.float32) for _ in range(2))
    evaluate(mod, "f", *ins, want)
    evaluate(split, "f", *ins, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_a_concats_pieces_run_as_one_parallel_loop(kind: str) -> None:
    """A concatenation fused with the BatchNorm and ReLU after it (DenseNet's) is split
    into one loop per input, then run as one parallel loop over every input's channels
    (kiln.transform.parallelize: one hand-off, the 32-channel pieces too small to split
    alone included), each channel choosing its input's loop: onnxruntime's result on 1
    and 2 threads."""
    b = GraphBuilder()
    shapes = [(1, 384, 14, 14), (1, 32, 14, 14), (1, 32, 14, 14), (1, 32, 14, 14)]
    xs = [b.input(f"x{k}", list(s)) for k, s in enumerate(shapes)]
    scale = b.const(b.rng.uniform(0.5, 1.5, (480, 1, 1)).astype(np.float32), "scale")
    shift = b.const(b.rng.normal(0, 0.1, (480, 1, 1)).astype(np.float32), "shift")
    y = b.op("Relu", b.op("Add", b.op("Mul", b.op("Concat", *xs, axis=1), scale), shift))
    b.output(y, [1, 480, 14, 14])
    model = b.model(opset=17)
    ex = kiln.compile(model, target=kind)
    (name,) = [n for n in ex.ir.functions if "concat" in n]
    loops = counted(ex.ir[name].body).loops
    assert [(f.var.name, f.start.value, f.extent.value) for f in loops  # type: ignore[attr-defined]
            if f.kind == "parallel"] == [("i1", 0, 480)], "one loop over the 480 channels"
    rng = np.random.default_rng(6)
    feeds = {f"x{k}": rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    (want,) = onnxruntime_outputs(model, feeds)
    lib = ex.jit()
    try:
        for threads in (1, 2):
            lib.set_num_threads(threads)
            np.testing.assert_allclose(np.asarray(lib["main"](*feeds.values())), want,
                                       rtol=1e-6, atol=1e-6)
    finally:
        lib.set_num_threads(None)


def test_pieces_that_are_vector_loops_are_not_merged() -> None:
    """A concatenation along the last axis splits into innermost loops (vector code):
    those are not merged into one loop choosing its piece per element."""
    b = GraphBuilder()
    shapes = [(150_000,), (100_000,)]
    xs = [b.input(f"x{k}", list(s)) for k, s in enumerate(shapes)]
    b.output(b.op("Relu", b.op("Concat", *xs, axis=0)), [250_000])
    ex = kiln.compile(b.model(opset=17), target="llvm")
    (name,) = [n for n in ex.ir.functions if "concat" in n]
    body = ex.ir[name].body
    assert not any(isinstance(s, t.IfThenElse) for s in iter_stmts(body))
    assert [f.kind for f in counted(body).loops] == ["parallel", "parallel"]
