"""The int8 dot form on x86 targets without VNNI (AVX2, AVX-512BW: `vpmaddwd` on words
of int16 pairs, `dot2_i16`, kiln/kernels/int8/dot.py) is exact on the inputs that saturate a
plain `vpmaddubsw`: adjacent weights of -128 and 127 against activations of 255, for
every signedness of A and B that MatMulInteger allows, against numpy's int64 product;
and the convolution tiles sized for them, against onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from quantized_models import qlinear_conv_model

import kiln
from kiln.frontend import from_onnx
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

# VNNI hidden by the CPU (haswell: AVX2) or by mattr (Zen 4 without its VNNI: AVX-512BW)
TARGETS = ["llvm -mcpu=haswell", "llvm -mcpu=znver4 -mattr=-avx512vnni,-avxvnni"]
M, K, N = 5, 27, 70  # a partial word of k, partial row and column tiles


def worst_weights(unsigned: bool) -> np.ndarray:
    """Columns of -128s, of 127s, of both alternating (in pairs and in words), then random
    ones; as uint8 with zero point 128 when `unsigned` (the same values after it)."""
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (K, N))
    w[:, 0], w[:, 1] = -128, 127
    w[:, 2] = np.where(np.arange(K) % 2, 127, -128)
    w[:, 3] = np.where(np.arange(K) // 2 % 2, 127, -128)
    return (w + 128).astype(np.uint8) if unsigned else w.astype(np.int8)


def worst_activations(signed: bool) -> np.ndarray:
    """Rows of the largest bytes, the smallest, then random ones (as the kernel's unsigned
    bytes: an int8 A is shifted by 128, so 127 becomes 255)."""
    lo, hi = (-128, 127) if signed else (0, 255)
    a = np.random.default_rng(12).integers(lo, hi + 1, (M, K))
    a[0], a[1] = hi, lo
    return a.astype(np.int8 if signed else np.uint8)


CASES = [(a_signed, b_unsigned) for a_signed in (False, True) for b_unsigned in (False, True)]


def model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One MatMulInteger per (A, B) signedness in one graph (one compile per target):
    the model, its feeds and numpy's product for each output."""
    gb = GraphBuilder()
    feeds, want = {}, {}
    for a_signed, b_unsigned in CASES:
        tag = f"{'s' if a_signed else 'u'}{'u' if b_unsigned else 's'}"
        a, b = worst_activations(a_signed), worst_weights(b_unsigned)
        a_zp = np.int8(-3) if a_signed else np.uint8(200)
        b_zp = np.uint8(128) if b_unsigned else np.int8(0)
        feeds[f"a_{tag}"] = a
        gb.input(f"a_{tag}", [M, K], TensorProto.INT8 if a_signed else TensorProto.UINT8)
        gb.consts({f"b_{tag}": b, f"az_{tag}": a_zp, f"bz_{tag}": b_zp})
        gb.node("MatMulInteger", [f"a_{tag}", f"b_{tag}", f"az_{tag}", f"bz_{tag}"],
                [f"y_{tag}"])
        gb.output(f"y_{tag}", [M, N], TensorProto.INT32)
        product = (a.astype(np.int64) - int(a_zp)) @ (b.astype(np.int64) - int(b_zp))
        want[f"y_{tag}"] = product.astype(np.int32)
    return gb.model(opset=13), feeds, want


@pytest.mark.parametrize("target", TARGETS)
def test_worst_case_products_are_exact(target: str) -> None:
    isa = isa_for(Target(target))
    assert isa.int8_dot in ("avx2", "avx512bw")  # VNNI hidden
    onnx_model, feeds, want = model()
    # every product kernel (one per A dtype) took the int16-pair dot form, none the int16
    # element tiles
    ex = kiln.compile(from_onnx(onnx_model), target)
    text = kiln.script.print_module(ex.ir)
    kernels = len(re.findall(r"def matmul_integer_packed", text))
    assert kernels == 2 and len(re.findall(r"T\.dot2_i16\(", text)) == kernels
    if not isa.features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host lacks {target}'s features: compiled, not run")
    got = ex["main"](*feeds.values())
    for (name, y_want), y in zip(want.items(), got, strict=True):
        np.testing.assert_array_equal(y, y_want, err_msg=name)


@pytest.mark.parametrize("target", TARGETS)
def test_conv_tiles_equal_onnxruntime(target: str) -> None:
    # 14 x 14 = 196 output positions (the last tile partial); worst-case weights in
    # channel 0
    rng = np.random.default_rng(13)
    model = qlinear_conv_model((1, 8, 14, 14), 6, 3, 1, 1, False, rng)
    w = next(t for t in model.graph.initializer if t.name == "w")
    weights = numpy_helper.to_array(w).copy()
    weights[0] = np.where(np.arange(72).reshape(8, 3, 3) % 2, 127, -128)
    w.CopyFrom(numpy_helper.from_array(weights, "w"))
    x = rng.integers(0, 256, (1, 8, 14, 14)).astype(np.uint8)
    x[..., :3, :] = 255
    ex = kiln.compile(from_onnx(model), like_onnxruntime(target))
    if not isa_for(Target(target)).features <= isa_for(Target.from_host()).features:
        pytest.skip(f"this host lacks {target}'s features: compiled, not run")
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {"x": x})[0])
