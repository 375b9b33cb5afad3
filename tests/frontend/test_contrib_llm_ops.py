"""The contrib ops decoder-LLM exporters write (kiln/frontend/onnx/converters/contrib_llm.py)
against onnxruntime, on llvm and c, with a symbolic batch and sequence: the RMSNorm family
and SkipLayerNormalization (every output), and MatMulNBits with weights packed by
onnxruntime's own MatMulNBitsQuantizer (4 and 8 bits, symmetric and not, blocks of 32
and 128, K not a multiple of the block) or by hand (g_idx, float zero points, 2 bits).
One model per group, compiled once per target."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import PerformanceWarning
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

MS = "com.microsoft"
HIDDEN = 64
SHAPES = ((2, 5), (1, 1), (3, 17))  # (batch, seq) the libraries run at
TARGETS = ["llvm", "c"]


def _model(b: GraphBuilder) -> onnx.ModelProto:
    return b.model(opset={"": 17, MS: 1}, check=False)


def norms_model() -> onnx.ModelProto:
    """SimplifiedLayerNormalization (with inv_std_var), SkipSimplifiedLayerNormalization
    (bias, a (seq, hidden) skip, all four outputs) and SkipLayerNormalization (beta,
    bias, all four outputs), as onnxruntime-genai's builder chains them."""
    b = GraphBuilder(seed=3)
    x = b.input("x", ["batch", "seq", HIDDEN])
    skip = b.input("skip", ["seq", HIDDEN])
    gamma = b.const(b.rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "gamma")
    bias = b.const(b.rng.normal(0, 0.1, HIDDEN).astype(np.float32), "bias")
    beta = b.const(b.rng.normal(0, 0.1, HIDDEN).astype(np.float32), "beta")
    b.node("SimplifiedLayerNormalization", [x, gamma], ["rms", "rms_inv"], epsilon=1e-6)
    b.node("SkipSimplifiedLayerNormalization", ["rms", skip, gamma, bias],
           ["srms", "srms_mean", "srms_inv", "srms_sum"], domain=MS, epsilon=1e-6)
    b.node("SkipLayerNormalization", ["srms_sum", x, gamma, beta, bias],
           ["sln", "sln_mean", "sln_inv", "sln_sum"], domain=MS, epsilon=1e-5)
    # the residual stream as the builder writes it: output 0 and output 3 only
    b.node("SkipSimplifiedLayerNormalization", ["sln", "sln_sum", gamma],
           ["last", "", "", "last_sum"], domain=MS)
    for name in ("rms", "rms_inv", "srms", "srms_mean", "srms_inv", "srms_sum", "sln",
                 "sln_mean", "sln_inv", "sln_sum", "last", "last_sum"):
        b.output(name, typed=False)
    return _model(b)


@pytest.fixture(scope="module", params=TARGETS)
def norms(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, kiln.Executable]:
    model = norms_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)  # GenericKernelWarning included
        exe = kiln.compile(from_onnx(model), request.param)
    return model, exe


def test_rms_norms_and_skip_layer_norm_match_onnxruntime(norms) -> None:  # type: ignore[no-untyped-def]
    model, exe = norms
    assert "generic_kernels" not in exe.metadata
    rng = np.random.default_rng(5)
    for batch, seq in SHAPES:
        feeds = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32) * 3,
                 "skip": rng.standard_normal((seq, HIDDEN)).astype(np.float32)}
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        for name, g, w in zip([o.name for o in model.graph.output], got, want):
            g = np.asarray(g)
            assert g.shape == w.shape, name
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {seq}")

