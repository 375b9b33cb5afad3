"""A quantize_dynamic model's residual layer norm over a symbolic row count (batch x seq)
runs onnxruntime's SkipLayerNormalization arithmetic, as its pinned build does
(kiln.kernels.rows.welford_symbolic): against onnxruntime and against the pinned build,
bit for bit, on llvm, c and the AVX2 path, at row counts of 0, 1, under one vector of
lanes, a whole group of Welford lanes and a group plus a partial one."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from kiln.target.isa import isa_for
from quantization.quantized_models import MAX_REL_L2, quantize_dynamic_model, rel_l2
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

AVX2 = "llvm -mcpu=znver4 -mattr=-avx512f"
TARGETS = ("llvm", "c", AVX2)
WIDTH = 40  # no multiple of the vector width: the rows' chunks have a tail
#: (batch, seq): rows 0, 1, 13 (one narrow class), 64 (whole groups of 64 or 32 lanes),
#: 69 (a group and a partial one)
SIZES = [(2, 0), (1, 1), (1, 13), (2, 32), (3, 23)]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    b = GraphBuilder()
    rng = np.random.default_rng(3)
    b.node("MatMul", ["x", "w"], ["p"])
    b.node("Add", ["p", "x"], ["s"])  # the residual sum: onnxruntime's SkipLayerNorm
    b.node("LayerNormalization", ["s", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5)
    b.node("MatMul", ["n", "w2"], ["y"])
    b.input("x", ["batch", "seq", WIDTH])
    b.output("n", ["batch", "seq", WIDTH])
    b.output("y", ["batch", "seq", 8])
    b.consts({"w": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.2,
              "w2": rng.standard_normal((WIDTH, 8)).astype(np.float32),
              "gamma": rng.standard_normal(WIDTH).astype(np.float32),
              "beta": rng.standard_normal(WIDTH).astype(np.float32)})
    return quantize_dynamic_model(b.model(name="residual_ln_int8", ir_version=None))


_BUILDS: dict[str, Any] = {}


def _compiled(model: onnx.ModelProto, target: str) -> Any:
    if target not in _BUILDS:
        _BUILDS[target] = kiln.compile(from_onnx(model), like_onnxruntime(target))
    return _BUILDS[target]


def _feeds(size: tuple[int, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(size))
    return {"x": rng.standard_normal((*size, WIDTH)).astype(np.float32)}


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_residual_layer_norm_matches_onnxruntime(model: onnx.ModelProto,
                                                          target: str) -> None:
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host does not run {target}")
    ex = _compiled(model, target)
    kernels = [f for f in ex.ir.prim_funcs().values()
               if f.attrs.get("kiln.row_kernel") == "layer_norm"]
    # Welford's statistics: a running mean per lane
    assert kernels and all(any(isinstance(s, Allocate) and s.buffer.name == "w_mean"
                               for s in iter_stmts(f.body)) for f in kernels)
    for size in SIZES:
        feeds = _feeds(size)
        want_n, want_y = onnxruntime_outputs(model, feeds)
        got_n, got_y = (np.asarray(v) for v in ex["main"](*feeds.values()))
        assert got_n.shape == want_n.shape and got_y.shape == want_y.shape, size
        np.testing.assert_allclose(got_n, want_n, rtol=1e-5, atol=1e-5, err_msg=str(size))
        assert rel_l2(got_y, want_y) < MAX_REL_L2 or not want_y.size, (target, size)


def test_symbolic_residual_layer_norm_equals_the_pinned_build(model: onnx.ModelProto) -> None:
    size = SIZES[-1]
    feeds = _feeds(size)
    # on c, whose builds compile fastest (the kernels are the same IR on every codegen)
    pinned = kiln.compile(from_onnx(model, shape_dict={"batch": size[0], "seq": size[1]}),
                          like_onnxruntime("c"))
    for got, want in zip(_compiled(model, "c")["main"](*feeds.values()),
                         pinned["main"](*feeds.values())):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
