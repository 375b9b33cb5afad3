"""LRN rounds as onnxruntime's CPU kernel rounds: bit for bit (kiln.ops.lrn).

Quantized Inception keeps LRN in float between a DequantizeLinear and a QuantizeLinear,
so one ulp apart flips a quantized value. onnxruntime runs single-threaded here: its
thread pool's blocks may start at elements that are not a multiple of 4 apart, and
Eigen computes such block edges with libm's `powf` instead of its vector `pow`
(docs/quantization.md, "LRN").
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ops.registry import get_op
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

# (size, alpha, beta, bias): Inception's, the integer-exponent path (beta 1: x / scale)
# with a large alpha (scales far from 1), a wide window
CONFIGS = [(5, 1e-4, 0.75, 1.0), (3, 0.5, 1.0, 2.0), (7, 2.0, 0.6, 0.5)]
# two images; a chunk of 16 lanes and a tail of 4 along the last axis
SHAPE = (2, 6, 2, 20)
# bias 0, size 1: in channel 0 (whose scale is bias + a x^2 exactly, no running sum) a
# zero x has scale 0 and 0 ** -beta = inf (the kernel's guard, as IEEE pow), so
# y = 0 * inf = nan; x = 1 has scale 1 and y = 1
ZERO_SCALE = (1, 1.0, 0.75, 0.0)


def _model() -> onnx.ModelProto:
    b = GraphBuilder()
    b.input("x", SHAPE)
    for k, (size, alpha, beta, bias) in enumerate([*CONFIGS, ZERO_SCALE]):
        b.node("LRN", ["x"], [f"y{k}"], size=size, alpha=alpha, beta=beta, bias=bias)
        b.output(f"y{k}", SHAPE)
    return b.model(opset=13)


@pytest.fixture(scope="module")
def case() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    x = (np.random.default_rng(0).standard_normal(SHAPE) * 8).astype(np.float32)
    x[1, 0, 0] = 0.0
    x[1, 0, 1] = 1.0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = _model()
    return model, {"x": x}, onnxruntime_outputs(model, {"x": x}, options)


# "c" without fused multiply-adds (Dekker's split products), AVX2 with them (kiln.ops.ort_pow)
@pytest.mark.parametrize("target", ["llvm -mcpu=znver4 -mattr=-avx512f", "c"])
def test_lrn_equals_onnxruntime_bit_for_bit(case: tuple, target: str) -> None:
    model, feeds, want = case
    got = kiln.compile(from_onnx(model), target)["main"](*feeds.values())
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"output {k} on {target}")


def test_lrn_reference_equals_onnxruntime_bit_for_bit(case: tuple) -> None:
    # constant folding and the interpreter use the numpy reference
    _, feeds, want = case
    ref = get_op("lrn").reference
    got = [ref(feeds["x"], size=size, alpha=alpha, beta=beta, bias=bias)
           for size, alpha, beta, bias in [*CONFIGS, ZERO_SCALE]]
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
    assert np.isnan(got[-1][1, 0, 0]).all() and (got[-1][1, 0, 1] == 1.0).all()


@pytest.mark.parametrize("target", ["llvm", "c", "llvm -mcpu=znver4 -mattr=-avx512f"])
def test_lrn_over_a_symbolic_batch_takes_the_hand_built_kernel(target: str) -> None:
    """Exporters leave the batch dynamic: the kernel takes it as its outer loop's extent
    (no GenericKernelWarning), bit for bit with onnxruntime at batch 0, 1 and 3."""
    b = GraphBuilder()
    b.input("x", ("batch", *SHAPE[1:]))
    size, alpha, beta, bias = CONFIGS[0]
    b.node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    b.output("y", ("batch", *SHAPE[1:]))
    model = b.model(opset=13)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.errors.GenericKernelWarning)
        fn = kiln.compile(from_onnx(model), target)["main"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for batch in (0, 1, 3):
        x = (np.random.default_rng(batch).standard_normal((batch, *SHAPE[1:])) * 8).astype(
            np.float32)
        [want] = onnxruntime_outputs(model, {"x": x}, options)
        np.testing.assert_array_equal(np.asarray(fn(x)), want, err_msg=f"batch {batch}")


@pytest.mark.parametrize("roots", [True, False])
def test_nchwc_kernel_equals_its_reference(roots: bool) -> None:
    """`lrn_nchwc`'s kernel (kiln.kernels.lrn, run by the interpreter) sums each window
    across channel blocks as the numpy reference does, bit for bit: by square roots
    (beta 0.75) and by Eigen's pow (CONFIGS' beta 0.6 and a window of 7); zero padding
    channels stay zero."""
    from kiln.ir import IRModule, evaluate
    from kiln.kernels.lrn import LRN_NCHWC
    from kiln.ops import te
    from kiln.target import Target
    from kiln.target.isa import isa_for

    size, alpha, beta, bias = CONFIGS[0] if roots else CONFIGS[2]
    attrs = {"size": size, "alpha": alpha * 1e4 if roots else alpha, "beta": beta,
             "bias": bias, "roots": roots}
    x = (np.random.default_rng(5).standard_normal((2, 3, 2, 3, 4)) * 2).astype(np.float32)
    x[:, -1, :, :, 2:] = 0.0  # 10 channels padded to 12
    arg = te.placeholder(x.shape, "float32", "x0")
    func = LRN_NCHWC.lower_fused([arg], [arg], attrs, None, None, "lrn_nchwc",
                                 isa_for(Target("llvm -mcpu=znver5")))
    assert func is not None
    got = np.zeros_like(x)
    evaluate(IRModule({"kernel": func}), "kernel", x, got)
    want = get_op("lrn_nchwc").reference(x, **attrs)
    np.testing.assert_array_equal(got, want)
    assert not got[:, -1, :, :, 2:].any()
