"""`pool2d_nchwc`'s hand-built kernel (kiln.kernels.pool.nchwc): max and average
pools inside a blocked region, against onnxruntime on llvm and c.

Each model is conv 3x3 + ReLU -> the pool -> conv 3x3 -> conv 3x3 -> conv 1x1 (a region
that pays whichever kernel the first layer takes), compiled with the
`nchwc` graph pipeline, so the pool runs on NCHW{b}c activations between blocked
convolutions; 36 channels leave padding lanes in the last block of 8 or 16. The pools cover what
networks use (VGG's 2x2/2, ResNet's padded 3x3/2, SqueezeNet's 3x3/2 with and without
`ceil_mode`, Inception's 3x3/1 branch pool, average pools with and without
`count_include_pad`) and what ONNX allows beside (dilations, asymmetric pads), on
images whose windows are all borders (5x5) and with interior runs (13x13, 18x11).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir.tensor import CallFunc
from kiln.ir.visitor import iter_stmts
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import native_target

CHANNELS = 36
POOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "vgg_2x2_s2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "resnet_3x3_s2_pad": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                      "pads": [1, 1, 1, 1]}),
    "squeezenet_3x3_s2": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "squeezenet_3x3_s2_ceil": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                           "ceil_mode": 1}),
    "branch_3x3_s1_pad": ("MaxPool", {"kernel_shape": [3, 3], "strides": [1, 1],
                                      "pads": [1, 1, 1, 1]}),
    "dilated": ("MaxPool", {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 2],
                            "pads": [2, 1, 1, 0]}),
    "asymmetric": ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1],
                               "pads": [0, 2, 1, 0]}),
    "avg_3x3_s1_pad": ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "avg_3x3_s1_pad_counted": ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                               "count_include_pad": 1}),
    "avg_3x3_s2_ceil_counted": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                                "count_include_pad": 1}),
    "avg_2x2_s2": ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
}
SIZES = ((13, 13), (18, 11), (5, 5))


def _region(gb: GraphBuilder, x: str, pool: str, attrs: dict[str, Any]) -> str:
    """conv 3x3 + ReLU -> the pool -> conv 3x3 -> conv 3x3 -> conv 1x1 over `x`."""
    y = gb.op(pool, gb.op("Relu", gb.conv(x, CHANNELS, CHANNELS, 3)), **attrs)
    for k in (3, 3, 1):
        y = gb.conv(y, CHANNELS, CHANNELS, k)
    return y


def model(pool: str, attrs: dict[str, Any], h: int, w: int) -> onnx.ModelProto:
    gb = GraphBuilder(seed=h * 31 + w)
    gb.output(_region(gb, gb.input("x", [1, CHANNELS, h, w]), pool, attrs), None)
    return gb.model(check=False)


def _image(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h).standard_normal((1, CHANNELS, h, w)).astype(np.float32)


# Every pool at every size, one region each (an input and an output per (case, size)), in
# one model: one build per target serves every case, and regions of the same shapes
# share their kernels.
REGIONS = [(case, h, w) for case in sorted(POOLS) for h, w in SIZES]


def _every_region() -> onnx.ModelProto:
    gb = GraphBuilder(seed=1)
    for case, h, w in REGIONS:
        x = gb.input(f"x_{case}_{h}x{w}", [1, CHANNELS, h, w])
        gb.output(_region(gb, x, *POOLS[case]), None)
    return gb.model(check=False)


@pytest.fixture(scope="module")
def every_region() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """The model of every region, its feeds and onnxruntime's outputs (in REGIONS order)."""
    m = _every_region()
    feeds = {f"x_{case}_{h}x{w}": _image(h, w) for case, h, w in REGIONS}
    return m, feeds, onnxruntime_outputs(m, feeds)


@pytest.fixture(scope="module", params=["llvm", "c"])
def blocked(request: pytest.FixtureRequest, every_region: Any) -> tuple[Any, list[np.ndarray]]:
    """`every_region` compiled with the `nchwc` graph pipeline for one target, and its
    outputs."""
    m, feeds, _ = every_region
    ex = kiln.compile(from_onnx(m), native_target(request.param), graph_pipeline="nchwc")
    return ex, [np.asarray(y) for y in ex["main"](*feeds.values())]


def test_every_pool_runs_the_hand_built_kernel_on_nchwc(blocked: Any) -> None:
    ex, _ = blocked
    pools = [f for f in ex.ir.prim_funcs().values() if "kiln.pool_kernel" in f.attrs]
    # the hand-built kernel, on NCHW{b}c, for the pool of every region
    assert len({f.attrs["kiln.pool_kernel"] for f in pools}) == 1
    assert all(f.attrs["kiln.pool_kernel"] == "pool2d_nchwc" and f.params[0].ndim == 5
               for f in pools)
    names = {name for name, f in ex.ir.prim_funcs().items() if "kiln.pool_kernel" in f.attrs}
    calls = [s for s in iter_stmts(ex.ir["main"].body)
             if isinstance(s, CallFunc) and s.func in names]
    assert len(calls) == len(REGIONS)


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pool_in_a_blocked_region_matches_onnxruntime(case: str, blocked: Any,
                                                      every_region: Any) -> None:
    _, got = blocked
    want = every_region[2]
    for k, (name, h, w) in enumerate(REGIONS):
        if name == case:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{h}x{w}")


@pytest.mark.parametrize("case", ["resnet_3x3_s2_pad", "dilated"])
def test_max_pool_treats_nan_like_the_nchw_kernel(case: str) -> None:
    """NaN and infinities reach the pool through the first convolution (which turns the
    infinities into NaN around them): the blocked kernel skips NaN as the NCHW kernel
    does (MaxPool's rule, kiln.ops.pool's `window_max`; a dilated window
    keeps a leading NaN), so the model's outputs equal those of the default pipeline,
    NaN where they have NaN."""
    op, attrs = POOLS[case]
    m = model(op, attrs, 13, 13)
    blocked = kiln.compile(from_onnx(m), native_target("llvm"), graph_pipeline="nchwc")
    pools = [f for f in blocked.ir.prim_funcs().values() if "kiln.pool_kernel" in f.attrs]
    assert pools and all(f.attrs["kiln.pool_kernel"] == "pool2d_nchwc" for f in pools)
    plain = kiln.compile(from_onnx(m), native_target("llvm"))
    x = np.random.default_rng(5).standard_normal((1, CHANNELS, 13, 13)).astype(np.float32)
    x[0, 3, 4, 4], x[0, 5, 0, 0], x[0, 7, 12, 12] = np.inf, -np.inf, np.nan
    got, want = np.asarray(blocked["main"](x)), np.asarray(plain["main"](x))
    assert np.isfinite(want).any() and not np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # NaN where NaN
