"""NCHW{b}c convolutions over a run-time input width (kiln.kernels.conv.run_time_width)
against onnxruntime.

Two branches read 16 and 48 channels (one and three blocks at 16 lanes) at one image
size, each through a 1x1 layer, then a padded stride-2 3x3 layer into 32 channels and
a 1x1 layer into 32 channels (with a residual Add written one way in one branch and the
other way in the other): on AVX-512 each pair shares one kernel, called with its
input's channel blocks. A third branch reads 24 channels (a block and a half: a kernel
of its own at a static width). Two more run chains of 1x1 layers of other widths and
output channels at 10x10 and 16x16 (+ ReLU, + residual Add + ReLU, alone): each
epilogue's layers share one kernel, called with their input's channel blocks, output
channel tiles and image size; a fourth, at 8x8, has its own (another tile). Two more
put 5x5 layers with pads 2 between 1x1 layers at 12x12 (32 > 32 > 64) and 6x6
(32 > 64): the three share one kernel over their widths, output channel tiles and image
sizes (kiln.kernels.conv.direct.blocked_run_time_tiles). Batch 2;
llvm and c, in this process and in fresh processes with 1 and 2 threads.
"""

from __future__ import annotations

from pathlib import Path

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.ir.attrs import ATTR_ARG_DIMS
from kiln.kernels.conv.run_time_width import (
    HEIGHT_NAME,
    IMAGE_WIDTH_NAME,
    TILES_NAME,
    WIDTH_NAME,
)
from support.processes import outputs_in_fresh_process

TOL = 1e-4
RNG = np.random.default_rng(5)


def build_model() -> onnx.ModelProto:
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(x: str, out: str, ci: int, co: int, k: int, stride: int, pad: int) -> str:
        w = numpy_helper.from_array(
            RNG.normal(0, 1 / np.sqrt(ci * k * k), (co, ci, k, k)).astype(np.float32),
            out + "_w")
        b = numpy_helper.from_array(RNG.normal(0, 0.1, co).astype(np.float32), out + "_b")
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [out], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        return out

    def relu(x: str, out: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    for name, ci in (("x", 16), ("y", 48), ("z", 24)):
        a = relu(conv(name, f"{name}a0", ci, ci, 1, 1, 0), f"{name}a")
        relu(conv(a, f"{name}s0", ci, 32, 3, 2, 1), f"{name}s")
        p = relu(conv(a, f"{name}p0", ci, 32, 1, 1, 0), f"{name}p")
        q = conv(a, f"{name}q0", ci, 32, 1, 1, 0)
        # the residual on either side of the Add: one kernel (kiln.transform.fuse_ops)
        nodes.append(helper.make_node("Add", [q, p] if name == "x" else [p, q], [f"{name}r0"]))
        relu(f"{name}r0", f"{name}r")
    # 1x1 layers of other output channels at other image sizes, each + ReLU, the third
    # with the first one's output added (either way), then alone into the other width
    # and + ReLU into 64: 64 > 128 > 128 > 128 > 64 > 64 at 10x10 and 128 > 64 > 64 > 64 >
    # 128 > 64 at 16x16. Tiles of 64 channels x 6 positions leave 4 in the last one at
    # both sizes: one kernel per epilogue. 64 > 64 at 8x8 (tiles of 5 positions) has its
    # own, called three times.
    for name, ci, co in (("u", 64, 128), ("v", 128, 64)):
        a = relu(conv(name, f"{name}a0", ci, co, 1, 1, 0), f"{name}a")
        b = relu(conv(a, f"{name}b0", co, co, 1, 1, 0), f"{name}b")
        q = conv(b, f"{name}q0", co, co, 1, 1, 0)
        nodes.append(helper.make_node("Add", [q, a] if name == "u" else [a, q],
                                      [f"{name}r0"]))
        r = relu(f"{name}r0", f"{name}r")
        relu(conv(conv(r, f"{name}s0", co, ci, 1, 1, 0), f"{name}t0", ci, 64, 1, 1, 0),
             f"{name}t")
    w = "w"
    for k in range(3):
        w = relu(conv(w, f"w{k}0", 64, 64, 1, 1, 0), f"w{k}")
    # 5x5 layers with pads 2 (+ ReLU) between 1x1 layers (a blocked region), of other
    # widths, output channels and image sizes: 32 > 32 > 64 at 12x12 and 32 > 64 at 6x6
    # share one kernel
    for name in "km":
        a = relu(conv(name, f"{name}a0", 16, 32, 1, 1, 0), f"{name}a")
        if name == "k":
            a = relu(conv(a, f"{name}f0", 32, 32, 5, 1, 2), f"{name}f")
        b = relu(conv(a, f"{name}g0", 32, 64, 5, 1, 2), f"{name}g")
        relu(conv(b, f"{name}h0", 64, 32, 1, 1, 0), f"{name}h")
    sizes = (("x", 16, 10), ("y", 48, 10), ("z", 24, 10), ("u", 64, 10), ("v", 128, 16),
             ("w", 64, 8), ("k", 16, 12), ("m", 16, 6))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, ci, hw, hw])
              for n, ci, hw in sizes]
    outputs = [helper.make_tensor_value_info(f"{n}{o}", TensorProto.FLOAT, None)
               for n, o in (*((n, o) for n in "xyz" for o in "sr"), ("u", "t"), ("v", "t"),
                            ("w", "2"), ("k", "h"), ("m", "h"))]
    return kernel_checks.branches_model("widths", nodes, inputs, outputs, inits)


MODEL = build_model()
CASES = [*(f"{n} {o}" for n in ("16 channels", "48 channels", "24 channels")
           for o in ("3x3 stride 2", "1x1 + residual")),
         "64 > 128 > 128 > 128 > 64 > 64 at 10x10", "128 > 64 > 64 > 64 > 128 > 64 at 16x16",
         "64 > 64 > 64 > 64 at 8x8", "5x5 32 > 32 > 64 at 12x12", "5x5 32 > 64 at 6x6"]
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
FEEDS, assert_close = CHECKS.feeds, CHECKS.assert_close
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    assert_close(list(native(*FEEDS.values())), reference)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    threads: int, reference: list[np.ndarray]) -> None:
    assert_close(outputs_in_fresh_process(native, FEEDS, tmp_path, threads), reference)


def test_layers_of_whole_blocks_share_a_kernel() -> None:
    kernels, calls = kernel_checks.kernel_calls(
        MODEL, "llvm -mcpu=znver4",
        lambda name, f: f.attrs.get("kiln.conv_kernel") == "conv2d_nchwc")
    dims = {name: tuple(d[0] for d in f.attrs.get(ATTR_ARG_DIMS, ()))
            for name, f in kernels.items()}
    tiled = (WIDTH_NAME, TILES_NAME, HEIGHT_NAME, IMAGE_WIDTH_NAME)
    for name, f in kernels.items():
        x, w = f.buffer_params[:2]
        if dims[name] == (WIDTH_NAME,):
            assert f.attrs[ATTR_ARG_DIMS] == ((WIDTH_NAME, 0, 1),)
            assert x.shape[1].name == WIDTH_NAME and WIDTH_NAME in str(w.shape[2])
        elif dims[name]:
            assert f.attrs[ATTR_ARG_DIMS] == ((WIDTH_NAME, 0, 1), (TILES_NAME, 1, 1),
                                              (HEIGHT_NAME, 0, 2), (IMAGE_WIDTH_NAME, 0, 3))
            out = f.buffer_params[-1]
            assert [d.name for d in x.shape[1:4]] == [WIDTH_NAME, HEIGHT_NAME, IMAGE_WIDTH_NAME]
            assert w.shape[1].name == TILES_NAME and TILES_NAME in str(out.shape[1])
            assert [d.name for d in out.shape[2:4]] == [HEIGHT_NAME, IMAGE_WIDTH_NAME]
    # over a run-time width alone: the 3x3 stride-2 layer, shared by the 16 and the 48
    # channel branch
    assert sorted(calls[n] for n in kernels if dims[n] == (WIDTH_NAME,)) == [2]
    # over run-time output channel tiles and image size too: the first 1x1 layer of the
    # 16 and of the 48 channel branch (tiles of 16 and 48 channels: one each); shared by
    # the two, the 1x1 + ReLU and the 1x1 + Add + ReLU into 32; shared by the 10x10 and
    # the 16x16 branch (other widths, output channels and image sizes), the six 1x1 +
    # ReLU, the two 1x1 + Add + ReLU and the two 1x1 alone; the 8x8 branch's three; the
    # 12x12 and the 6x6 branch's first and last 1x1 layers, two each
    one = {n for n, f in kernels.items()
           if [str(d) for d in f.buffer_params[1].shape[3:5]] == ["1", "1"]}
    assert sorted(calls[n] for n in one if dims[n] == tiled) == [1, 1, 2, 2, 2, 2, 2, 2, 3, 6]
    # the 5x5 layers with pads 2 of the 12x12 and the 6x6 branch: one kernel
    assert sorted(calls[n] for n in kernels if dims[n] == tiled and n not in one) == [3]
    # the 24 channel branch's four at their width
    assert sorted(calls[n] for n in kernels if not dims[n]) == [1, 1, 1, 1]
