"""The float GEMM over symbolic rows of several dims (`[seq, batch]`, an LSTM's input
product) and over `[1, batch]` (a recurrent step's `h @ R`), against onnxruntime at the
row counts where the tiles change course: 0, 1, 2 to 5 (the short tiles of 1, 2 and 4
rows a few rows take), 7, 8 and 9 (one short of an AVX-512 tile of 8 rows, a full one,
one past), on llvm, c and the AVX2 path. A and the output
are read and stored through views of their rows flattened (kiln.kernels.gemm.loop_nest)
while the fused tail (a bias and a residual of the output's shape) still reads at the
output's own index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.tensor import DeclBuffer
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.numerics import rel_l2
from support.reference import ort_session

AVX2 = "llvm -mcpu=znver4 -mattr=-avx512f"
K, N = 43, 72  # K: the split sums of one and two rows have steps left over
#: (seq, batch): rows 0, 1, the short tiles' edges (2, 3, 4, 5), 7, 8 and 9
SIZES = [(0, 3), (1, 1), (1, 2), (3, 1), (2, 2), (1, 5), (7, 1), (2, 4), (3, 3)]


def _model(lead: list[Any]) -> onnx.ModelProto:
    b = GraphBuilder()
    rng = np.random.default_rng(3)
    b.node("MatMul", ["x", "w"], ["p"])
    b.node("Add", ["p", "bias"], ["s"])
    b.node("Add", ["s", "res"], ["y"])
    b.input("x", [*lead, K])
    b.input("res", [*lead, N])
    b.output("y", [*lead, N])
    b.const(rng.standard_normal((K, N)).astype(np.float32), name="w")
    b.const(rng.standard_normal(N).astype(np.float32), name="bias")
    return b.model(name="dense_rows", ir_version=None)


MODELS = {"seq_batch": ["seq", "batch"], "step": [1, "batch"]}


@pytest.mark.parametrize("target", ["llvm", "c", AVX2])
@pytest.mark.parametrize("name", list(MODELS))
def test_symbolic_rows_match_onnxruntime(name: str, target: str) -> None:
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host does not run {target}")
    model = _model(MODELS[name])
    exe = kiln.compile(from_onnx(model), target)
    gemm = [f for f in exe.ir.prim_funcs().values()
            if f.attrs.get("kiln.gemm_kernel") == "matmul_packed"]
    assert gemm
    views = [s for f in gemm for s in iter_stmts(f.body) if isinstance(s, DeclBuffer)]
    assert bool(views) == (name == "seq_batch")  # `[1, batch]` needs no view
    session = ort_session(model)
    rng = np.random.default_rng(4)
    for seq, batch in SIZES:
        lead = [seq, batch] if name == "seq_batch" else [1, seq * batch]
        feed = {"x": rng.standard_normal((*lead, K)).astype(np.float32),
                "res": rng.standard_normal((*lead, N)).astype(np.float32)}
        got = np.asarray(exe["main"](*feed.values()))
        want = session.run(None, feed)[0]
        assert got.shape == want.shape, (seq, batch)
        if got.size:
            assert rel_l2(got, want) < 1e-5, (target, seq, batch)
