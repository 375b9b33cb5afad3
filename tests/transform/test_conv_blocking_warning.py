"""block-convolutions warns when convolutions over a symbolic image size are left on
their generic loops (a correct but far slower path: layers whose weight is computed, not
a constant; constant-weight ones take kernels for run-time image sizes, tests/ops/
kernels/test_symbolic_image_kernels.py) and says what to pin."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import PerformanceWarning
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.reference import ort_session

RNG = np.random.default_rng(7)


def conv_net(dims: tuple[int | str, ...], weights_given: bool = False) -> onnx.ModelProto:
    """Conv 3x3 (4 -> 8, pads 1) + ReLU + Conv 1x1 (8 -> 8) on an input of `dims`; with
    `weights_given`, each weight a graph input (what a model computing its weights gives
    the compiler), else a constant."""
    gb = GraphBuilder(seed=7)
    x = gb.input("x", dims)
    if not weights_given:
        y = gb.conv(gb.op("Relu", gb.conv(x, 4, 8, 3)), 8, 8, 1)
    else:
        w1, w2 = gb.input("w1", (8, 4, 3, 3)), gb.input("w2", (8, 8, 1, 1))
        y = gb.op("Conv", gb.op("Relu", gb.op("Conv", x, w1, kernel_shape=[3, 3],
                                              pads=[1, 1, 1, 1])), w2, kernel_shape=[1, 1])
    gb.output(y, typed=False)
    return gb.model(check=False)


W1 = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
W2 = RNG.standard_normal((8, 8, 1, 1)).astype(np.float32)


def conv_kernels(ex: kiln.Executable) -> list[str]:
    return [f.attrs["kiln.conv_kernel"] for f in ex.ir.functions.values()
            if "kiln.conv_kernel" in f.attrs]


def test_a_symbolic_image_size_warns_and_still_matches_onnxruntime() -> None:
    model = conv_net((1, 4, "height", "width"), weights_given=True)
    with pytest.warns(PerformanceWarning, match=r"2 convolution\(s\) over a symbolic image "
                      r"size \(in height, width\).*shape_dict=\{'height': \.\.\., "
                      r"'width': \.\.\.\}.*--shape height=") as caught:
        ex = kiln.compile(from_onnx(model), "llvm")
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert f"(node {convs[0]!r} (Conv), node {convs[1]!r} (Conv))" in str(caught[0].message)
    assert conv_kernels(ex) == []  # the generic loops: what the warning is about
    for hw in ((5, 7), (12, 3)):
        x = RNG.standard_normal((1, 4, *hw)).astype(np.float32)
        want = ort_session(model).run(None, {"x": x, "w1": W1, "w2": W2})[0]
        np.testing.assert_allclose(ex["main"](x, W1, W2), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pin", [{"height": 6, "width": 6}, None])
def test_static_or_batch_only_symbolic_images_take_the_tiled_kernels(
        pin: dict[str, int] | None) -> None:
    # pinned by shape_dict, or only the batch symbolic (the kernels take it)
    model = conv_net((1, 4, "height", "width") if pin else ("batch", 4, 6, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        ex = kiln.compile(from_onnx(model, shape_dict=pin), "llvm")
    assert len(conv_kernels(ex)) == 2
