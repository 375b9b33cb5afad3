"""`dynamic_quant_matmul_packed` over a symbolic row count against onnxruntime at the
sizes where its kernel changes course (kiln.kernels.int8.dynamic and .matmul): no row,
the one row that runs the kernel of a pinned one-row build (a recurrent step or a
decoder token at batch 1), the edges of the small row counts' shorter tiles (2 to 5),
and the row tiles' boundaries (7, 8, 9: one short of a full tile of 8, full, one past),
on llvm, c and the AVX2 path. The product's rows are `[batch, seq]` and a
residual of the output's shape is fused into its tail, so the one-row kernel (a view of
A, the output itself at `(0, ..., 0, j)`) is checked to give the tail the output's own
index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from quantized_models import RECURRENT_REL_L2, quantize_dynamic_model, rel_l2

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import Buffer, DeclBuffer, IfThenElse
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

#: The AVX2 path on an AVX-512 host, as tests/quantization/test_int8_symbolic.py runs it.
AVX2 = "llvm -mcpu=znver4 -mattr=-avx512f"
TARGETS = ("llvm", "c", AVX2)
K, N = 48, 40
#: (batch, seq): rows 0, 1, the small-row classes' edges (2, 3, 4, 5: kiln.kernels.int8.
#: matmul.SMALL_ROW_CLASSES), 7, 8 and 9
SIZES = [(3, 0), (1, 1), (2, 1), (1, 3), (2, 2), (1, 5), (1, 7), (2, 4), (3, 3)]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    b = GraphBuilder()
    rng = np.random.default_rng(5)
    b.node("MatMul", ["x", "w"], ["p"])
    b.node("Add", ["p", "bias"], ["s"])
    b.node("Add", ["s", "res"], ["y"])
    b.input("x", ["batch", "seq", K])
    b.input("res", ["batch", "seq", N])
    b.output("y", ["batch", "seq", N])
    b.const(rng.standard_normal((K, N)).astype(np.float32), name="w")
    b.const(rng.standard_normal(N).astype(np.float32), name="bias")
    return quantize_dynamic_model(b.model(name="dense_int8", ir_version=None))


_BUILDS: dict[str, Any] = {}


def _compiled(model: onnx.ModelProto, target: str) -> Any:
    if target not in _BUILDS:
        _BUILDS[target] = kiln.compile(from_onnx(model), like_onnxruntime(target))
    return _BUILDS[target]


@pytest.mark.parametrize("target", TARGETS)
def test_rows_at_the_kernel_boundaries_match_onnxruntime(model: onnx.ModelProto,
                                                         target: str) -> None:
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host does not run {target}")
    ex = _compiled(model, target)
    rng = np.random.default_rng(6)
    for batch, seq in SIZES:
        feeds = {"x": rng.standard_normal((batch, seq, K)).astype(np.float32),
                 "res": rng.standard_normal((batch, seq, N)).astype(np.float32)}
        want = onnxruntime_outputs(model, feeds)[0]
        got = np.asarray(ex["main"](*feeds.values()))
        assert got.shape == want.shape, (target, batch, seq)
        if got.size:
            assert rel_l2(got, want) < RECURRENT_REL_L2, (target, batch, seq)


def test_one_row_is_chosen_at_run_time(model: onnx.ModelProto) -> None:
    """The symbolic product's kernel branches on its row count, one side on a view of A
    of one row (the kernel a pinned one-row build has); the output is never viewed, so
    its stores stay kiln's vector code (a viewed output left them to LLVM's loop
    vectorizer: a GELU tail ran 1.1x its pinned kernel)."""
    ex = _compiled(model, "llvm")
    kernels = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.gemm_kernel") == "dynamic_quant_matmul_packed"]
    assert kernels
    for f in kernels:
        one_row = [s for s in iter_stmts(f.body) if isinstance(s, IfThenElse)
                   and any(isinstance(d, DeclBuffer) and d.buffer.shape[0] == 1
                           for d in iter_stmts(s.then_body))]
        assert one_row, f
        out = [p for p in f.params if isinstance(p, Buffer)][-1]
        assert not [s for s in iter_stmts(f.body)
                    if isinstance(s, DeclBuffer) and s.source is out], f
