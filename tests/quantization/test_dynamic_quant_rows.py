"""`dynamic_quant_matmul_packed` over a symbolic row count against onnxruntime at the
sizes where its kernel changes course (kiln.kernels.int8.dynamic): no row, the one row
that runs the kernel of a pinned one-row build (a recurrent step or a decoder token at
batch 1), and the row tiles' boundaries (7, 8, 9: one short of a full tile of 8, full,
one past), on llvm, c and the AVX2 path; rank 2 (an MLP, batch) and rank 3 (an encoder,
batch x seq, on llvm) so the fused tail's index is checked at both ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from quantized_models import RECURRENT_REL_L2, quantize_dynamic_model, rel_l2
from test_int8_symbolic import AVX2, symbolic_batch

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import IfThenElse
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.isa import isa_for
from support import dynamic_models
from support import small_models as builders
from support.reference import like_onnxruntime, onnxruntime_outputs

TARGETS = ("llvm", "c", AVX2)
#: Each model's sizes: rows 0 (the encoder's mask needs a token), 1, 7, 8 and 9.
SIZES: dict[str, list[dict[str, int]]] = {
    "mlp": [{"batch": b} for b in (0, 1, 7, 8, 9)],
    "encoder": [{"batch": 1, "seq": 1}, {"batch": 1, "seq": 7}, {"batch": 2, "seq": 4},
                {"batch": 3, "seq": 3}],
}
#: The rank-3 case on one target (its kernels are the MLP's; compiles are what cost).
CASES = [("mlp", t) for t in TARGETS] + [("encoder", "llvm")]


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {"mlp": quantize_dynamic_model(symbolic_batch(builders.mlp(batch=1))),
            "encoder": quantize_dynamic_model(dynamic_models.encoder(layers=1))}


_BUILDS: dict[tuple[str, str], Any] = {}


def _compiled(models: dict[str, onnx.ModelProto], name: str, target: str) -> Any:
    if (name, target) not in _BUILDS:
        _BUILDS[name, target] = kiln.compile(from_onnx(models[name]), like_onnxruntime(target))
    return _BUILDS[name, target]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_rows_at_the_kernel_boundaries_match_onnxruntime(
        models: dict[str, onnx.ModelProto], name: str, target: str) -> None:
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host does not run {target}")
    model, ex = models[name], _compiled(models, name, target)
    for size in SIZES[name]:
        feeds = dynamic_models.feeds(model, size, seed=7 + sum(size.values()))
        want = onnxruntime_outputs(model, feeds)[0]
        got = np.asarray(ex["main"](*feeds.values()))
        assert got.shape == want.shape, (target, size)
        if got.size:
            assert rel_l2(got, want) < RECURRENT_REL_L2, (target, size)


def test_one_row_is_chosen_at_run_time(models: dict[str, onnx.ModelProto]) -> None:
    """Each symbolic product's kernel branches on its row count being 1, to the kernel
    a pinned one-row build has (its `[1, K]` view of A)."""
    ex = _compiled(models, "mlp", "llvm")
    kernels = [f for f in ex.ir.functions.values()
               if f.attrs.get("kiln.gemm_kernel") == "dynamic_quant_matmul_packed"]
    assert kernels
    for f in kernels:
        branches = [s for s in iter_stmts(f.body) if isinstance(s, IfThenElse)
                    and "a_one" in str(s.then_body)]
        assert branches, f
