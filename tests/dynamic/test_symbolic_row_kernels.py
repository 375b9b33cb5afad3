"""Row kernels (softmax, layer norm, a trailing-axis mean) with a symbolic row count
against onnxruntime on llvm, c and the AVX2 path: row counts of 1, of a multiple of the
symbolic row loop's chunk (kiln.kernels.rows.loops.ROW_CHUNK) and of neither, a row
length that is no multiple of the vector width, and the kernels' loop structure (no
division a row, one parallel loop)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.tensor import BinaryOp, Const, For, PrimExpr, PrimFunc
from kiln.ir.visitor import expr_children, iter_exprs, iter_stmts
from kiln.kernels.rows.loops import ROW_CHUNK
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import ort_session

WIDTH = 40  # layer norm's and the mean's row length: no multiple of 8 or 16 lanes
# (batch, seq): softmax rows batch*3*seq, the others batch*seq
SIZES = ((1, 1), (2, ROW_CHUNK), (3, 13), (1, 37))
AVX2 = "llvm -mcpu=haswell"  # the 8-lane path (no AVX-512), on any AVX2 host


def _model() -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Softmax", ["x"], ["p"], axis=-1)
    b.node("LayerNormalization", ["y", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5)
    b.node("ReduceMean", ["y"], ["m"], axes=[-1], keepdims=1)
    b.input("x", ["b", 3, "s", "s"])
    b.input("y", ["b", "s", WIDTH])
    b.output("p", ["b", 3, "s", "s"])
    b.output("n", ["b", "s", WIDTH])
    b.output("m", ["b", "s", 1])
    rng = np.random.default_rng(1)
    b.consts({"gamma": rng.standard_normal(WIDTH).astype(np.float32),
              "beta": rng.standard_normal(WIDTH).astype(np.float32)})
    return b.model(name="rows", ir_version=None)


def _host_runs(target: str) -> bool:
    return target != AVX2 or "avx2" in isa_for(Target.from_host()).features


@pytest.mark.parametrize("target", ["llvm", "c", AVX2])
def test_symbolic_row_counts_match_onnxruntime(target: str) -> None:
    if not _host_runs(target):
        pytest.skip("this host has no AVX2")
    model = _model()
    exe = kiln.compile(from_onnx(model), target)
    kinds = {fn.attrs.get("kiln.row_kernel") for fn in exe.ir.prim_funcs().values()}
    assert {"softmax", "layer_norm", "reduce_mean"} <= kinds, kinds
    session = ort_session(model)
    rng = np.random.default_rng(0)
    for b, s in SIZES:
        feed = {"x": rng.standard_normal((b, 3, s, s)).astype(np.float32) * 4,
                "y": rng.standard_normal((b, s, WIDTH)).astype(np.float32)}
        got = exe["main"](*feed.values())
        for name, g, want in zip(("softmax", "layer_norm", "mean"), got,
                                 session.run(None, feed)):
            np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-6,
                                       err_msg=f"{name} at batch {b}, seq {s}")


def _divisions_by_a_dim_a_row(fn: PrimFunc) -> int:
    """Divisions by a run-time value inside the loops over one chunk's rows."""
    count = 0
    for chunk in iter_stmts(fn.body):
        if not (isinstance(chunk, For) and chunk.var.name == "chunk"):
            continue
        rows = [s for s in iter_stmts(chunk.body) if isinstance(s, For)][:1]
        assert rows, "a chunk loops over its rows"
        for stmt in iter_stmts(rows[0].body):
            exprs = (e for e in expr_children(stmt) if isinstance(e, PrimExpr))
            count += sum(isinstance(e, BinaryOp) and e.op in ("floordiv", "floormod")
                         and not isinstance(e.b, Const) for e in iter_exprs(*exprs))
    return count


def test_symbolic_row_loop_divides_once_a_chunk_not_once_a_row() -> None:
    exe = kiln.compile(from_onnx(_model()), "llvm")
    rows = [fn for fn in exe.ir.prim_funcs().values() if fn.attrs.get("kiln.row_kernel")]
    assert rows
    for fn in rows:
        chunk_loops = [s for s in iter_stmts(fn.body)
                       if isinstance(s, For) and s.var.name == "chunk"]
        assert chunk_loops, fn.attrs["kiln.row_kernel"]
        assert _divisions_by_a_dim_a_row(fn) == 0
        # the kernel chose its parallel loop by the work at run time: parallelize leaves
        # its serial copy (for a few rows) serial, not a launch per chunk of rows
        parallel = [s for s in iter_stmts(fn.body) if isinstance(s, For) and s.kind == "parallel"]
        assert [s.var.name for s in parallel] == ["chunk"], fn.attrs["kiln.row_kernel"]
