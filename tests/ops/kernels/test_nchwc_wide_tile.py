"""The NCHWc family's wide tile (kiln.kernels.conv.nchwc.wide_tile): on AVX-512, a layer
that is not 1x1 over a large image (112x112 and up) whose output channels fill tiles of
four vectors takes 64 channels x 4 positions instead of the blocked rule's 32 x 6 (each
channel tile sweeps the whole input, which comes from L3 at that size). The rule per
ISA and size, the tile recorded on the call and read by lowering, and the outputs of a
chain of such layers against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.kernels.conv.nchwc import WIDE_TILE_POSITIONS, wide_tile
from kiln.target import Target
from kiln.target.isa import isa_for
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

AVX512 = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4"
SIZE = 112


def test_the_rule_per_isa_channels_and_size() -> None:
    avx512 = isa_for(Target(AVX512))
    assert wide_tile(128, SIZE * SIZE, avx512) == (64, 4)
    assert wide_tile(64, 224 * 224, avx512) == (64, 4)
    # channels not whole tiles of 4 vectors; a smaller image; AVX2 and NEON
    assert wide_tile(96, SIZE * SIZE, avx512) is None
    assert wide_tile(256, WIDE_TILE_POSITIONS - 1, avx512) is None
    assert wide_tile(128, SIZE * SIZE, isa_for(Target(AVX512 + " -mattr=-avx512f"))) is None
    assert wide_tile(128, SIZE * SIZE, isa_for(Target(
        "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"))) is None


def chain(channels: int) -> onnx.ModelProto:
    """An RGB image through a 3x3 layer to `channels`, then three 3x3 layers (a VGG
    stage): one NCHW{b}c region, its first layer reading the image in place."""
    gb = GraphBuilder(seed=11)
    x = gb.op("Relu", gb.conv(gb.input("x", [1, 3, SIZE, SIZE]), 3, channels, 3))
    for _ in range(3):
        x = gb.op("Relu", gb.conv(x, channels, channels, 3))
    gb.output(x, [1, channels, SIZE, SIZE])
    return gb.model()


@pytest.mark.parametrize("channels", [64, 128])
def test_a_large_image_takes_the_wide_tile_and_matches_onnxruntime(channels: int) -> None:
    model = chain(channels)
    ex = kiln.compile(from_onnx(model), AVX512)
    kernels = {f.params[1].shape[-1] for f in ex.ir.prim_funcs().values()
               if f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc"}
    assert kernels == {64}, kernels  # every layer's packed weight: 64 channels per tile
    host = Target.from_host()
    if wide_tile(channels, SIZE * SIZE, isa_for(host)) is None:
        pytest.skip("this host has no AVX-512: the wide tile's code cannot run here")
    x = np.random.default_rng(2).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    (want,) = onnxruntime_outputs(model, {"x": x})
    got = np.asarray(kiln.compile(from_onnx(model), host)["main"](x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
