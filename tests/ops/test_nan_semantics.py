"""NaN and infinities through kiln's comparison-based operators, against onnxruntime.

The rules are kiln.ops.nan_order's (docs/onnx.md, "Non-finite values"). Each group of
cases is one ONNX model of small tensors holding NaN and +-inf in every position of a
row (first, middle, last, all of it), compiled once per native target and also run by
the reference interpreter (every op lowered to its kernel) and by the ops' numpy
references (`kiln.evaluate`), each compared with onnxruntime by NaN-aware equality.
Where onnxruntime's own result depends on its vector lanes or its data structures
(ReduceMax over long contiguous rows, NonMaxSuppression with NaN scores), the
expected values come from the rule written out in numpy here, or from onnxruntime on
inputs where the rule and onnxruntime agree; Unique along an axis of slices holding
NaN is checked for one answer across kiln's backends. Last, each helper of
kiln.ops.nan_order on every pair of special values against its rule in numpy, on the
interpreter, llvm and c.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRBuilder, evaluate
from kiln.ir.tensor import PrimExpr, select
from kiln.ops import nan_order
from kiln.ops.nan_order import NanPlace
from kiln.transform.legalize_ops import LegalizeOps
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

pytest.importorskip("onnxruntime")

NAN, INF = np.nan, np.inf
F32, I64, F64 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.DOUBLE
# Every row of three values from these: NaN and +-inf first, in the middle, last,
# everywhere (125 rows); onnxruntime scans rows this short without vector lanes.
ROWS = np.array(list(itertools.product([NAN, INF, -INF, 1.0, -2.0], repeat=3)), np.float32)


def long_rows(n: int = 37) -> np.ndarray:
    """Rows longer than a vector (the row kernels' lanes and tail) with NaN or -inf at
    the first, a middle, the last position, all NaN, two NaNs, and none."""
    base = ((np.arange(n) * 7) % 11 - 5).astype(np.float32)
    rows = []
    for spots, value in [((0,), NAN), ((1,), NAN), ((17,), NAN), ((n - 1,), NAN),
                         (tuple(range(n)), NAN), ((3, 30), NAN), ((), NAN),
                         ((0,), -INF), (tuple(range(n)), -INF), ((0, 5), INF)]:
        row = base.copy()
        row[list(spots)] = value
        rows.append(row)
    return np.stack(rows)


@dataclass
class Group:
    """One model of independent cases: its outputs, named for the case, and feeds."""

    name: str
    opset: int
    builder: GraphBuilder = field(default_factory=GraphBuilder)
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    cases: list[str] = field(default_factory=list)
    # outputs checked against a rule of this file instead of onnxruntime (case -> rule)
    rules: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = field(
        default_factory=dict)
    # relative tolerance of the finite values (0: equal; NaN and infinities always equal)
    rtol: float = 0.0

    def input(self, name: str, value: np.ndarray) -> str:
        self.feeds[name] = value
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        return self.builder.input(name, list(value.shape), elem)

    def out(self, case: str, value: str, elem: int = F32) -> None:
        self.cases.append(case)
        self.builder.node("Identity", [value], [case])
        self.builder.output(case, None, elem)

    def model(self) -> onnx.ModelProto:
        return self.builder.model(opset=self.opset, name=self.name, check=False)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# --------------------------------------------------------------------------- groups

def order_group() -> Group:
    """Reductions, arg-reductions, Hardmax, ReduceLogSumExp and TopK (opset 13)."""
    g = Group("order", 13)
    b = g.builder
    rows, cols = g.input("rows", ROWS), g.input("cols", np.ascontiguousarray(ROWS.T))
    cube = g.input("cube", np.random.default_rng(5).permutation(ROWS.ravel())[:125]
                   .reshape(5, 5, 5))
    for op, fn in (("ReduceMax", np.fmax), ("ReduceMin", np.fmin)):
        g.out(f"{op}_rows", b.op(op, rows, axes=[1], keepdims=0))
        g.out(f"{op}_rows_keep", b.op(op, rows, axes=[1], keepdims=1))
        g.out(f"{op}_cols", b.op(op, cols, axes=[0], keepdims=0))
        g.out(f"{op}_leading", b.op(op, cube, axes=[0, 1], keepdims=0))
        # onnxruntime's middle-axis path loses values after some NaNs: the rule instead
        g.out(f"{op}_middle", b.op(op, cube, axes=[1], keepdims=1))
        g.rules[f"{op}_middle"] = axis_rule("cube", 1, fn)
    for op, last in itertools.product(("ArgMax", "ArgMin"), (0, 1)):
        g.out(f"{op}_rows_last{last}", b.op(op, rows, axis=1, keepdims=0,
                                            select_last_index=last), I64)
        g.out(f"{op}_cols_last{last}", b.op(op, cols, axis=0, select_last_index=last), I64)
    g.out("Hardmax_rows", b.op("Hardmax", rows, axis=1))
    g.out("Hardmax_cols", b.op("Hardmax", cols, axis=0))
    g.out("ReduceLogSumExp_rows", b.op("ReduceLogSumExp", rows, axes=[1], keepdims=0))
    for largest, k in itertools.product((1, 0), (1, 3)):
        values, indices = f"topk_v_{largest}_{k}", f"topk_i_{largest}_{k}"
        b.node("TopK", [rows, b.const(i64(k))], [values, indices], largest=largest)
        g.out(f"TopK_values_largest{largest}_k{k}", values)
        g.out(f"TopK_indices_largest{largest}_k{k}", indices, I64)
    # NaN of both signs, signed zeros (equal: by index)
    line = g.input("line", np.array([NAN, 3, 0.0, 1, -NAN, 2, -INF, INF, NAN, -0.0],
                                    np.float32))
    for largest in (1, 0):
        b.node("TopK", [line, b.const(i64(10))], [f"line_v{largest}", f"line_i{largest}"],
               largest=largest)
        g.out(f"TopK_line_values_largest{largest}", f"line_v{largest}")
        g.out(f"TopK_line_indices_largest{largest}", f"line_i{largest}", I64)
    long = g.input("long", long_rows())
    for op, last in itertools.product(("ArgMax", "ArgMin"), (0, 1)):
        g.out(f"{op}_long_last{last}", b.op(op, long, axis=1, select_last_index=last), I64)
    for op, fn in (("ReduceMax", np.fmax), ("ReduceMin", np.fmin)):
        g.out(f"{op}_long", b.op(op, long, axes=[1], keepdims=0))
        g.rules[f"{op}_long"] = rows_rule("long", fn)
    return g


def rows_rule(name: str, fn: np.ufunc) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The expected ReduceMax (fn np.fmax) or ReduceMin along the rows of feed `name`."""
    return lambda feeds: scan_rule(feeds[name], fn)


def axis_rule(name: str, axis: int, fn: np.ufunc
              ) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The expected ReduceMax (fn np.fmax) or ReduceMin of feed `name` over `axis`, kept."""
    def rule(feeds: dict[str, np.ndarray]) -> np.ndarray:
        x = np.moveaxis(feeds[name], axis, -1)
        out = scan_rule(x.reshape(-1, x.shape[-1]), fn).reshape(x.shape[:-1])
        return np.expand_dims(out, axis)
    return rule


def scan_rule(rows: np.ndarray, fn: np.ufunc) -> np.ndarray:
    """onnxruntime's reduction scan along each row, written out: a leading NaN stays,
    later NaNs are skipped (what its kernels do over leading axes and along short rows;
    elsewhere their vector lanes and paths decide)."""
    with np.errstate(invalid="ignore"):
        rest = fn.reduce(rows, axis=1)
    return np.where(np.isnan(rows[:, 0]), rows[:, 0], rest).astype(rows.dtype)


def bounds_group() -> Group:
    """Clip, Sign, Max and Min, ReduceMax with axes as an input, ScatterElements and
    ScatterND max and min, MaxPool with indices (opset 18)."""
    g = Group("bounds", 18)
    b = g.builder
    values = np.array([1, -2, 3, NAN, INF, -INF, 0.5, -0.0], np.float32)
    x = g.input("x", values)
    for lo, hi in [(NAN, 2.0), (-1.0, NAN), (NAN, NAN), (-1.0, 2.0), (3.0, 1.0)]:
        g.out(f"Clip_{lo}_{hi}", b.op("Clip", x, b.const(np.array(lo, np.float32)),
                                      b.const(np.array(hi, np.float32))))
    g.out("Clip_min_nan_only", b.op("Clip", x, b.const(np.array(NAN, np.float32))))
    g.out("Sign", b.op("Sign", x))
    # a NaN on either side of Max/Min wins, in the scalar tail of a vector loop too
    odd = g.input("odd", np.array([1, -2, NAN, INF, -INF, 0.5, NAN], np.float32))
    zeros = b.const(np.zeros(7, np.float32))
    for op in ("Max", "Min"):
        g.out(f"{op}_constant_first", b.op(op, zeros, odd))
        g.out(f"{op}_constant_last", b.op(op, odd, zeros))
    g.out("Sign_double", b.op("Sign", g.input("xd", values.astype(np.float64))), F64)
    rows = g.input("rows", ROWS)
    g.out("ReduceMax_axes_input", b.op("ReduceMax", rows, b.const(i64(1)), keepdims=1))
    g.out("ReduceMin_axes_input", b.op("ReduceMin", rows, b.const(i64(-1)), keepdims=0))
    data = g.input("data", np.array([1, NAN, 3, 4, NAN, 6, NAN], np.float32))
    upd = g.input("upd", np.array([NAN, 5, 2, 0, 7, NAN, 1, NAN, 2, NAN], np.float32))
    idx = i64(0, 0, 1, 1, 2, 3, 4, 4, 6, 6)
    for red in ("max", "min"):
        g.out(f"ScatterElements_{red}", b.op("ScatterElements", data, b.const(idx), upd,
                                             axis=0, reduction=red))
        g.out(f"ScatterND_{red}", b.op("ScatterND", data, b.const(idx.reshape(-1, 1)), upd,
                                       reduction=red))
    image = g.input("image", np.array([NAN, 1, 2, 3, NAN, 5, 0, NAN, NAN, NAN, -INF, 7,
                                       1, INF, NAN, 2], np.float32).reshape(1, 1, 4, 4))
    for name, attrs in [("2x2", dict(kernel_shape=[2, 2])),
                        ("3x3_pad", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
                        ("2x2_stride2_pad", dict(kernel_shape=[2, 2], strides=[2, 2],
                                                 pads=[1, 1, 1, 1]))]:
        pooled, indices = f"pool_v_{name}", f"pool_i_{name}"
        b.node("MaxPool", [image], [pooled, indices], **attrs)
        g.out(f"MaxPool_values_{name}", pooled)
        g.out(f"MaxPool_indices_{name}", indices, I64)
    return g


def grid_group() -> Group:
    """GridSample at NaN, infinite and huge grid coordinates, and of an image holding
    NaN and infinities (opset 20)."""
    g = Group("grid", 20)
    image = g.input("image", np.arange(1, 13, dtype=np.float32).reshape(1, 1, 3, 4))
    grid = g.input("grid", np.array(
        [[NAN, 0.1], [0.2, NAN], [INF, 0.0], [-INF, 0.5], [0.5, INF], [NAN, NAN],
         [1e19, 0.1], [3.0, -4.0], [0.3, 0.3]], np.float32).reshape(1, 1, 9, 2))
    for mode, pad, align in itertools.product(("linear", "nearest"),
                                              ("zeros", "border", "reflection"), (0, 1)):
        g.out(f"GridSample_{mode}_{pad}_{align}", g.builder.op(
            "GridSample", image, grid, mode=mode, padding_mode=pad, align_corners=align))
    # non-finite pixels: a tap outside the image reads 0, never 0 * inf
    pixels = np.arange(1, 13, dtype=np.float32).reshape(1, 1, 3, 4)
    pixels[0, 0, 0, 0], pixels[0, 0, 2, 3], pixels[0, 0, 1, 2] = -INF, INF, NAN
    bad = g.input("pixels", pixels)
    near = g.input("near", np.array(
        [[-1.0, -1.0], [-0.9, -0.95], [1.0, 1.0], [0.95, 0.9], [0.0, 0.0], [0.2, 0.1],
         [-1.2, 0.3], [1.3, -0.2], [0.6, 0.99]], np.float32).reshape(1, 1, 9, 2))
    for mode, pad, align in itertools.product(("linear", "nearest"), ("zeros", "border"),
                                              (0, 1)):
        g.out(f"GridSample_pixels_{mode}_{pad}_{align}", g.builder.op(
            "GridSample", bad, near, mode=mode, padding_mode=pad, align_corners=align))
    return g


def one_special(shape: tuple[int, ...], at: tuple[int, ...], value: float) -> np.ndarray:
    """Pixels 1..7 in turn with one `value` at `at`."""
    x = (np.arange(int(np.prod(shape))) % 7 + 1).astype(np.float32).reshape(shape)
    x[at] = value
    return x


def taps_group() -> Group:
    """Resize, GridSample and DeformConv of images holding one NaN or infinity: a tap
    of weight 0 reads the pixel onnxruntime reads (0 x inf is NaN), a pixel it does not
    read stays out (opset 20)."""
    g = Group("taps", 20, rtol=1e-5)
    b = g.builder
    images = {"inf_mid": one_special((1, 1, 4, 5), (0, 0, 1, 2), INF),
              "nan_corner": one_special((1, 1, 4, 5), (0, 0, 3, 4), NAN),
              "huge_corner": one_special((1, 1, 4, 5), (0, 0, 0, 0), 3.4e38)}
    resizes = {  # name -> (scales, attributes)
        "linear_2x": ([1, 1, 2, 2], dict(mode="linear")),
        "linear_align": ([1, 1, 2, 2], dict(mode="linear",
                                            coordinate_transformation_mode="align_corners")),
        "linear_w_only": ([1, 1, 1, 1.5], dict(mode="linear")),
        "linear_down_antialias": ([1, 1, 0.6, 0.6], dict(mode="linear", antialias=1)),
        "cubic_2x": ([1, 1, 2, 2], dict(mode="cubic")),
        "cubic_asymmetric_exclude": ([1, 1, 1.7, 0.5], dict(
            mode="cubic", coordinate_transformation_mode="asymmetric", exclude_outside=1)),
        "cubic_down_antialias": ([1, 1, 0.6, 0.6], dict(mode="cubic", antialias=1)),
    }
    for (image, pixels), (name, (scales, attrs)) in itertools.product(images.items(),
                                                                      resizes.items()):
        x = g.input(image, pixels) if image not in g.feeds else image
        g.out(f"Resize_{name}_{image}", b.op("Resize", x, "", b.const(
            np.array(scales, np.float32)), **attrs))
    grid = b.const(np.array([[-10, -10], [-1.3, -0.2], [-0.6, 1.2], [0.0, 0.3], [2.2, 5.0],
                             [1.0, 1.0]], np.float32).reshape(1, 1, 6, 2))
    g.input("inf_near_edge", one_special((1, 1, 4, 5), (0, 0, 1, 1), INF))
    g.input("nan_small", one_special((1, 1, 3, 2), (0, 0, 0, 1), NAN))
    for image, pad, align in itertools.product(("inf_near_edge", "nan_small"),
                                               ("border", "reflection"), (0, 1)):
        g.out(f"GridSample_{pad}_{align}_{image}", b.op(
            "GridSample", image, grid, mode="linear", padding_mode=pad, align_corners=align))
    # a sample one pixel or more off the image reads none of its taps
    shift = np.zeros((1, 8, 2, 2), np.float32)
    shift[0, 0, 0, 0], shift[0, 1, 0, 0], shift[0, 2, 1, 1] = -1.0, 1.0, 1.0
    x = g.input("deform_x", one_special((1, 1, 3, 3), (0, 0, 0, 1), INF))
    g.out("DeformConv_off_image", b.op("DeformConv", x, b.const(np.ones((1, 1, 2, 2),
                                                                     np.float32)),
                                       b.const(shift), kernel_shape=[2, 2]))
    return g


def attention_group() -> Group:
    """Attention (opset 24) with NaN and infinities where the masks exclude them:
    onnxruntime's kernel (kiln.frontend.onnx.attention_body)."""
    g = Group("attention", 24, rtol=1e-5)
    b = g.builder
    rng = np.random.default_rng(3)
    q = g.input("q", rng.random((2, 1, 2, 4), np.float32))
    v = g.input("v", rng.random((2, 1, 4, 4), np.float32))
    keys = rng.random((2, 1, 4, 4), np.float32)
    keys[0, 0, 3], keys[1, 0, 2, 1] = NAN, INF   # past batch 0's length; causal-masked
    k = g.input("k", keys)
    lengths = g.input("lengths", i64(3, 4))

    def attention(case: str, *inputs: str, **attrs: Any) -> None:
        b.node("Attention", list(inputs), [case.lower()], **attrs)
        g.out(case, case.lower())

    attention("Attention_nonpad", q, k, v, "", "", "", lengths)
    attention("Attention_nonpad_causal", q, k, v, "", "", "", lengths, is_causal=1)
    # every score a key allows is -inf: the padding, filled with the lowest finite
    # value, takes the probabilities
    low = np.tile(np.array([-INF, 1, 1, 1], np.float32), (2, 1, 4, 1))
    attention("Attention_nonpad_scores_neg_inf", g.input("q_pos", np.ones((2, 1, 2, 4),
                                                                        np.float32)),
              g.input("k_neg_inf", low), v, "", "", "", g.input("one", i64(1, 1)))
    mask = np.zeros((2, 4), np.float32)
    mask[0, 2], mask[0, 3], mask[1, 3] = NAN, INF, NAN   # all where causal masks
    attention("Attention_causal_float_mask", q, g.input("k_ok", rng.random(
        (2, 1, 4, 4), np.float32)), v, g.input("mask", mask), is_causal=1)
    lowest = np.zeros((2, 4), np.float32)
    lowest[1] = np.finfo(np.float32).min   # a row of the lowest value is fully masked
    attention("Attention_lowest_row", q, "k_ok", v, g.input("lowest", lowest))
    return g


def attention_fp16_group() -> Group:
    """float16 Attention near the type's limit (opset 24): the scores rounded to float16
    once, from alpha Q K^T + mask in float32, as onnxruntime's kernel rounds them."""
    g = Group("attention_fp16", 24, rtol=1e-3)
    rng = np.random.default_rng(0)
    feeds = {name: (rng.standard_normal(shape) * scale).astype(np.float16) for name, shape, scale
             in (("q16", (1, 2, 3, 8), 3), ("k16", (1, 2, 5, 8), 3), ("v16", (1, 2, 5, 8), 1),
                 ("mask16", (3, 5), 1))}
    feeds["v16"][0, 0, 1, 2] = 65000.0
    g.builder.node("Attention", [g.input(n, x) for n, x in feeds.items()], ["y16"])
    g.out("Attention_fp16", "y16", TensorProto.FLOAT16)
    return g


def data_dependent_group() -> Group:
    """Unique and NonMaxSuppression (opset 13)."""
    g = Group("data_dependent", 13)
    b = g.builder
    values = [[1, NAN, 2, NAN, 1, INF, -INF, NAN], [NAN, 1, 2, NAN, 1], [NAN, NAN],
              [3, -INF, 0.0, INF, 3, NAN], [2, 2, -0.0, 0.0, 1]]
    for k, v in enumerate(values):
        x = g.input(f"u{k}", np.array(v, np.float32))
        for sort in (1, 0):
            outs = [f"unique_{k}_{sort}_{part}" for part in range(4)]
            b.node("Unique", [x], outs, sorted=sort)
            for part, name in enumerate(("values", "indices", "inverse", "counts")):
                g.out(f"Unique_{k}_sorted{sort}_{name}", outs[part], F32 if part == 0 else I64)
    column = g.input("column", np.array(values[0], np.float32).reshape(-1, 1))
    outs = [f"unique_axis_{part}" for part in range(4)]
    b.node("Unique", [column], outs, axis=0)  # slices of one element: onnxruntime's rule
    for part, name in enumerate(("values", "indices", "inverse", "counts")):
        g.out(f"Unique_axis_{name}", outs[part], F32 if part == 0 else I64)
    scores = np.array([0.3, NAN, NAN, 0.7, NAN, 0.1, 0.9, INF, -2.0], np.float32)
    boxes = np.array([[0, 2 * i, 1, 2 * i + 1] for i in range(scores.size)], np.float32)
    bx = g.input("boxes", boxes.reshape(1, -1, 4))
    sc = g.input("scores", scores.reshape(1, 1, -1))
    args = [b.const(i64(9)), b.const(np.array([0.5], np.float32))]
    g.out("NMS_score_threshold", b.op("NonMaxSuppression", bx, sc, *args,
                                      b.const(np.array([0.0], np.float32))), I64)
    g.out("NMS_nan_scores_last", b.op("NonMaxSuppression", bx, sc, *args), I64)
    return g


FLT_MAX = float(np.finfo(np.float32).max)


def pool_rule(name: str, kernel: tuple[int, ...], strides: tuple[int, ...],
              pads: tuple[int, ...]) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """MaxPool's rule written out (kiln.ops.pool's `max_floor`, `window_max`): each
    window's maximum with NaN skipped, at least -3.4028235e38 (a window of NaN, -inf and
    padding)."""
    def rule(feeds: dict[str, np.ndarray]) -> np.ndarray:
        x = np.where(np.isnan(feeds[name]), -INF, feeds[name])
        r = len(kernel)
        x = np.pad(x, ((0, 0), (0, 0), *zip(pads[:r], pads[r:])), constant_values=-INF)
        windows = np.lib.stride_tricks.sliding_window_view(x, kernel,
                                                           axis=tuple(range(2, 2 + r)))
        windows = windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]
        top = windows.max(axis=tuple(range(2 + r, 2 + 2 * r)))
        return np.maximum(top, -FLT_MAX).astype(np.float32)
    return rule


def pool_group() -> Group:
    """MaxPool without Indices and GlobalMaxPool (opset 13) over windows holding NaN
    first, in the middle, last, only NaN, only -inf (with padding and without). Against
    onnxruntime where its result is a rule of the values: its generic MLAS kernels (1-D
    pools, a stride of 3: NaN skipped, at least -3.4028235e38) and its scan of dilated
    windows (from the first element inside the input: a leading NaN stays, -inf alone
    gives -inf); against the rule in numpy where its vector kernels (strides of 1 and 2
    in 2-D, GlobalMaxPool) keep a NaN by its place in their order."""
    g = Group("pools", 13)
    b = g.builder
    line = g.input("line", np.array([NAN, 5, 2, 1, NAN, 2, 3, 4, NAN, NAN, NAN, NAN, -INF,
                                     -INF, -INF, 7, -INF, NAN], np.float32).reshape(1, 1, -1))
    for name, attrs in [("1d_3", dict(kernel_shape=[3], strides=[3])),
                        ("1d_3_s1_pad", dict(kernel_shape=[3], pads=[1, 1])),
                        ("1d_dilated", dict(kernel_shape=[3], dilations=[2], pads=[2, 1]))]:
        g.out(f"MaxPool_{name}", b.op("MaxPool", line, **attrs))
    image = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6) % 7
    image[0, 0, 0, 0] = image[0, 0, 1, 4] = image[0, 0, 5, 5] = NAN  # first, middle, last
    image[0, 0, 3:, :3] = NAN                                           # only NaN
    image[0, 0, :3, 3:] = -INF                                          # only -inf
    image[0, 0, 2, 4] = NAN
    img = g.input("image", image)
    for name, attrs in [("3x3_s3", dict(kernel_shape=[3, 3], strides=[3, 3])),
                        ("3x3_s3_pad", dict(kernel_shape=[3, 3], strides=[3, 3],
                                            pads=[1, 1, 1, 1])),
                        ("2x2_dilated", dict(kernel_shape=[2, 2], dilations=[2, 2],
                                             pads=[1, 0, 0, 1]))]:
        g.out(f"MaxPool_{name}", b.op("MaxPool", img, **attrs))
    for name, k, s, pads in [("2x2_s2_pad", (2, 2), (2, 2), (1, 1, 1, 1)),
                             ("3x3_s1", (3, 3), (1, 1), (0, 0, 0, 0))]:
        g.out(f"MaxPool_{name}", b.op("MaxPool", img, kernel_shape=list(k), strides=list(s),
                                      pads=list(pads)))
        g.rules[f"MaxPool_{name}"] = pool_rule("image", k, s, pads)
    channels = np.stack([np.full(20, -INF), np.r_[np.full(19, -INF), NAN], np.full(20, NAN),
                         np.r_[NAN, np.arange(19.0)], np.r_[np.arange(19.0), NAN]])
    planes = g.input("planes", channels.astype(np.float32).reshape(1, 5, 4, 5))
    g.out("GlobalMaxPool", b.op("GlobalMaxPool", planes))
    g.rules["GlobalMaxPool"] = pool_rule("planes", (4, 5), (1, 1), (0, 0, 0, 0))
    return g


GROUPS = {group.name: group for group in (order_group(), bounds_group(), grid_group(),
                                          data_dependent_group(), taps_group(),
                                          attention_group(), attention_fp16_group())}
GROUPS["pools"] = pool_group()


# --------------------------------------------------------------------------- checks

@pytest.fixture(scope="module")
def expected() -> dict[str, list[np.ndarray]]:
    """Per group, every output as it must be: onnxruntime's, or the rule's."""
    out = {}
    for name, group in GROUPS.items():
        got = onnxruntime_outputs(group.model(), group.feeds)
        for k, case in enumerate(group.cases):
            if case == "NMS_nan_scores_last":
                got[k] = nms_nan_last(group)
            elif case in group.rules:
                got[k] = group.rules[case](group.feeds)
        out[name] = got
    return out


def nms_nan_last(group: Group) -> np.ndarray:
    """NonMaxSuppression with NaN scores: onnxruntime's heap has no order for them, kiln
    ranks them below every number. onnxruntime with the NaNs turned into -inf (and no
    -inf among the other scores) gives that order: the same boxes, ties by index."""
    feeds = dict(group.feeds)
    scores = feeds["scores"]
    assert not np.isneginf(scores).any()
    feeds["scores"] = np.where(np.isnan(scores), -INF, scores).astype(np.float32)
    index = group.cases.index("NMS_nan_scores_last")
    return onnxruntime_outputs(group.model(), feeds)[index]


def check(group: Group, got: Any, want: list[np.ndarray], how: str) -> None:
    """Every output equal to the expected one (NaN equal to NaN); the failure names
    every case that differs."""
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(want) == len(group.cases)
    wrong = {}
    for case, g, w in zip(group.cases, got, want, strict=True):
        g = np.asarray(g)
        try:
            assert g.dtype == w.dtype, (g.dtype, w.dtype)
            if case.startswith("ReduceLogSumExp"):  # exp and log round differently
                np.testing.assert_allclose(g, w, rtol=1e-6)
            elif group.rtol:  # NaN and infinities equal, finite values close
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                           rtol=group.rtol, atol=group.rtol)
            else:
                np.testing.assert_array_equal(g, w)
        except AssertionError as e:
            wrong[case] = f"got {g.ravel()[:12]}, want {w.ravel()[:12]} ({str(e)[:80]!r})"
    assert not wrong, f"{how}: {len(wrong)} case(s) differ:\n" + "\n".join(
        f"{case}: {text}" for case, text in wrong.items())


# The AVX2 build differs from the AVX-512 one in its vector lanes: the reductions' and
# Max/Min's; the other groups' kernels are serial loops or elementwise.
COMPILED = [(t, n) for t in NATIVE_TARGETS for n in GROUPS
            if t != "llvm-avx2" or n in ("order", "bounds", "pools")]


@pytest.mark.parametrize(("target", "name"), COMPILED)
def test_compiled_matches_onnxruntime(name: str, target: str,
                                      expected: dict[str, list[np.ndarray]]) -> None:
    group = GROUPS[name]
    exe = kiln.compile(from_onnx(group.model()), native_target(target))
    check(group, exe(*group.feeds.values()), expected[name], target)


@pytest.mark.parametrize("name", ["order", "bounds", "data_dependent", "pools"])
def test_interpreter_matches_onnxruntime(name: str,
                                         expected: dict[str, list[np.ndarray]]) -> None:
    """The kernels' IR on the reference interpreter: the same values."""
    group = GROUPS[name]
    mod = LegalizeOps().run(from_onnx(group.model()))
    check(group, evaluate(mod, "main", *group.feeds.values()), expected[name], "interpreter")


@pytest.mark.parametrize("name", list(GROUPS))
def test_references_match_onnxruntime(name: str,
                                      expected: dict[str, list[np.ndarray]]) -> None:
    """The ops' numpy references (constant folding, kiln.evaluate) follow the rules too."""
    group = GROUPS[name]
    got = kiln.evaluate(from_onnx(group.model()), "main", *group.feeds.values())
    check(group, got, expected[name], "references")


def test_unsorted_topk_holds_the_same_elements() -> None:
    """TopK with sorted=0 may list its k elements in any order (onnxruntime's is its
    selection's): kiln's are the same elements, NaN above +inf."""
    g = Group("topk_unsorted", 13)
    line = g.input("line", np.array([1, NAN, INF, 2, -INF, NAN, 0], np.float32))
    for largest in (1, 0):
        g.builder.node("TopK", [line, g.builder.const(i64(4))], [f"v{largest}", f"i{largest}"],
                       largest=largest, sorted=0)
        g.out(f"values{largest}", f"v{largest}")
        g.out(f"indices{largest}", f"i{largest}", I64)
    model = g.model()
    want = onnxruntime_outputs(model, g.feeds)
    got = kiln.compile(from_onnx(model), "llvm")(*g.feeds.values())
    for k in (0, 2):  # values, indices pairs: compare in index order
        order_w, order_g = np.argsort(want[k + 1]), np.argsort(np.asarray(got[k + 1]))
        np.testing.assert_array_equal(np.asarray(got[k + 1])[order_g], want[k + 1][order_w])
        np.testing.assert_array_equal(np.asarray(got[k])[order_g], want[k][order_w])


def test_unique_of_slices_holding_nan_agrees_everywhere() -> None:
    """Unique along an axis whose slices hold NaN, where onnxruntime's answer depends on
    its tree (docs/onnx.md, "Non-finite values"): the kernel on llvm and c, the
    interpreter and the numpy reference give one answer."""
    g = Group("unique_slices", 13)
    rows = np.array([[1, NAN], [0, 2], [NAN, 1], [1, NAN], [5, 0], [NAN, NAN], [0, 2],
                     [NAN, 1]], np.float32)
    x = g.input("x", rows)
    for sort in (1, 0):
        outs = [f"u{sort}_{part}" for part in range(4)]
        g.builder.node("Unique", [x], outs, axis=0, sorted=sort)
        for part in range(4):
            g.out(f"unique_sorted{sort}_{part}", outs[part], F32 if part == 0 else I64)
    model = g.model()
    want = [np.asarray(v) for v in kiln.evaluate(from_onnx(model), "main", rows)]
    assert want[0].shape[0] < rows.shape[0]  # the repeated slices were found
    check(g, evaluate(LegalizeOps().run(from_onnx(model)), "main", rows), want, "interpreter")
    for target in ("llvm", "c"):
        check(g, kiln.compile(from_onnx(model), target)(rows), want, target)


# --------------------------------------------------------------------------- the helpers

SPECIAL = np.array([NAN, -NAN, INF, -INF, 1.5, -2.0, 0.0, -0.0], np.float32)
PAIRS_A, PAIRS_B = (v.ravel() for v in np.meshgrid(SPECIAL, SPECIAL, indexing="ij"))


def _nan_high(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a above b with NaN above every number, NaNs equal: written out in numpy."""
    na, nb = np.isnan(a), np.isnan(b)
    with np.errstate(invalid="ignore"):
        return np.where(na, ~nb, ~nb & (a > b))


# helper -> (IR builder of a float result, numpy rule); bool results as 0/1 floats
HELPERS: dict[str, tuple[Callable[[PrimExpr, PrimExpr], PrimExpr],
                         Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "max_propagate": (nan_order.max_propagate, np.maximum),
    "min_propagate": (nan_order.min_propagate, np.minimum),
    "max_ignore_nan": (nan_order.max_ignore_nan, np.fmax),
    "min_ignore_nan": (nan_order.min_ignore_nan, np.fmin),
    "max_keep_first": (nan_order.max_keep_first, lambda a, b: np.where(b > a, b, a)),
    "min_keep_first": (nan_order.min_keep_first, lambda a, b: np.where(b < a, b, a)),
    "max_keep_second": (nan_order.max_keep_second, lambda a, b: np.where(a > b, a, b)),
    "min_keep_second": (nan_order.min_keep_second, lambda a, b: np.where(a < b, a, b)),
    "clip_below": (nan_order.clip_below, lambda x, lo: np.where(lo > x, lo, x)),
    "clip_above": (nan_order.clip_above, lambda x, hi: np.where(hi < x, hi, x)),
    "with_leading_nan": (nan_order.with_leading_nan, lambda f, t: np.where(np.isnan(f), f, t)),
    "order_greater_high": (nan_order.order_greater, _nan_high),
    "order_less_high": (nan_order.order_less, lambda a, b: _nan_high(b, a)),
    "order_greater_low": (lambda a, b: nan_order.order_greater(a, b, NanPlace.LOW),
                          lambda a, b: _nan_high(-b, -a)),  # negation turns LOW into HIGH
    "order_equal": (nan_order.order_equal, lambda a, b: ~_nan_high(a, b) & ~_nan_high(b, a)),
    "order_key_above": (lambda a, b: nan_order.order_key(a) > nan_order.order_key(b),
                        _nan_high),
    "order_key_equal": (lambda a, b: nan_order.order_key(a).eq(nan_order.order_key(b)),
                        lambda a, b: ~_nan_high(a, b) & ~_nan_high(b, a)),
}


def _helpers_module() -> Any:
    ib = IRBuilder()
    n = PAIRS_A.size
    with ib.prim_func("main"):
        a, b = ib.arg("A", (n,), "float32"), ib.arg("B", (n,), "float32")
        y = ib.arg("Y", (len(HELPERS), n), "float32")
        with ib.for_range(n, name="i") as i:
            for k, (build, _) in enumerate(HELPERS.values()):
                v = build(a[i], b[i])
                if v.dtype == "bool":
                    v = select(v, 1.0, 0.0)
                ib.store(y, [k, i], v)
    return ib.get()


def test_the_helpers_on_every_pair_of_special_values() -> None:
    """Each kiln.ops.nan_order helper on every pair of NaN (both signs), +-inf, numbers
    and signed zeros: its numpy rule, on the interpreter, llvm and c alike."""
    mod = _helpers_module()
    with np.errstate(invalid="ignore"):
        want = np.stack([np.asarray(rule(PAIRS_A, PAIRS_B), np.float32)
                         for _, rule in HELPERS.values()])
    for how in ("interpreter", "llvm", "c"):
        got = np.zeros(want.shape, np.float32)
        if how == "interpreter":
            evaluate(mod, "main", PAIRS_A, PAIRS_B, got)
        else:
            kiln.compile(mod, how)["main"](PAIRS_A, PAIRS_B, got)
        for k, name in enumerate(HELPERS):
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{how}: {name}")


# --------------------------------------------------------------------------- recurrent

def recurrent_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """LSTM and GRU with a bias (a NaN gate input is clipped to +clip: saturated gates,
    the LSTM's h `tanh(1)`) and without one (NaN stays), and an RNN without initial_h
    whose R holds infinities (its first step multiplies no state: finite, not 0 x inf)."""
    rng = np.random.default_rng(11)
    b = GraphBuilder()
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    x[0, 0, 1] = x[1, 1, 3] = NAN
    feeds = {"X": x}
    b.inputs_for(feeds)
    for kind, gates in (("LSTM", 4), ("GRU", 3)):
        w = b.const((0.5 * rng.standard_normal((1, gates * 5, 4))).astype(np.float32))
        r = b.const((0.5 * rng.standard_normal((1, gates * 5, 5))).astype(np.float32))
        bias = b.const((0.5 * rng.standard_normal((1, 2 * gates * 5))).astype(np.float32))
        for name, ins in ((f"{kind}_bias", ["X", w, r, bias]), (f"{kind}_no_bias", ["X", w, r])):
            b.node(kind, ins, [name], hidden_size=5)
            b.output(name, (3, 1, 2, 5))
    r_inf = (0.5 * rng.standard_normal((1, 5, 5))).astype(np.float32)
    r_inf[0, 1, 2], r_inf[0, 3, 0] = INF, -INF
    w = b.const((0.5 * rng.standard_normal((1, 5, 4))).astype(np.float32))
    feeds["clean"] = rng.standard_normal((3, 2, 4)).astype(np.float32)
    b.input("clean", (3, 2, 4))
    b.node("RNN", ["clean", w, b.const(r_inf)], ["RNN_inf_R"], hidden_size=5)
    b.output("RNN_inf_R", (3, 1, 2, 5))
    return b.model(opset=14), feeds


@pytest.mark.parametrize("target", [*NATIVE_TARGETS, "references"])
def test_recurrent_gates_treat_nan_as_onnxruntime(target: str) -> None:
    model, feeds = recurrent_model()
    want = onnxruntime_outputs(model, feeds)
    assert np.isclose(want[0], np.tanh(1.0), atol=1e-6).any()  # saturated gates
    assert np.isfinite(want[-1][0]).all()  # the RNN's first step
    if target == "references":
        got = kiln.evaluate(from_onnx(model), "main", *feeds.values())
    else:
        got = kiln.compile(from_onnx(model), native_target(target))(*feeds.values())
    for name, g, w in zip(("LSTM_bias", "LSTM_no_bias", "GRU_bias", "GRU_no_bias",
                           "RNN_inf_R"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5, err_msg=name)
