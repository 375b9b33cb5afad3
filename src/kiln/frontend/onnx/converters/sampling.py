"""ONNX GridSample, imported as a composition of gathers and elementwise arithmetic.

GridSample(X [N, C, D1..Dk], grid [N, O1..Om, k]) reads X at the normalized
coordinates of the grid (last axis ordered x, y, z: the *last* spatial axis
first). Each coordinate is denormalized (`align_corners`), rounded for
`nearest`, and, when it falls outside the border (`[0, D-1]` with
`align_corners`, else `[-0.5, D-0.5]`), clamped (`border`) or reflected
(`reflection`); the interpolation then reads 1 (`nearest`), 2 (`linear`) or 4
(`cubic`, Keys' kernel with a = -0.75) taps per axis, each tap index again
padded: read as 0 outside X (`zeros`), clamped (`border`) or reflected
(`reflection`). This follows the operator's definition in the ONNX standard
(onnx's reference implementation, `onnx/reference/ops/op_grid_sample.py`), but
`linear` and `cubic` pad only their taps, not the coordinate first, as onnxruntime
(like PyTorch's grid_sample) does: the values are the same, and a tap of weight 0
reads the pixel onnxruntime reads (an infinite one there makes the sum NaN).

The converter emits, for every combination of taps, a `gather_elements` of X
flattened over its spatial axes and a weight; the result is their weighted sum.
Spatial sizes must be static.

DeformConv (2-D) reads X the same way (bilinear, zero outside) at every kernel
tap's position plus its offset, scales by the mask, and multiplies the columns by
the weights with one `matmul` per group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, first_input, onnx_op
from kiln.ir import graph as g
from kiln.ir.dtype import to_numpy

MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic",
         "bicubic": "cubic"}
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75
#: A denormalized coordinate at least this large (or NaN, or infinite) samples at the
#: border's low end, as onnxruntime does.
COORD_LIMIT = 2.0 ** 62


class _Arith:
    """Elementwise arithmetic on one float dtype, constants made to match."""

    def __init__(self, ctx: GraphContext, dtype: str) -> None:
        self.ctx, self.dtype = ctx, dtype

    def c(self, value: float) -> g.Expr:
        return self.ctx.const(np.array(value, to_numpy(self.dtype)))

    def op(self, name: str, a: g.Expr, b: g.Expr | float) -> g.Expr:
        return self.ctx.call(name, a, b if isinstance(b, g.Expr) else self.c(b))

    def where(self, cond: g.Expr, a: g.Expr, b: g.Expr) -> g.Expr:
        return self.ctx.call("where", cond, a, b)

    def finite_or(self, x: g.Expr, lo: float) -> g.Expr:
        """`x`, or `lo` where `x` is NaN, infinite or at least 2**62 in magnitude: where
        onnxruntime's GridSample puts such a coordinate (no int64 index holds it)."""
        inside = self.op("less", self.ctx.call("abs", x), COORD_LIMIT)  # false for NaN
        return self.where(inside, x, self.c(lo))

    def outside(self, x: g.Expr, lo: float, hi: float) -> g.Expr:
        return self.ctx.call("logical_or", self.op("less", x, lo), self.op("greater", x, hi))

    def reflect(self, x: g.Expr, lo: float, hi: float) -> g.Expr:
        """x reflected by the nearer border until inside [lo, hi] (x outside it)."""
        span = hi - lo
        below = self.op("less", x, lo)
        dx = self.where(below, self.op("subtract", self.c(lo), x), self.op("subtract", x, hi))
        n = self.ctx.call("floor", self.op("divide", dx, span))
        r = self.op("subtract", dx, self.op("multiply", n, span))
        half = self.ctx.call("floor", self.op("divide", n, 2.0))
        even = self.op("equal", self.op("subtract", n, self.op("multiply", half, 2.0)), 0.0)
        from_lo, from_hi = self.op("add", r, lo), self.op("subtract", self.c(hi), r)
        return self.where(below, self.where(even, from_lo, from_hi),
                          self.where(even, from_hi, from_lo))


def _cubic_weights(a: _Arith, t: g.Expr) -> list[g.Expr]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fraction t in [0, 1)."""
    def far(d: g.Expr) -> g.Expr:    # |d| in [1, 2): ((A*d - 5A)*d + 8A)*d - 4A
        inner = a.op("add", a.op("multiply", a.op("subtract", a.op("multiply", d, CUBIC_A),
                                                  5 * CUBIC_A), d), 8 * CUBIC_A)
        return a.op("subtract", a.op("multiply", inner, d), 4 * CUBIC_A)

    def near(d: g.Expr) -> g.Expr:   # |d| in [0, 1): ((A+2)*d - (A+3))*d*d + 1
        inner = a.op("subtract", a.op("multiply", d, CUBIC_A + 2), CUBIC_A + 3)
        return a.op("add", a.op("multiply", a.op("multiply", inner, d), d), 1.0)

    one_minus = a.op("subtract", a.c(1.0), t)
    return [far(a.op("add", t, 1.0)), near(t), near(one_minus),
            far(a.op("subtract", a.c(2.0), t))]


Tap = tuple[g.Expr, g.Expr | None, g.Expr | None]


def _axis_taps(a: _Arith, x: g.Expr, size: int, mode: str, padding: str, lo: float, hi: float
               ) -> list[Tap]:
    """(int64 index, weight or None for 1, validity or None) of each tap along one axis at
    coordinates x. With `zeros` padding the validity says where the tap is inside X: a
    tap outside reads 0, not its clamped pixel times a weight of 0 (an infinite pixel
    would make that NaN, where onnxruntime reads nothing)."""
    ctx = a.ctx
    raw: list[tuple[g.Expr, g.Expr | None]]
    if mode == "nearest":
        raw = [(ctx.call("cast", x, dtype="int64"), None)]
    else:
        base = ctx.call("floor", x)
        t = a.op("subtract", x, base)
        weights = [a.op("subtract", a.c(1.0), t), t] if mode == "linear" else \
            _cubic_weights(a, t)
        first = 0 if mode == "linear" else -1
        raw = [(ctx.call("cast", a.op("add", base, float(first + k)), dtype="int64"), w)
               for k, w in enumerate(weights)]
    taps: list[Tap] = []
    top = ctx.const(np.array(size - 1, np.int64))
    zero = ctx.const(np.array(0, np.int64))
    for j, w in raw:
        valid = None
        if padding == "reflection":
            jf = ctx.call("cast", j, dtype=a.dtype)
            jf = a.where(a.outside(jf, lo, hi), a.reflect(jf, lo, hi), jf)
            j = ctx.call("cast", jf, dtype="int64")
        elif padding == "zeros":
            valid = ctx.call("logical_and", ctx.call("greater_equal", j, zero),
                             ctx.call("less_equal", j, top))
        taps.append((ctx.call("clip", j, min=0, max=size - 1), w, valid))
    return taps


def _inside_only(ctx: GraphContext, value: g.Expr, valids: list[g.Expr],
                 shape: Callable[[g.Expr], g.Expr]) -> g.Expr:
    """`value` where every tap of a combination is inside X, else 0 (`shape` makes the
    validity broadcast against `value`)."""
    if not valids:
        return value
    zero = ctx.const(np.array(0, to_numpy(ctx.tensor_type(value).dtype)))
    return ctx.call("where", shape(chain(ctx, "logical_and", valids)), value, zero)


@onnx_op("GridSample", min_opset=16)
def _grid_sample_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                      attrs: dict[str, Any]) -> list[g.Expr]:
    x, grid = first_input(inputs), inputs[1]
    if grid is None:
        raise IRError("GridSample needs its grid input")
    xt, gt = ctx.tensor_type(x), ctx.tensor_type(grid)
    mode = MODES.get(str(attrs.get("mode", "linear")))
    padding = str(attrs.get("padding_mode", "zeros"))
    if mode is None or padding not in PADDING_MODES:
        raise IRError(f"GridSample: mode {attrs.get('mode')!r} / padding_mode {padding!r}; "
                      f"known: {', '.join(MODES)} / {', '.join(PADDING_MODES)}")
    align = bool(attrs.get("align_corners", 0))
    dims = xt.shape[2:]
    k = len(dims)
    if not all(isinstance(d, int) for d in (*xt.shape, *gt.shape)):
        raise IRError(f"GridSample needs static shapes, got X {xt.shape} and grid {gt.shape}")
    sizes = [int(d) for d in dims]  # type: ignore[arg-type]
    n, c = int(xt.shape[0]), int(xt.shape[1])  # type: ignore[arg-type]
    out_dims = [int(d) for d in gt.shape[1:-1]]  # type: ignore[arg-type]
    if k < 1 or gt.ndim != k + 2 or gt.shape[-1] != k or gt.shape[0] != n:
        raise IRError(f"GridSample: grid {gt.shape} does not fit X {xt.shape} (expected "
                      f"[{n}, ..., {k}])")
    if 0 in sizes and n * c * int(np.prod(out_dims)):  # onnxruntime refuses it too
        raise IRError(f"GridSample: X {xt.shape} has an empty spatial axis, no values to "
                      "sample")
    a = _Arith(ctx, gt.dtype)
    per_axis = []
    for i, size in enumerate(sizes):
        comp = ctx.call("gather", grid, ctx.const(np.array(k - 1 - i, np.int64)), axis=gt.ndim - 1)
        if align:
            coord = a.op("multiply", a.op("add", comp, 1.0), (size - 1) / 2.0)
        else:
            coord = a.op("divide", a.op("subtract", a.op("multiply", a.op("add", comp, 1.0),
                                                         float(size)), 1.0), 2.0)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        coord = a.finite_or(coord, lo)
        if mode == "nearest":
            coord = ctx.call("round", coord)
        # linear and cubic pad their taps only (clamped or reflected one by one), as
        # onnxruntime does: a tap of weight 0 reads the pixel onnxruntime reads
        if padding == "border" and mode == "nearest":
            coord = a.where(a.outside(coord, lo, hi),
                            ctx.call("clip", coord, min=0.0, max=size - 1.0), coord)
        elif padding == "reflection" and mode == "nearest":
            coord = a.where(a.outside(coord, lo, hi), a.reflect(coord, lo, hi), coord)
        per_axis.append(_axis_taps(a, coord, size, mode, padding, lo, hi))
    points = int(np.prod(out_dims))
    flat_x = ctx.call("reshape", x, shape=(n, c, int(np.prod(sizes))))
    strides = [int(np.prod(sizes[i + 1:])) for i in range(k)]

    def flat(e: g.Expr, dtype: str) -> g.Expr:
        e = e if ctx.tensor_type(e).dtype == dtype else ctx.call("cast", e, dtype=dtype)
        return ctx.call("reshape", e, shape=(n, 1, points))

    def read(combo: Sequence[Tap]) -> g.Expr:
        index = chain(ctx, "add", [
            j if s == 1 else ctx.call("multiply", j, ctx.const(np.array(s, np.int64)))
            for (j, _, _), s in zip(combo, strides)])
        index = ctx.call("broadcast_to", flat(index, "int64"), shape=(n, c, points))
        return _inside_only(ctx, ctx.call("gather_elements", flat_x, index, axis=2),
                            [v for _, _, v in combo if v is not None],
                            lambda e: flat(e, "bool"))

    # onnxruntime's sums: its bilinear kernel for 2-D `zeros` without align_corners adds
    # each pixel times the product of its weights; its others nest, last axis innermost
    nested = not (mode == "linear" and k == 2 and padding == "zeros" and not align)
    total = _nested_sum(ctx, per_axis, read, lambda w: flat(w, xt.dtype)) if nested else \
        _product_sum(ctx, per_axis, read, lambda w: flat(w, xt.dtype))
    return [ctx.call("reshape", total, shape=(n, c, *out_dims))]


def _product_sum(ctx: GraphContext, per_axis: list[list[Tap]],
                 read: Callable[[Sequence[Tap]], g.Expr], shape: Callable[[g.Expr], g.Expr]
                 ) -> g.Expr:
    """The sum over every combination of taps of its pixel times the product of its
    weights (first axis first)."""
    total: g.Expr | None = None
    for combo in itertools.product(*per_axis):
        value = read(combo)
        weights = [w for _, w, _ in combo if w is not None]
        if weights:
            value = ctx.call("multiply", value, shape(chain(ctx, "multiply", weights)))
        total = value if total is None else ctx.call("add", total, value)
    assert total is not None
    return total


def _nested_sum(ctx: GraphContext, per_axis: list[list[Tap]],
                read: Callable[[Sequence[Tap]], g.Expr], shape: Callable[[g.Expr], g.Expr],
                prefix: tuple[Tap, ...] = ()) -> g.Expr:
    """sum_t w_t * (the same over the next axes) along the first axis, the last axis
    innermost: `wy1 (wx1 p11 + wx2 p12) + wy2 (wx1 p21 + wx2 p22)`."""
    if len(prefix) == len(per_axis):
        return read(prefix)
    total: g.Expr | None = None
    for tap in per_axis[len(prefix)]:
        value = _nested_sum(ctx, per_axis, read, shape, (*prefix, tap))
        if tap[1] is not None:
            value = ctx.call("multiply", shape(tap[1]), value)
        total = value if total is None else ctx.call("add", total, value)
    assert total is not None
    return total


def chain(ctx: GraphContext, op: str, terms: list[g.Expr]) -> g.Expr:
    """`terms` combined left to right by the binary `op`."""
    out = terms[0]
    for t in terms[1:]:
        out = ctx.call(op, out, t)
    return out



def _off_image(a: _Arith, y: g.Expr, x: g.Expr, height: int, width: int) -> g.Expr:
    """Where a DeformConv sample lies a pixel or more off the image (y <= -1, y >= H, ...):
    onnxruntime reads none of its taps there, the sample is 0 (NaN is not off)."""
    ctx = a.ctx
    return chain(ctx, "logical_or", [a.op("less_equal", y, -1.0), a.op("greater_equal", y, height),
                                     a.op("less_equal", x, -1.0), a.op("greater_equal", x, width)])


@onnx_op("DeformConv", min_opset=19)
def _deform_conv_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                      attrs: dict[str, Any]) -> list[g.Expr]:
    """2-D deformable convolution: every kernel tap reads X bilinearly (zero outside) at
    its regular position plus the learned offset, times the mask; the taps' columns then
    go through one `matmul` per group, as a convolution's im2col would."""
    x, w = first_input(inputs), inputs[1]
    offset = inputs[2] if len(inputs) > 2 else None
    if w is None or offset is None:
        raise IRError("DeformConv needs its W and offset inputs")
    bias = inputs[3] if len(inputs) > 3 else None
    mask = inputs[4] if len(inputs) > 4 else None
    types = [ctx.tensor_type(e) for e in (x, w, offset)]
    if not all(isinstance(d, int) for t in types for d in t.shape):
        raise IRError("DeformConv needs static shapes")
    xs, ws, os_ = ([int(d) for d in t.shape] for t in types)  # type: ignore[arg-type]
    if len(xs) != 4 or len(ws) != 4 or len(os_) != 4:
        raise IRError(f"DeformConv: kiln imports the 2-D form only (X {xs}, W {ws})")
    n, c, height, width = xs
    oc, cg = ws[0], ws[1]
    kh, kw = [int(v) for v in attrs.get("kernel_shape", ws[2:])]
    taps = kh * kw
    group, og = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    sh, sw = [int(v) for v in attrs.get("strides", [1, 1])]
    dh, dw = [int(v) for v in attrs.get("dilations", [1, 1])]
    pt, pl = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])][:2]
    out_h, out_w = os_[2:]
    if cg * group != c or oc % group or c % og or os_[1] != og * 2 * taps or os_[0] != n:
        raise IRError(f"DeformConv: X {xs}, W {ws}, offset {os_} do not fit group {group} "
                      f"and offset_group {og}")
    a = _Arith(ctx, types[0].dtype)
    points = out_h * out_w
    rows = np.arange(out_h, dtype=np.float64).reshape(out_h, 1) * sh - pt
    cols = np.arange(out_w, dtype=np.float64).reshape(1, out_w) * sw - pl
    flat_x = ctx.call("reshape", x, shape=(n, c, height * width))
    per_group = c // og
    columns = []  # per kernel tap: [N, C, points]
    for k in range(taps):
        i, j = divmod(k, kw)
        parts = []
        for grp in range(og):
            def coord(axis: int, base: np.ndarray, grp: int = grp, k: int = k) -> g.Expr:
                shift = ctx.call("gather", offset, ctx.const(np.array(
                    grp * 2 * taps + 2 * k + axis, np.int64)), axis=1)
                return a.op("add", shift, ctx.const(base.astype(to_numpy(a.dtype))))

            y_at, x_at = coord(0, rows + i * dh), coord(1, cols + j * dw)
            ys = _axis_taps(a, y_at, height, "linear", "zeros", 0, 0)
            xs_ = _axis_taps(a, x_at, width, "linear", "zeros", 0, 0)
            chans = ctx.call("gather", flat_x, ctx.const(np.arange(
                grp * per_group, (grp + 1) * per_group, dtype=np.int64)), axis=1)
            total: g.Expr | None = None
            for (yi, yw, yv), (xi, xw, xv) in itertools.product(ys, xs_):
                index = ctx.call("add", ctx.call("multiply", yi, ctx.const(
                    np.array(width, np.int64))), xi)
                index = ctx.call("broadcast_to", ctx.call("reshape", index, shape=(
                    n, 1, points)), shape=(n, per_group, points))
                value = _inside_only(ctx, ctx.call("gather_elements", chans, index, axis=2),
                                     [v for v in (yv, xv) if v is not None],
                                     lambda e: ctx.call("reshape", e, shape=(n, 1, points)))
                assert yw is not None and xw is not None
                weight = ctx.call("reshape", a.op("multiply", yw, xw), shape=(n, 1, points))
                value = ctx.call("multiply", value, weight)
                total = value if total is None else ctx.call("add", total, value)
            assert total is not None
            total = ctx.call("where", ctx.call("reshape", _off_image(a, y_at, x_at, height, width),
                                               shape=(n, 1, points)), a.c(0.0), total)
            if mask is not None:
                m = ctx.call("gather", mask, ctx.const(np.array(grp * taps + k, np.int64)),
                             axis=1)
                total = ctx.call("multiply", total, ctx.call("reshape", m, shape=(n, 1, points)))
            parts.append(total)
        columns.append(parts[0] if og == 1 else ctx.call("concat", *parts, axis=1))
    # [N, C, taps, points] -> per group [N, cg * taps, points] against W [oc/g, cg * taps]
    stacked = ctx.call("concat", *[ctx.call("reshape", col, shape=(n, c, 1, points))
                                   for col in columns], axis=2)
    outs = []
    for grp in range(group):
        sub = ctx.call("gather", stacked, ctx.const(np.arange(
            grp * cg, (grp + 1) * cg, dtype=np.int64)), axis=1)
        sub = ctx.call("reshape", sub, shape=(n, cg * taps, points))
        wg = ctx.call("gather", w, ctx.const(np.arange(
            grp * (oc // group), (grp + 1) * (oc // group), dtype=np.int64)), axis=0)
        wg = ctx.call("reshape", wg, shape=(oc // group, cg * taps))
        outs.append(ctx.call("matmul", wg, sub))
    y = outs[0] if group == 1 else ctx.call("concat", *outs, axis=1)
    if bias is not None:
        y = ctx.call("add", y, ctx.call("reshape", bias, shape=(1, oc, 1)))
    return [ctx.call("reshape", y, shape=(n, oc, out_h, out_w))]
