"""kiln.transform.index_ranges: a remainder the loops' bounds make plain is dropped, no
other; and parallelize's merged loops over a symbolic extent get it back (a BERT's head
split `[batch, seq, 768] -> [batch, 12, seq, 64]`: a copy of whole rows again, not a
remainder per element), with the outputs unchanged on llvm and c."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import BinaryOp, Buffer, Const, For, LetStmt, Store, Var, seq
from kiln.ir.visitor import expr_children, iter_exprs, iter_stmts
from kiln.transform.index_ranges import drop_known_mods
from support.graphs import GraphBuilder


def _mods(stmt: object) -> list[BinaryOp]:
    return [e for s in iter_stmts(stmt) for x in expr_children(s) if hasattr(x, "dtype")
            for e in iter_exprs(x) if isinstance(e, BinaryOp) and e.op == "floormod"]


def _copy(i3_extent: int, head: object) -> For:
    """`for i3 in range(i3_extent): out[i3] = x[(head * 64 + i3) % 768]`, `head` bound
    by a let of `flat % 12` (or `flat` itself) inside a loop over a symbolic extent."""
    n = Var("n", INDEX_DTYPE)
    flat, h, i3 = Var("flat", INDEX_DTYPE), Var("h", INDEX_DTYPE), Var("i3", INDEX_DTYPE)
    x, out = Buffer("x", (768,), "float32"), Buffer("out", (768,), "float32")
    value = flat % 12 if head == "mod" else flat
    body = For(i3, Const(0, INDEX_DTYPE), Const(i3_extent, INDEX_DTYPE), "serial",
               Store(out, x[(h * 64 + i3) % 768], (i3,)))
    return For(flat, Const(0, INDEX_DTYPE), n, "serial", seq(LetStmt(h, value), body))


def test_a_remainder_the_bounds_make_plain_is_dropped() -> None:
    assert len(_mods(_copy(64, "mod"))) == 2
    assert len(_mods(drop_known_mods(_copy(64, "mod")))) == 1  # `flat % 12` stays


@pytest.mark.parametrize("i3_extent, head", [(65, "mod"), (64, "flat")])
def test_a_remainder_that_may_wrap_is_kept(i3_extent: int, head: str) -> None:
    # 11 * 64 + 64 reaches 768; an unbounded `flat` may reach anything
    loop = _copy(i3_extent, head)
    assert drop_known_mods(loop) is loop


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_head_split_over_symbolic_sizes_copies_rows(target: str) -> None:
    b = GraphBuilder()
    b.input("x", ["batch", "seq", 768])
    b.node("Reshape", ["x", b.const(np.array([0, 0, 12, 64], np.int64), name="shape")], ["r"])
    b.node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])
    b.output("y", ["batch", 12, "seq", 64])
    model = b.model(name="head_split")
    ex = kiln.compile(from_onnx(model), target)
    merged = [s for f in ex.ir.prim_funcs().values() for s in iter_stmts(f.body)
              if isinstance(s, For) and s.kind == "parallel" and s.var.name.endswith("_flat")]
    assert merged, "the symbolic nest is merged into one parallel loop"
    inner = [s for s in iter_stmts(merged[0].body) if isinstance(s, For)]
    assert inner and not any(isinstance(m.b, Const) and m.b.value == 768
                             for m in _mods(inner[0]))
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 77), (1, 128)):  # serial, then the parallel loop
        a = rng.standard_normal((b, s, 768)).astype(np.float32)
        want = a.reshape(b, s, 12, 64).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(np.asarray(ex["main"](a)), want)


def test_head_split_over_static_sizes_copies_rows_in_its_parallel_loop() -> None:
    # ViT-B/16's head split: outlined, the parallel loop over the 12 heads runs from the
    # pool's `begin` to `end`, so the backend would not see `i1 < 12` and kept a remainder
    # by 768 per element (no power of two: a division); parallelize drops it
    b = GraphBuilder()
    b.input("x", [1, 197, 768])
    b.node("Reshape", ["x", b.const(np.array([1, 197, 12, 64], np.int64), name="shape")], ["r"])
    b.node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])
    b.output("y", [1, 12, 197, 64])
    ex = kiln.compile(from_onnx(b.model(name="head_split_static")), "llvm")
    loops = [s for f in ex.ir.prim_funcs().values() for s in iter_stmts(f.body)
             if isinstance(s, For) and s.kind == "parallel"]
    assert loops, "the copy is worth the pool"
    assert not any(isinstance(m.b, Const) and m.b.value == 768 for m in _mods(loops[0]))
    a = np.random.default_rng(1).standard_normal((1, 197, 768)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(ex["main"](a)),
                                  a.reshape(1, 197, 12, 64).transpose(0, 2, 1, 3))
