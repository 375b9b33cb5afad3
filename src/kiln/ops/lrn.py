"""LRN (local response normalization across channels), rounded as onnxruntime rounds it.

`y = x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels) ** beta`.

Quantized models keep LRN in float between a DequantizeLinear and a QuantizeLinear
(Inception / GoogLeNet), so one float32 ulp of difference can move a quantized value
by one step. For float32 with static shapes the kernel therefore computes exactly what
onnxruntime's CPU kernel (onnxruntime/core/providers/cpu/nn/lrn.cc) computes:

- the scale of channel 0 is `bias` plus `a x_k^2` (`a = alpha / size` in float32)
  over its window, in channel order, each product and sum rounded; the scale of
  channel `c > 0` is the previous channel's plus the entering term minus the leaving
  one (a running sum: the window is never re-added);
- `y = x * scale ** -beta` with Eigen's float32 `pow` (kiln.ops.ort_pow).

The numpy reference runs the same steps, so constant folding and the interpreter
agree with the compiled kernel (kiln.kernels.lrn) bit for bit. Other dtypes and
symbolic shapes take a tensor-expression definition (the window summed directly,
float64-free but not onnxruntime's rounding).

`lrn_nchwc` is LRN on a float32 NCHW{b}c tensor `[N][C/b][H][W][b]` (the layout pass
keeps GoogLeNet's stem in its NCHW{b}c region with it on `precision=bf16` targets):
each window summed directly from `bias` in channel order (no running sum: the window
crosses channel blocks), the channels past the blocked ones adding zero as
onnxruntime's padding does, and with attribute `roots` (beta 0.75) `s ** -0.75` taken
by square roots as kiln.kernels.lrn takes it on those targets; the blocked padding
channels must be zeros (they then stay zeros and add nothing to their neighbours).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.nn import acc_dtype, widen
from kiln.ops.ort_pow import NumpyArith, powf
from kiln.ops.registry import Attrs, register_op
from kiln.ops.spatial import MAX_WINDOW

F32 = "float32"
I32 = "int32"
I64 = "int64"


def lrn_window(attrs: Attrs) -> tuple[int, int, int]:
    """(size, channels before, channels after) of the window."""
    size = int(attrs["size"])
    if not 1 <= size <= MAX_WINDOW:  # a window sums `size` channels per element
        raise IRError(f"lrn: size must be in [1, {MAX_WINDOW}], got {size}")
    return size, (size - 1) // 2, size - 1 - (size - 1) // 2


def lrn_params(attrs: Attrs) -> tuple[float, float, float]:
    """(alpha / size, beta, bias), alpha / size rounded as a float32 division."""
    size = lrn_window(attrs)[0]
    a = float(np.float32(attrs.get("alpha", 1e-4)) / np.float32(size))
    return a, float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    if x.ndim < 2 or not dt.is_float(x.dtype):
        raise IRError(f"lrn expects a float (N, C, ...) tensor, got {x}")
    lrn_window(attrs)
    return x


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    size, before, _ = lrn_window(attrs)
    acc = acc_dtype(x.dtype)
    alpha = float(attrs.get("alpha", 1e-4)) / size
    beta = float(attrs.get("beta", 0.75))
    bias = float(attrs.get("bias", 1.0))

    def element(n: t.PrimExpr, c: t.PrimExpr, *rest: t.PrimExpr) -> t.PrimExpr:
        def sq(k: t.PrimExpr) -> t.PrimExpr:
            v = widen(te.padded(x, (n, c - before + k, *rest), 0), acc)
            return v * v
        total = te.reduce("sum", sq, (size,), acc)
        scale = t.intrin("pow", t.as_expr(bias, acc) + t.as_expr(alpha, acc) * total,
                         t.as_expr(beta, acc))
        return widen(widen(x[(n, c, *rest)], acc) / scale, x.dtype)

    return te.compute(x.shape, element, x.dtype, "lrn")


# --------------------------------------------------------------------------- float32


def _scale_np(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    """onnxruntime's running-sum scale of a float32 (N, C, ...) array."""
    _, before, after = lrn_window(attrs)
    a, _, bias = lrn_params(attrs)
    af = np.float32(a)
    c = x.shape[1]
    terms = af * (x * x)  # float32 throughout
    out = np.empty_like(x)
    s = np.full(x[:, 0].shape, np.float32(bias), np.float32)
    for k in range(-before, after + 1):
        if 0 <= k < c:
            s = s + terms[:, k]
    out[:, 0] = s
    for ch in range(1, c):
        if ch + after < c:
            s = s + terms[:, ch + after]
        if ch - 1 - before >= 0:
            s = s - terms[:, ch - 1 - before]
        out[:, ch] = s
    return out


def _pow_np(s: np.ndarray, y: float) -> np.ndarray:
    with np.errstate(all="ignore"):  # lanes of zero/inf/NaN scales are replaced in powf
        return np.asarray(powf(NumpyArith(), s, y), np.float32)


def _reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
    if x.dtype != np.float32:
        return _reference_wide(x, attrs)
    s = _scale_np(x, attrs)
    with np.errstate(all="ignore"):  # IEEE: 0 * inf is NaN, as the kernel computes
        return (x * _pow_np(s, -lrn_params(attrs)[1])).astype(np.float32)


def _reference_wide(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    size, before, after = lrn_window(attrs)
    x64 = x.astype(np.float64)
    sq = np.pad(x64 ** 2, ((0, 0), (before, after)) + ((0, 0),) * (x.ndim - 2))
    total = sum(sq[:, k:k + x.shape[1]] for k in range(size))
    alpha = float(attrs.get("alpha", 1e-4)) / size
    out = x64 / (float(attrs.get("bias", 1.0)) + alpha * total) ** float(attrs.get("beta", 0.75))
    return out.astype(x.dtype)


register_op("lrn", pattern="opaque", infer=_infer, compute=_compute, reference=_reference)


# --------------------------------------------------------------------------- NCHW{b}c

#: LRN on an NCHW{b}c tensor (kiln.transform.nchwc_layout, on `precision=bf16` targets).
LRN_NCHWC = "lrn_nchwc"


def _infer_nchwc(types: Sequence[TensorType], attrs: Attrs) -> Type:
    if types[0].ndim != 5 or types[0].dtype != F32:
        raise IRError(f"{LRN_NCHWC} expects a float32 [N][C/b][H][W][b] tensor, "
                      f"got {types[0]}")
    return _infer(types, attrs)


def _compute_nchwc(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    size, before, _ = lrn_window(attrs)
    a, beta, bias = lrn_params(attrs)
    blocks, block = x.shape[1], int(x.shape[4])
    channels = t.as_expr(blocks, I64) * t.Const(block, I64)

    def element(n: t.PrimExpr, cb: t.PrimExpr, h: t.PrimExpr, w: t.PrimExpr,
                v: t.PrimExpr) -> t.PrimExpr:
        total: t.PrimExpr = t.Const(float(np.float32(bias)), F32)
        for k in range(size):
            ch = cb * t.Const(block, I64) + v + t.Const(k - before, I64)
            safe = t.max_(t.min_(ch, channels - t.Const(1, I64)), t.Const(0, I64))
            value = x[n, safe // t.Const(block, I64), h, w, safe % t.Const(block, I64)]
            inside = (ch >= t.Const(0, I64)) & (ch < channels)
            total = total + t.select(inside, t.Const(a, F32) * (value * value),
                                     t.Const(0.0, F32))
        return x[n, cb, h, w, v] * t.intrin("pow", total, t.Const(-beta, F32))

    return te.compute(x.shape, element, x.dtype, "lrn")


def nchwc_scale_np(x: np.ndarray, attrs: Attrs) -> np.ndarray:
    """The scale `bias + sum of a x^2 over the window` of every channel of a float32
    NCHW{b}c array, each window summed in channel order from `bias` (the kernel's order);
    channels past the blocked ones add nothing."""
    size, before, _ = lrn_window(attrs)
    a, _, bias = lrn_params(attrs)
    n, cb, h, w, b = x.shape
    flat = x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
    terms = np.float32(a) * (flat * flat)
    padded = np.concatenate([np.zeros((n, before, h, w), np.float32), terms,
                             np.zeros((n, size - 1 - before, h, w), np.float32)], axis=1)
    s = np.full(flat.shape, np.float32(bias), np.float32)
    for k in range(size):
        s = s + padded[:, k:k + cb * b]
    return s.reshape(n, cb, b, h, w).transpose(0, 1, 3, 4, 2)


def roots_pow(s: np.ndarray) -> np.ndarray:
    """`s ** -0.75` as `1 / (sqrt(s) * sqrt(sqrt(s)))` in float32 (kiln.kernels.lrn)."""
    root = np.sqrt(s)
    return (np.float32(1.0) / (root * np.sqrt(root))).astype(np.float32)


def _reference_nchwc(x: np.ndarray, **attrs: Any) -> np.ndarray:
    s = nchwc_scale_np(x, attrs)
    with np.errstate(all="ignore"):
        scale = roots_pow(s) if attrs.get("roots") else _pow_np(s, -lrn_params(attrs)[1])
        return (x * scale).astype(np.float32)


register_op(LRN_NCHWC, pattern="opaque", infer=_infer_nchwc, compute=_compute_nchwc,
            reference=_reference_nchwc)
