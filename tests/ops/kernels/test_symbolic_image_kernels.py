"""Convolutions and max pools over an image of symbolic height and width (what exporters
write for detection and segmentation models) run hand-built kernels, not their generic
loops: ungrouped and grouped convolutions the GEMM families (im2col into a workspace
sized at run time), pools and depthwise layers a window kernel over padded planes. Each against
onnxruntime at several run-time sizes, tiny ones (smaller than the window, one pixel)
among them, on llvm and c."""

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

SIZES = ((1, 1), (2, 3), (7, 5), (19, 33), (40, 17))


def kernels(ex: kiln.Executable, attr: str) -> list[str]:
    return sorted(f.attrs[attr] for f in ex.ir.functions.values()
                  if hasattr(f, "attrs") and attr in f.attrs)


def check(model: onnx.ModelProto, target: str, channels: int, sizes=SIZES,
          dtype: type = np.float32) -> kiln.Executable:
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        ex = kiln.compile(from_onnx(model), target)
    rng = np.random.default_rng(3)
    session = ort_session(model)
    for hw in sizes:
        if dtype is np.float32:
            x = rng.standard_normal((2, channels, *hw)).astype(np.float32)
        else:
            x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (2, channels, *hw),
                             dtype=dtype)
        want = session.run(None, {"x": x})[0]
        got = np.asarray(ex["main"](x))
        assert got.shape == want.shape, hw
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(hw))
    return ex


def conv_model(k: int, stride: int, pads: list[int], dilation: int, cin: int = 3,
               cout: int = 5, residual: bool = False, group: int = 1) -> onnx.ModelProto:
    gb = GraphBuilder(seed=k * 10 + stride)
    x = gb.input("x", ("n", cin, "h", "w"))
    y = gb.op("Conv", x, gb.weight(cout, cin // group, k, k),
              gb.const(gb.rng.normal(0, 0.1, cout).astype(np.float32), "b"),
              kernel_shape=[k, k], strides=[stride, stride], pads=pads,
              dilations=[dilation, dilation], group=group)
    if residual:  # an epilogue reading a tensor shaped like the output
        y = gb.op("Relu", gb.op("Add", y, gb.op("Conv", y, gb.weight(cout, cout, 1, 1),
                                                kernel_shape=[1, 1])))
    gb.output(y, typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize(("k", "stride", "pads", "dilation"), [
    (3, 1, [1, 1, 1, 1], 1),
    (3, 2, [1, 1, 1, 1], 1),
    (1, 1, [0, 0, 0, 0], 1),
    (1, 2, [0, 0, 0, 0], 1),
    (5, 1, [2, 0, 1, 3], 1),      # asymmetric pads
    (3, 1, [2, 2, 2, 2], 2),      # dilated
    (7, 2, [3, 3, 3, 3], 1),      # a stem
])
def test_ungrouped_convolutions_take_the_gemm_kernel(target: str, k: int, stride: int,
                                                     pads: list[int], dilation: int) -> None:
    model = conv_model(k, stride, pads, dilation)
    # sizes the window does not fit without its pads are refused by both runtimes
    extent = dilation * (k - 1) + 1
    sizes = [hw for hw in SIZES
             if all(d + pads[j] + pads[j + 2] >= extent for j, d in enumerate(hw))]
    ex = check(model, target, 3, sizes)
    assert kernels(ex, "kiln.conv_kernel") == ["conv2d_gemm"]


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize(("k", "stride", "pads", "group"), [
    (1, 1, [0, 0, 0, 0], 3),      # ShuffleNet's pointwise layers
    (3, 2, [1, 1, 1, 1], 2),
    (3, 1, [1, 0, 0, 1], 3),
])
def test_grouped_convolutions_take_the_grouped_gemm_kernel(target: str, k: int, stride: int,
                                                           pads: list[int], group: int) -> None:
    sizes = [hw for hw in SIZES if all(d + pads[j] + pads[j + 2] >= k for j, d in enumerate(hw))]
    ex = check(conv_model(k, stride, pads, 1, cin=6, cout=12, group=group), target, 6, sizes)
    assert kernels(ex, "kiln.conv_kernel") == ["conv2d_group_gemm"]


def test_a_residual_epilogue_over_a_symbolic_image() -> None:
    ex = check(conv_model(3, 1, [1, 1, 1, 1], 1, cin=4, cout=8, residual=True), "llvm", 4)
    assert kernels(ex, "kiln.conv_kernel") == ["conv2d_gemm", "conv2d_gemm"]


def pool_model(k: int, stride: int, pads: list[int], elem: int = onnx.TensorProto.FLOAT,
               relu: bool = False, op: str = "MaxPool", **attrs: int) -> onnx.ModelProto:
    gb = GraphBuilder(seed=k)
    x = gb.input("x", ("n", 3, "h", "w"), elem)
    y = gb.op(op, x, kernel_shape=[k, k], strides=[stride, stride], pads=pads, **attrs)
    if relu:
        y = gb.op("Relu", y)
    gb.output(y, elem=elem, typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize(("k", "stride", "pads"), [
    (2, 2, [0, 0, 0, 0]),
    (3, 2, [1, 1, 1, 1]),
    (3, 1, [1, 1, 1, 1]),
    (3, 1, [0, 2, 1, 0]),
    (1, 1, [0, 0, 0, 0]),
    (5, 3, [4, 4, 4, 4]),      # pads one short of the window
])
def test_max_pools_take_the_window_kernel(target: str, k: int, stride: int,
                                           pads: list[int]) -> None:
    sizes = [hw for hw in SIZES
             if all(d + pads[j] + pads[j + 2] >= k for j, d in enumerate(hw))]
    ex = check(pool_model(k, stride, pads, relu=True), target, 3, sizes)
    assert kernels(ex, "kiln.pool_kernel")


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize(("k", "stride", "pads"), [
    (2, 2, [0, 0, 0, 0]),         # DenseNet's transitions
    (3, 1, [1, 1, 1, 1]),         # Inception's branches
    (3, 2, [0, 2, 1, 0]),
])
def test_average_pools_take_the_window_kernel(target: str, include_pad: int, k: int,
                                              stride: int, pads: list[int]) -> None:
    sizes = [hw for hw in SIZES
             if all(d + pads[j] + pads[j + 2] >= k for j, d in enumerate(hw))]
    ex = check(pool_model(k, stride, pads, relu=True, op="AveragePool",
                          count_include_pad=include_pad), target, 3, sizes)
    assert kernels(ex, "kiln.pool_kernel")


@pytest.mark.parametrize("elem,dtype", [(onnx.TensorProto.INT8, np.int8),
                                        (onnx.TensorProto.UINT8, np.uint8)])
def test_byte_max_pools_over_a_symbolic_image(elem: int, dtype: type) -> None:
    ex = check(pool_model(3, 2, [1, 1, 1, 1], elem), "llvm", 3, dtype=dtype)
    assert kernels(ex, "kiln.pool_kernel")


def test_a_max_pool_with_nan_and_infinities_equals_the_static_kernel() -> None:
    # MaxPool's rule (kiln.ops.pool's `window_max`): NaN skipped, in the
    # clamped kernel as in the static one, bit for bit, and onnxruntime's (its NaN comes
    # first in the window, where onnxruntime's vector kernel drops it too)
    model = pool_model(3, 2, [1, 1, 1, 1])
    ex = kiln.compile(from_onnx(model), "llvm")
    static = kiln.compile(from_onnx(model, shape_dict={"n": 1, "h": 9, "w": 8}), "llvm")
    x = np.random.default_rng(5).standard_normal((1, 3, 9, 8)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 1, 4, 4], x[0, 2, 8, 7] = np.nan, -np.inf, np.inf
    got = np.asarray(ex["main"](x))
    np.testing.assert_array_equal(got, np.asarray(static["main"](x)))
    assert not np.isnan(got).any() and got[0, 2, 4, 3] == np.inf
    np.testing.assert_array_equal(got, ort_session(model).run(None, {"x": x})[0])


def test_a_dilated_max_pool_with_nan_scans_as_onnxruntime() -> None:
    # a dilated window scanned from its first element inside the image (kiln.ops.pool's
    # scans_from_first): a leading NaN stays, later ones are skipped, -inf alone is -inf
    gb = GraphBuilder(seed=1)
    x = gb.input("x", ("n", 3, "h", "w"))
    gb.output(gb.op("MaxPool", x, kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 2],
                    pads=[2, 1, 1, 0]), typed=False)
    model = gb.model(check=False)
    ex = kiln.compile(from_onnx(model), "llvm")
    assert kernels(ex, "kiln.pool_kernel")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 9, 8)).astype(np.float32)
    mask = rng.random(x.shape) < 0.3
    x[mask] = rng.choice(np.array([np.nan, -np.inf, np.inf], np.float32), mask.sum())
    want = ort_session(model).run(None, {"x": x})[0]
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.asarray(ex["main"](x)), want)


def test_a_dilated_max_pool_over_a_symbolic_image() -> None:
    gb = GraphBuilder(seed=1)
    x = gb.input("x", ("n", 3, "h", "w"))
    gb.output(gb.op("MaxPool", x, kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 1, 1, 1]),
              typed=False)
    ex = check(gb.model(check=False), "llvm", 3, [(4, 5), (7, 5), (19, 33)])
    assert kernels(ex, "kiln.pool_kernel")


def depthwise_model(k: int, stride: int, pads: list[int], dilation: int) -> onnx.ModelProto:
    gb = GraphBuilder(seed=k + stride)
    x = gb.input("x", ("n", 6, "h", "w"))
    y = gb.op("Conv", x, gb.weight(6, 1, k, k),
              gb.const(gb.rng.normal(0, 0.1, 6).astype(np.float32), "b"),
              kernel_shape=[k, k], strides=[stride, stride], pads=pads,
              dilations=[dilation, dilation], group=6)
    gb.output(gb.relu6(y), typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize(("k", "stride", "pads", "dilation"), [
    (3, 1, [1, 1, 1, 1], 1),
    (3, 2, [1, 1, 1, 1], 1),
    (5, 2, [2, 2, 2, 2], 1),
    (3, 1, [0, 1, 2, 0], 1),
    (3, 1, [2, 2, 2, 2], 2),
])
def test_depthwise_convolutions_take_the_window_kernel(target: str, k: int, stride: int,
                                                       pads: list[int], dilation: int) -> None:
    extent = dilation * (k - 1) + 1
    sizes = [hw for hw in SIZES
             if all(d + pads[j] + pads[j + 2] >= extent for j, d in enumerate(hw))]
    ex = check(depthwise_model(k, stride, pads, dilation), target, 6, sizes)
    assert kernels(ex, "kiln.conv_kernel") == ["conv2d_depthwise"]
