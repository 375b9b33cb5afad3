"""Pooling: max_pool2d, avg_pool2d (NCHW), global_avg_pool, global_max_pool.

Attributes: kernel_shape, strides, pads (top, left, bottom, right), dilations,
ceil_mode, count_include_pad (avg only) — ONNX's meanings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import Cast, PrimExpr, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.nn import _onnx_pads, _pads, _pair
from kiln.ops.onnx_map import GraphContext, onnx_op
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


def _out_size(size: int, k: int, s: int, d: int, lo: int, hi: int, ceil: bool) -> int:
    span = size + lo + hi - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    # ONNX/PyTorch: the last window must start inside the input or the left padding.
    if ceil and (out - 1) * s >= size + lo:
        out -= 1
    return out


def _geometry(x: Sequence[int], attrs: Attrs) -> tuple[int, int, int, int, int, int, int, int,
                                                       int, int]:
    if len(x) != 4:
        raise IRError(f"pooling expects an NCHW tensor, got shape {tuple(x)}")
    if "kernel_shape" not in attrs:
        raise IRError("pooling needs a kernel_shape attribute")
    kh, kw = _pair(attrs, "kernel_shape", 1)
    sh, sw = _pair(attrs, "strides", 1)
    dh, dw = _pair(attrs, "dilations", 1)
    pt, pl, pb, pr = _pads(attrs)
    ceil = bool(attrs.get("ceil_mode", False))
    oh = _out_size(x[2], kh, sh, dh, pt, pb, ceil)
    ow = _out_size(x[3], kw, sw, dw, pl, pr, ceil)
    if oh <= 0 or ow <= 0:
        raise IRError(f"pooling output would be empty ({oh}x{ow})")
    return kh, kw, sh, sw, dh, dw, pt, pl, oh, ow


def _pool_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    *_, oh, ow = _geometry(x.shape, attrs)  # type: ignore[arg-type]
    return TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)


def _max_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = _geometry(x.shape, attrs)
    lowest = te.lowest_value(x.dtype)

    def element(n: PrimExpr, c: PrimExpr, oy: PrimExpr, ox: PrimExpr) -> PrimExpr:
        return te.reduce("max", lambda ky, kx: te.padded(
            x, (n, c, oy * sh + ky * dh - pt, ox * sw + kx * dw - pl), lowest),
            (kh, kw), x.dtype)

    return te.compute((x.shape[0], x.shape[1], oh, ow), element, x.dtype, "max_pool2d")


def _avg_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = _geometry(x.shape, attrs)
    _, _, pb, pr = _pads(attrs)
    include_pad = bool(attrs.get("count_include_pad", False))
    acc = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype
    h, w = x.shape[2], x.shape[3]

    def element(n: PrimExpr, c: PrimExpr, oy: PrimExpr, ox: PrimExpr) -> PrimExpr:
        y0, x0 = oy * sh - pt, ox * sw - pl

        def term(ky: PrimExpr, kx: PrimExpr) -> PrimExpr:
            v = te.padded(x, (n, c, y0 + ky * dh, x0 + kx * dw), 0)
            return v if v.dtype == acc else Cast(acc, v)

        total = te.reduce("sum", term, (kh, kw), acc)
        if include_pad:
            # windows are clipped to the padded extent (ONNX semantics)
            ys = min_(y0 + (kh - 1) * dh + 1, h + pb) - y0
            xs = min_(x0 + (kw - 1) * dw + 1, w + pr) - x0
        else:
            ys = _count_inside(y0, kh, dh, h)
            xs = _count_inside(x0, kw, dw, w)
        count = Cast(acc, ys * xs)
        v = total / count
        return v if acc == x.dtype else Cast(x.dtype, v)

    return te.compute((x.shape[0], x.shape[1], oh, ow), element, x.dtype, "avg_pool2d")


def _count_inside(start: PrimExpr, k: int, d: int, size: int) -> PrimExpr:
    """How many of start, start+d, ..., start+(k-1)d lie in [0, size)."""
    total: PrimExpr = as_expr(0)
    for j in range(k):
        pos = start + j * d
        total = total + select((pos >= 0) & (pos < size), as_expr(1), as_expr(0))
    return total


def _pool_ref(x: np.ndarray, attrs: Attrs, kind: str) -> np.ndarray:
    kh, kw, sh, sw, dh, dw, pt, pl, oh, ow = _geometry(x.shape, attrs)
    _, _, pb, pr = _pads(attrs)
    n, c, h, w = x.shape
    pad_h = max(pb, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
    pad_w = max(pr, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pl)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + pt + pad_h, w + pl + pad_w), fill)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    inside = np.zeros(xp.shape[2:])
    inside[pt:pt + h, pl:pl + w] = 1
    in_pad = np.zeros(xp.shape[2:])
    in_pad[:h + pt + pb, :w + pl + pr] = 1
    out = np.zeros((n, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            ys = slice(oy * sh, oy * sh + (kh - 1) * dh + 1, dh)
            xs = slice(ox * sw, ox * sw + (kw - 1) * dw + 1, dw)
            win = xp[:, :, ys, xs]
            if kind == "max":
                out[:, :, oy, ox] = win.max(axis=(2, 3))
            else:
                cnt = (in_pad if attrs.get("count_include_pad", False) else inside)[ys, xs].sum()
                out[:, :, oy, ox] = np.where(np.isinf(win), 0, win).sum(axis=(2, 3)) / cnt
    return out.astype(x.dtype)


register_op("max_pool2d", pattern="opaque", infer=_pool_infer, compute=_max_pool_compute,
            reference=lambda x, **a: _pool_ref(x, a, "max"))
register_op("avg_pool2d", pattern="opaque", infer=_pool_infer, compute=_avg_pool_compute,
            reference=lambda x, **a: _pool_ref(x, a, "avg"))


def _global_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if x.ndim < 3:
        raise IRError(f"global pooling expects N, C and spatial dims, got {x}")
    return TensorType((*x.shape[:2], *([1] * (x.ndim - 2))), x.dtype)


def _global_compute(kind: str) -> Any:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        spatial = x.shape[2:]
        count = int(np.prod(spatial))
        acc = "float32" if x.dtype in ("float16", "bfloat16") else x.dtype

        def element(n: PrimExpr, c: PrimExpr, *_: PrimExpr) -> PrimExpr:
            def body(*r: PrimExpr) -> PrimExpr:
                v = x[(n, c, *r)]
                return v if v.dtype == acc else Cast(acc, v)
            total = te.reduce("sum" if kind == "avg" else "max", body, spatial, acc)
            v = total / count if kind == "avg" else total
            return v if acc == x.dtype else Cast(x.dtype, v)

        shape = (*x.shape[:2], *([1] * len(spatial)))
        return te.compute(shape, element, x.dtype, f"global_{kind}_pool")
    return compute


def _global_ref(kind: str) -> Any:
    def ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
        axes = tuple(range(2, x.ndim))
        return (x.mean(axis=axes, keepdims=True) if kind == "avg"
                else x.max(axis=axes, keepdims=True)).astype(x.dtype)
    return ref


register_op("global_avg_pool", pattern="reduce", infer=_global_infer,
            compute=_global_compute("avg"), reference=_global_ref("avg"))
register_op("global_max_pool", pattern="reduce", infer=_global_infer,
            compute=_global_compute("max"), reference=_global_ref("max"))



# --------------------------------------------------------------------------- ONNX mapping

def _pool_converter(op: str) -> Any:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        t = ctx.tensor_type(x)
        if t.ndim != 4:
            raise IRError(f"only 2-D pooling is supported, got input {t}")
        kernel = tuple(int(k) for k in attrs["kernel_shape"])
        strides = tuple(attrs.get("strides", (1, 1)))
        dilations = tuple(attrs.get("dilations", (1, 1)))
        pads = _onnx_pads(attrs, t.static_shape[2:], kernel, strides, dilations)
        extra: dict[str, Any] = {}
        if op == "avg_pool2d":
            extra["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
        return [ctx.call(op, x, kernel_shape=kernel, strides=strides, dilations=dilations,
                         pads=pads, ceil_mode=bool(attrs.get("ceil_mode", 0)), **extra)]
    return convert


onnx_op("MaxPool")(_pool_converter("max_pool2d"))
onnx_op("AveragePool")(_pool_converter("avg_pool2d"))


def _global_converter(op: str) -> Any:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        return [ctx.call(op, x)]
    return convert


onnx_op("GlobalAveragePool")(_global_converter("global_avg_pool"))
onnx_op("GlobalMaxPool")(_global_converter("global_max_pool"))
