"""ONNX GridSample, imported as a composition of gathers and elementwise arithmetic.

GridSample(X [N, C, D1..Dk], grid [N, O1..Om, k]) reads X at the normalized
coordinates of the grid (last axis ordered x, y, z: the *last* spatial axis
first). Each coordinate is denormalized (`align_corners`), rounded for
`nearest`, and, when it falls outside the border (`[0, D-1]` with
`align_corners`, else `[-0.5, D-0.5]`), clamped (`border`) or reflected
(`reflection`); the interpolation then reads 1 (`nearest`), 2 (`linear`) or 4
(`cubic`, Keys' kernel with a = -0.75) taps per axis, each tap index again
padded: zero weight outside X (`zeros`), clamped (`border`) or reflected
(`reflection`). This follows the operator's definition in the ONNX standard
(onnx's reference implementation, `onnx/reference/ops/op_grid_sample.py`), but for
one case where onnxruntime (like PyTorch's grid_sample) differs from it: `cubic`
with `border` clamps only the taps, not the coordinate first, as onnxruntime does.

The converter emits, for every combination of taps, a `gather_elements` of X
flattened over its spatial axes and a weight; the result is their weighted sum.
Spatial sizes must be static.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.dtype import to_numpy
from kiln.ops.onnx_map import GraphContext, first_input, onnx_op

MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic",
         "bicubic": "cubic"}
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75


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


def _axis_taps(a: _Arith, x: g.Expr, size: int, mode: str, padding: str, lo: float, hi: float
               ) -> list[tuple[g.Expr, g.Expr | None]]:
    """(int64 index, weight or None for 1) of each tap along one axis at coordinates x."""
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
    taps: list[tuple[g.Expr, g.Expr | None]] = []
    top = ctx.const(np.array(size - 1, np.int64))
    zero = ctx.const(np.array(0, np.int64))
    for j, w in raw:
        if padding == "reflection":
            jf = ctx.call("cast", j, dtype=a.dtype)
            jf = a.where(a.outside(jf, lo, hi), a.reflect(jf, lo, hi), jf)
            j = ctx.call("cast", jf, dtype="int64")
        elif padding == "zeros":
            valid = ctx.call("logical_and", ctx.call("greater_equal", j, zero),
                             ctx.call("less_equal", j, top))
            mask = ctx.call("cast", valid, dtype=a.dtype)
            w = mask if w is None else a.op("multiply", w, mask)
        taps.append((ctx.call("clip", j, min=0, max=size - 1), w))
    return taps


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
    a = _Arith(ctx, gt.dtype)
    per_axis = []
    for i, size in enumerate(sizes):
        comp = ctx.call("gather", grid, ctx.const(np.array(k - 1 - i, np.int64)), axis=gt.ndim - 1)
        if align:
            coord = a.op("multiply", a.op("add", comp, 1.0), (size - 1) / 2.0)
        else:
            coord = a.op("divide", a.op("subtract", a.op("multiply", a.op("add", comp, 1.0),
                                                         float(size)), 1.0), 2.0)
        if mode == "nearest":
            coord = ctx.call("round", coord)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border" and mode != "cubic":
            coord = a.where(a.outside(coord, lo, hi),
                            ctx.call("clip", coord, min=0.0, max=size - 1.0), coord)
        elif padding == "reflection":
            coord = a.where(a.outside(coord, lo, hi), a.reflect(coord, lo, hi), coord)
        per_axis.append(_axis_taps(a, coord, size, mode, padding, lo, hi))
    points = int(np.prod(out_dims))
    flat_x = ctx.call("reshape", x, shape=(n, c, int(np.prod(sizes))))
    strides = [int(np.prod(sizes[i + 1:])) for i in range(k)]

    def flat(e: g.Expr, dtype: str) -> g.Expr:
        e = e if ctx.tensor_type(e).dtype == dtype else ctx.call("cast", e, dtype=dtype)
        return ctx.call("reshape", e, shape=(n, 1, points))

    total: g.Expr | None = None
    for combo in itertools.product(*per_axis):
        index = _fold(ctx, "add", [
            j if s == 1 else ctx.call("multiply", j, ctx.const(np.array(s, np.int64)))
            for (j, _), s in zip(combo, strides)])
        index = ctx.call("broadcast_to", flat(index, "int64"), shape=(n, c, points))
        value = ctx.call("gather_elements", flat_x, index, axis=2)
        weights = [w for _, w in combo if w is not None]
        if weights:
            value = ctx.call("multiply", value, flat(_fold(ctx, "multiply", weights), xt.dtype))
        total = value if total is None else ctx.call("add", total, value)
    assert total is not None
    return [ctx.call("reshape", total, shape=(n, c, *out_dims))]


def _fold(ctx: GraphContext, op: str, terms: list[g.Expr]) -> g.Expr:
    out = terms[0]
    for t in terms[1:]:
        out = ctx.call(op, out, t)
    return out

