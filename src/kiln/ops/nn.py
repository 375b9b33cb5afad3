"""Neural-network anchor operators: matmul, conv2d, pooling.

Attributes follow ONNX's spelling where one exists (strides, pads as
(top, left, bottom, right), dilations, group), so the frontend maps 1:1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.tensor import Cast, PrimExpr, as_expr
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.onnx_map import GraphContext, onnx_op
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


# --------------------------------------------------------------------------- matmul

def _matmul_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy.matmul's result shape (1-D operands promoted and squeezed)."""
    if len(a) == 0 or len(b) == 0:
        raise IRError("matmul operands must have at least one dimension")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise IRError(f"matmul: inner dimensions differ: {tuple(a)} @ {tuple(b)}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, b = types
    if a.dtype != b.dtype:
        raise IRError(f"matmul: operand dtypes differ ({a.dtype} vs {b.dtype})")
    return TensorType(_matmul_shapes(a.shape, b.shape), a.dtype)  # type: ignore[arg-type]


def _acc_dtype(dtype: str) -> str:
    """Accumulate 16-bit floats in float32 and small ints in int32 (then cast back)."""
    if dtype in ("float16", "bfloat16"):
        return "float32"
    if dt.is_int(dtype) and dt.bits(dtype) < 32:
        return "int32" if dt.is_signed(dtype) else "uint32"
    return dtype


def _matmul_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, b = inputs
    a_shape = (1, *a.shape) if a.ndim == 1 else a.shape
    b_shape = (*b.shape, 1) if b.ndim == 1 else b.shape
    out_shape = _matmul_shapes(a.shape, b.shape)
    batch_rank = len(broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    k_extent = a_shape[-1]
    acc = _acc_dtype(a.dtype)

    def element(*i: PrimExpr) -> PrimExpr:
        full = list(i)
        if b.ndim == 1:
            full.append(as_expr(0))
        if a.ndim == 1:
            full.insert(len(full) - 1, as_expr(0))
        batch, row, col = full[:batch_rank], full[batch_rank], full[batch_rank + 1]

        def a_at(k: PrimExpr) -> PrimExpr:
            idx = (*broadcast_index(batch, a_shape[:-2]), row, k)
            return a[idx[-1:] if a.ndim == 1 else idx]

        def b_at(k: PrimExpr) -> PrimExpr:
            idx = (*broadcast_index(batch, b_shape[:-2]), k, col)
            return b[idx[:-1] if b.ndim == 1 else idx]

        total = te.reduce("sum", lambda k: _widen(a_at(k), acc) * _widen(b_at(k), acc),
                          (k_extent,), acc)
        return _widen(total, a.dtype)

    return te.compute(out_shape, element, a.dtype, "matmul")


def _widen(x: PrimExpr, dtype: str) -> PrimExpr:
    return x if x.dtype == dtype else Cast(dtype, x)


def _matmul_ref(a: np.ndarray, b: np.ndarray, **attrs: Any) -> np.ndarray:
    return np.matmul(a, b).astype(a.dtype)


register_op("matmul", pattern="anchor", infer=_matmul_infer, compute=_matmul_compute,
            reference=_matmul_ref)


# --------------------------------------------------------------------------- conv2d

def _pair(attrs: Attrs, key: str, default: int) -> tuple[int, int]:
    v = attrs.get(key, (default, default))
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(v) != 2:
        raise IRError(f"{key} must have 2 values, got {v}")
    return int(v[0]), int(v[1])


def _pads(attrs: Attrs) -> tuple[int, int, int, int]:
    p = tuple(attrs.get("pads", (0, 0, 0, 0)))
    if len(p) != 4:
        raise IRError(f"pads must be (top, left, bottom, right), got {p}")
    return int(p[0]), int(p[1]), int(p[2]), int(p[3])


def _conv_out(size: int, k: int, stride: int, dil: int, lo: int, hi: int) -> int:
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


def _conv2d_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, w = types[0], types[1]
    if x.ndim != 4 or w.ndim != 4:
        raise IRError(f"conv2d expects NCHW input and OIHW weight, got {x} and {w}")
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    group = int(attrs.get("group", 1))
    if c != ci * group:
        raise IRError(f"conv2d: input has {c} channels, weight expects {ci} x group {group}")
    if len(types) == 3 and tuple(types[2].shape) != (o,):
        raise IRError(f"conv2d: bias shape {types[2].shape} must be ({o},)")
    sh, sw = _pair(attrs, "strides", 1)
    dh, dw = _pair(attrs, "dilations", 1)
    pt, pl, pb, pr = _pads(attrs)
    oh = _conv_out(h, kh, sh, dh, pt, pb)  # type: ignore[arg-type]
    ow = _conv_out(wd, kw, sw, dw, pl, pr)  # type: ignore[arg-type]
    if oh <= 0 or ow <= 0:
        raise IRError(f"conv2d output would be empty ({oh}x{ow})")
    return TensorType((n, o, oh, ow), x.dtype)


def _conv2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) == 3 else None
    out = _conv2d_infer([TensorType(t.shape, t.dtype) for t in inputs], attrs)
    assert isinstance(out, TensorType)
    _, ci, kh, kw = w.shape
    o = w.shape[0]
    group = int(attrs.get("group", 1))
    per_group = o // group
    sh, sw = _pair(attrs, "strides", 1)
    dh, dw = _pair(attrs, "dilations", 1)
    pt, pl, _, _ = _pads(attrs)
    acc = _acc_dtype(x.dtype)

    def element(n: PrimExpr, oc: PrimExpr, oy: PrimExpr, ox: PrimExpr) -> PrimExpr:
        g0 = (oc // per_group) * ci

        def term(c: PrimExpr, ky: PrimExpr, kx: PrimExpr) -> PrimExpr:
            iy = oy * sh + ky * dh - pt
            ix = ox * sw + kx * dw - pl
            xv = te.padded(x, (n, g0 + c, iy, ix), 0)
            return _widen(xv, acc) * _widen(w[oc, c, ky, kx], acc)

        total = te.reduce("sum", term, (ci, kh, kw), acc)
        if bias is not None:
            total = total + _widen(bias[oc], acc)
        return _widen(total, x.dtype)

    return te.compute(out.shape, element, x.dtype, "conv2d")  # type: ignore[arg-type]


def _conv2d_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                **attrs: Any) -> np.ndarray:
    group = int(attrs.get("group", 1))
    sh, sw = _pair(attrs, "strides", 1)
    dh, dw = _pair(attrs, "dilations", 1)
    pt, pl, pb, pr = _pads(attrs)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, _, h, wd = xp.shape
    o, ci, kh, kw = w.shape
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    per_group = o // group
    for oc in range(o):
        g0 = (oc // per_group) * ci
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, g0:g0 + ci, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                           kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, ky, kx])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out.astype(x.dtype)


register_op("conv2d", pattern="anchor", infer=_conv2d_infer, compute=_conv2d_compute,
            reference=_conv2d_ref)


# --------------------------------------------------------------------------- ONNX mapping

def _onnx_pads(attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int],
               strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, int, int, int]:
    """ONNX pads/auto_pad for 2-D spatial dims -> (top, left, bottom, right)."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return pads[0][0], pads[1][0], pads[0][1], pads[1][1]
    if auto == "VALID":
        return 0, 0, 0, 0
    p = tuple(int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
    if len(p) != 4:
        raise IRError(f"only 2-D convolution/pooling is supported, got pads {p}")
    return p[0], p[1], p[2], p[3]


def _conv_attrs(attrs: dict[str, Any], x: TensorType, kernel: Sequence[int]) -> dict[str, Any]:
    if x.ndim != 4:
        raise IRError(f"only 2-D (NCHW) convolution is supported, got input {x}")
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1)))
    spatial = list(x.static_shape[2:])
    return {"strides": strides, "dilations": dilations,
            "pads": _onnx_pads(attrs, spatial, kernel, strides, dilations)}


@onnx_op("Conv")
def _conv_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    wt = ctx.tensor_type(w)
    kernel = tuple(attrs.get("kernel_shape", wt.shape[2:]))
    conv_attrs = _conv_attrs(attrs, ctx.tensor_type(x), kernel)
    args = [x, w] if b is None else [x, w, b]
    return [ctx.call("conv2d", *args, group=int(attrs.get("group", 1)), **conv_attrs)]


@onnx_op("MatMul")
def _matmul_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [ctx.call("matmul", a, b)]


@onnx_op("Gemm")
def _gemm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    if attrs.get("transA", 0):
        a = ctx.call("transpose", a, perm=(1, 0))
    if attrs.get("transB", 0):
        b = ctx.call("transpose", b, perm=(1, 0))
    y = ctx.call("matmul", a, b)
    dtype = ctx.tensor_type(y).dtype
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = ctx.call("multiply", y, ctx.const(alpha, dtype))
    if c is not None:
        if beta != 1.0:
            c = ctx.call("multiply", c, ctx.const(beta, dtype))
        y = ctx.call("add", y, c)
    return [y]


@onnx_op("BatchNormalization")
def _batchnorm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    xt = ctx.tensor_type(x)
    eps = float(attrs.get("epsilon", 1e-5))
    # y = x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a (per channel)
    a = ctx.call("divide", scale, ctx.call("sqrt", ctx.call(
        "add", var, ctx.const(eps, ctx.tensor_type(var).dtype))))
    b = ctx.call("subtract", bias, ctx.call("multiply", mean, a))
    shape = (xt.static_shape[1],) + (1,) * (xt.ndim - 2)
    a = ctx.call("reshape", a, shape=shape)
    b = ctx.call("reshape", b, shape=shape)
    return [ctx.call("add", ctx.call("multiply", x, a), b)]
