"""block-convolutions warns when convolutions over a symbolic image size are left on
their generic loops (a correct but far slower path: grouped layers that are not
depthwise; ungrouped and depthwise ones take kernels for run-time image sizes, tests/ops/
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


def conv_net(dims: tuple[int | str, ...]) -> onnx.ModelProto:
    """Conv 3x3 in 2 groups (4 -> 8, pads 1) + ReLU + Conv 1x1 in 2 groups (8 -> 8) on an
    input of `dims`."""
    gb = GraphBuilder(seed=7)
    x = gb.input("x", dims)
    y = gb.conv(gb.op("Relu", gb.conv(x, 4, 8, 3, group=2)), 8, 8, 1, group=2)
    gb.output(y, typed=False)
    return gb.model(check=False)


def conv_kernels(ex: kiln.Executable) -> list[str]:
    return [f.attrs["kiln.conv_kernel"] for f in ex.ir.functions.values()
            if "kiln.conv_kernel" in f.attrs]


def test_a_symbolic_image_size_warns_and_still_matches_onnxruntime() -> None:
    model = conv_net((1, 4, "height", "width"))
    with pytest.warns(PerformanceWarning, match=r"2 convolution\(s\) over a symbolic image "
                      r"size \(in height, width\).*shape_dict=\{'height': \.\.\., "
                      r"'width': \.\.\.\}.*--shape height="):
        ex = kiln.compile(from_onnx(model), "llvm")
    assert conv_kernels(ex) == []  # the generic loops: what the warning is about
    for hw in ((5, 7), (12, 3)):
        x = RNG.standard_normal((1, 4, *hw)).astype(np.float32)
        want = ort_session(model).run(None, {"x": x})[0]
        np.testing.assert_allclose(ex["main"](x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pin", [{"height": 6, "width": 6}, None])
def test_static_or_batch_only_symbolic_images_take_the_tiled_kernels(
        pin: dict[str, int] | None) -> None:
    # pinned by shape_dict, or only the batch symbolic (the kernels take it)
    model = conv_net((1, 4, "height", "width") if pin else ("batch", 4, 6, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        ex = kiln.compile(from_onnx(model, shape_dict=pin), "llvm")
    assert len(conv_kernels(ex)) == 2
