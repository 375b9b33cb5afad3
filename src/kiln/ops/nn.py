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
from kiln.ir.tensor import Cast, PrimExpr, as_expr
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
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
