"""FlattenLoops: contiguous elementwise nests collapsed into one loop over flattened
views, anything else left alone, results unchanged."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kiln
from kiln.ir import IRModule
from kiln.ir import tensor as t
from kiln.ir.aliasing import analyze
from kiln.ir.evaluate import evaluate
from kiln.ir.visitor import iter_stmts
from kiln.transform.flatten_loops import FlattenLoops
from kiln.transform.parallelize import Parallelize
from kiln.transform.pipeline import default_tensor_pipeline
from support.graphs import GraphBuilder
from support.reference import ort_session


def nest(shape: tuple[int, ...], bias_shape: tuple[int, ...],
         index: Callable[[t.Var], t.PrimExpr] | None = None) -> IRModule:
    """`out[...] = x[...] + b[...]` over loops i0.. of `shape`, `b` broadcast where its
    dimension is not the output's; `index(last loop variable)` replaces x's last index."""
    x, out = (t.Buffer(n, shape, "float32") for n in ("x", "out"))
    b = t.Buffer("b", bias_shape, "float32")
    vs = [t.Var(f"i{k}", "int64") for k in range(len(shape))]
    xi = (*vs[:-1], index(vs[-1]) if index is not None else vs[-1])
    bi = tuple(v if d == n else t.Const(0, "int64") for v, d, n in zip(vs, bias_shape, shape))
    body: t.Stmt = t.Store(out, t.BinaryOp("add", t.Load(x, xi), t.Load(b, bi)), tuple(vs))
    for v, n in reversed(list(zip(vs, shape))):
        body = t.For(v, t.Const(0, "int64"), t.Const(n, "int64"), "serial", body)
    return IRModule({"f": t.PrimFunc((x, b, out), body)})


def loops(mod: IRModule) -> list[tuple[int, int]]:
    return [(int(s.start.value), int(s.extent.value)) for s in iter_stmts(mod["f"].body)
            if isinstance(s, t.For)]


def same_results(a: IRModule, b: IRModule, shape: tuple[int, ...],
                 bias_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    want, got = np.zeros(shape, np.float32), np.ones(shape, np.float32)
    evaluate(a, "f", x, bias, want)
    evaluate(b, "f", x, bias, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("bias", "expect"), [
    ((1, 4, 3, 5), [(0, 60)]),              # same shape: the whole tensor is one loop
    ((1, 4, 1, 1), [(0, 1), (0, 4), (0, 15)]),  # per-channel: the rows under a channel
    ((1, 1, 1, 1), [(0, 1), (0, 60)]),      # b[i0, 0, 0, 0]: i0 is b's leading index
])
def test_collapses_contiguous_trailing_loops(bias: tuple[int, ...],
                                             expect: list[tuple[int, int]]) -> None:
    shape = (1, 4, 3, 5)
    mod = nest(shape, bias)
    flat = FlattenLoops()(mod)
    got = loops(flat)
    assert got == expect
    decls = [s for s in iter_stmts(flat["f"].body) if isinstance(s, t.DeclBuffer)]
    assert all(d.byte_offset == 0 and d.buffer.numel() == d.source.numel() for d in decls)
    # stores through `out`'s view still count as writes of `out` (parameter 2)
    assert analyze({"f": flat["f"]}).written["f"] == {2}
    same_results(mod, flat, shape, bias)


def test_leaves_other_accesses_alone() -> None:
    shape = (2, 3, 4)
    # a loop variable inside an index expression: x[i0, i1, 3 - i2] is not contiguous,
    # and only trailing loops merge, so the nest stays as it is
    mod = nest(shape, shape, lambda v: t.BinaryOp("sub", t.Const(3, "int64"), v))
    assert FlattenLoops()(mod)["f"].body is mod["f"].body
    # a transposed operand: b[i0, i2, i1] over [2, 4, 3]
    x, out = (t.Buffer(n, shape, "float32") for n in ("x", "out"))
    b = t.Buffer("b", (2, 4, 3), "float32")
    vs = [t.Var(f"i{k}", "int64") for k in range(3)]
    stmt: t.Stmt = t.Store(out, t.BinaryOp("add", t.Load(x, tuple(vs)),
                                           t.Load(b, (vs[0], vs[2], vs[1]))), tuple(vs))
    for v, n in reversed(list(zip(vs, shape))):
        stmt = t.For(v, t.Const(0, "int64"), t.Const(n, "int64"), "serial", stmt)
    tr = IRModule({"f": t.PrimFunc((x, b, out), stmt)})
    assert FlattenLoops()(tr)["f"].body is stmt
    # int32 loop variables whose product of extents int32 cannot hold
    big = (65536, 65536)
    ys = [t.Var(f"j{k}", "int32") for k in range(2)]
    a = t.Buffer("a", big, "float32")
    wide: t.Stmt = t.Store(a, t.Const(0.0, "float32"), tuple(ys))
    for v, n in reversed(list(zip(ys, big))):
        wide = t.For(v, t.Const(0, "int32"), t.Const(n, "int32"), "serial", wide)
    assert FlattenLoops()(IRModule({"f": t.PrimFunc((a,), wide)}))["f"].body is wide


def test_non_zero_start_and_parallel_loops_are_kept() -> None:
    mod = nest((1, 4, 3, 5), (1, 4, 3, 5))
    body = mod["f"].body
    assert isinstance(body, t.For) and isinstance(body.body, t.For)
    inner = body.body
    moved = t.For(inner.var, t.Const(1, "int64"), t.Const(3, "int64"), "parallel", inner.body)
    mod2 = IRModule({"f": mod["f"].with_body(t.For(body.var, body.start, body.extent, "serial",
                                                        moved))})
    # only the loops inside the parallel one (start 1) merge
    assert loops(FlattenLoops()(mod2)) == [(0, 1), (1, 3), (0, 15)]


def test_flattened_loop_is_still_parallelized() -> None:
    shape = (1, 16, 56, 56)
    flat = Parallelize()(FlattenLoops()(nest(shape, shape)))
    fors = [s for s in iter_stmts(flat["f"].body) if isinstance(s, t.For)]
    assert [(f.kind, int(f.extent.value)) for f in fors] == [("parallel", 16 * 56 * 56)]


def _kernel_loops(ex: kiln.Executable, word: str) -> list[t.For]:
    lowered = default_tensor_pipeline()(ex.ir)
    (name,) = [n for n in lowered.functions if word in n]
    return [s for s in iter_stmts(lowered[name].body) if isinstance(s, t.For)]


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_add_relu_and_concat_relu_against_onnxruntime(kind: str) -> None:
    b = GraphBuilder()
    x, y = b.input("x", [1, 8, 7, 7]), b.input("y", [1, 8, 7, 7])
    z = b.input("z", [1, 4, 7, 7])
    s = b.op("Relu", b.op("Add", x, y))
    b.output(s, [1, 8, 7, 7])
    b.output(b.op("Relu", b.op("Concat", s, z, axis=1)), [1, 12, 7, 7])
    model = b.model(opset=17)
    ex = kiln.compile(model, target=kind)
    add = _kernel_loops(ex, "add")
    assert [int(f.extent.value) for f in add] == [8 * 49]
    # each concatenated input's piece (PartitionLoops) is one loop over its elements,
    # the second writing at its channels' offset
    concat = _kernel_loops(ex, "concat")
    assert [int(f.extent.value) for f in concat] == [8 * 49, 4 * 49]
    (second,) = [s for s in iter_stmts(concat[1].body) if isinstance(s, t.Store)]
    assert isinstance(second.indices[-1], t.BinaryOp) and second.indices[-1].b.value == 8 * 49
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((1, 8, 7, 7)).astype(np.float32),
             "y": rng.standard_normal((1, 8, 7, 7)).astype(np.float32),
             "z": rng.standard_normal((1, 4, 7, 7)).astype(np.float32)}
    want = ort_session(model).run(None, feeds)
    got = ex.jit()["main"](*feeds.values())
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
