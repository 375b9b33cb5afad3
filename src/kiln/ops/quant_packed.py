"""The packed integer products (docs/quantization.md): the ops the quantize-ops pass
rewrites `qlinear_conv`, `qlinear_matmul` and `matmul_integer` with constant weights into
(their packers and kernels: kiln.kernels.int8).

`qlinear_conv` and `qlinear_matmul` compute `sum((x - x_zp) * (w - w_zp))`. When the
weight and both zero points are constants, the zero-point corrections move out of
the inner loop:

    sum((x - x_zp) * (w - w_zp)) = sum(x * wp) - x_zp * colsum(wp),   wp = w - w_zp

so the packed ops below multiply the raw input by `wp` (int8 when every weight zero
point is 0, else int16) and start from `bias - x_zp * colsum(wp)`, an int32 constant
computed at compile time. A padded convolution reads its input padded with `x_zp`, whose
product the correction term already counts. The B of a matrix product is stored `[K][N]`
(Gemm's `transpose_b` applied) in panels `[ceil(N / nr)][K][nr]` (kiln.ops.quant_words
`panelize`), so a column tile reads one contiguous panel row per k; with `k_group` > 1
its panels hold the dot form's words (kiln.ops.quant_words).

- `qlinear_matmul_packed(a, bp, bias, multiplier, y_zp)`: `acc = a @ bp + bias`;
- `qlinear_conv_packed(x, wp, bias, x_zp, multiplier, y_zp)`: `acc = conv(x padded with
  x_zp, wp) + bias`;
- `qlinear_conv_grouped(...)`: the same operands and values as `qlinear_conv_packed`,
  for a convolution of more than one group (its kernel: vector tiles);
- `matmul_integer_packed(a, bp, colsum, a_zp)`: `a @ bp - a_zp * colsum` (int32, not
  requantized: MatMulInteger of dynamic quantization, whose `a_zp` is computed at run
  time);

all requantized like the unpacked ops (`qmin`/`qmax`, round half to even).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.tensor import Cast, PrimExpr, as_expr
from kiln.ir.types import TensorType, Type
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.ops.nn import conv_geometry, conv_ref
from kiln.ops.quant import (
    PRODUCT_DTYPES,
    channel,
    check_requant,
    conv_int_shape,
    out_range,
    requantize_ref,
    requantize_value,
)
from kiln.ops.quant_words import k_order, unpanelize
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
MATMUL = "qlinear_matmul_packed"
CONV = "qlinear_conv_packed"
GROUPED = "qlinear_conv_grouped"
INTEGER = "matmul_integer_packed"
_WEIGHT_DTYPES = ("int8", "int16")


def _check_packed_product(op: str, a: TensorType, bp: TensorType, attrs: Attrs) -> int:
    """N, the columns of the packed B `[panels][K][nr]` (attribute `n`), checked."""
    n = int(attrs.get("n", -1))
    group = packed_group(attrs)
    weights = ("int32",) if group > 1 else _WEIGHT_DTYPES
    if a.dtype not in PRODUCT_DTYPES or bp.dtype not in weights or bp.ndim != 3 \
            or not (bp.shape[0] - 1) * bp.shape[2] < n <= bp.shape[0] * bp.shape[2]:
        raise IRError(f"{op}: A must be int8/uint8 and the packed B {'/'.join(weights)} "
                      f"panels [panels][K / {group}][nr] holding n={n} columns, got "
                      f"{a.dtype} and {bp.dtype}{tuple(bp.shape)}")
    k = a.shape[-1] if a.ndim else None
    if not isinstance(k, int) or -(-k // group) != bp.shape[1]:
        raise IRError(f"{op}: inner dimensions differ: {tuple(a.shape)} @ "
                      f"[{bp.shape[1]}, {n}]")
    return n


def packed_group(attrs: Attrs) -> int:
    """k per element of a packed B (attribute `k_group`): 1, or that of the dot form's
    words (kiln.ops.quant_words: GROUP bytes, PAIR_GROUP int16 halves)."""
    group = int(attrs.get("k_group", 1))
    if group not in (1, qw.GROUP, qw.PAIR_GROUP):
        raise IRError(f"k_group must be 1, {qw.GROUP} or {qw.PAIR_GROUP}, "
                      f"got {group}")
    return group


def _matmul_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, bp, bias, multiplier, y_zp = types
    n = _check_packed_product(MATMUL, a, bp, attrs)
    check_requant(MATMUL, n, bias, multiplier, y_zp, attrs)
    return TensorType((*a.shape[:-1], n), y_zp.dtype)


def _row_times_b(a: te.Tensor, bp: te.Tensor, rows: Sequence[PrimExpr],
                 col: PrimExpr, group: int, saturate: bool = False) -> PrimExpr:
    """The int32 sum over k of a[rows, k] * B[k, col] (B in panels; in words when
    `group` > 1, with A shifted as the dot form shifts it; with `saturate` the products
    of k = 2p and 2p + 1 summed and clamped to int16 first)."""
    nr = bp.shape[2]
    k_extent = int(a.shape[-1])
    if saturate:
        return qw.saturated_sum(lambda k: qw.a_byte(a[(*rows, k)]) * qw.b_byte(
            bp[col // nr, k // group, col % nr], k, group), k_extent)
    if group > 1:
        return te.reduce("sum", lambda k: qw.a_byte(a[(*rows, k)]) * qw.b_byte(
            bp[col // nr, k // group, col % nr], k, group), (a.shape[-1],), "int32")
    return te.reduce("sum", lambda k: Cast("int32", a[(*rows, k)])
                     * Cast("int32", bp[col // nr, k, col % nr]), (bp.shape[1],), "int32")


def _unpacked_b(a: np.ndarray, bp: np.ndarray, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    """A (int64, shifted as the dot form shifts it) and B `[K][N]` of a packed product."""
    n = int(attrs["n"])
    if packed_group(attrs) > 1:
        b = unpanelize(qw.unwords(bp, a.shape[-1], packed_group(attrs)), n)
        shift = qw.a_shift(str(a.dtype))
        return a.astype(np.int64) + shift, b.astype(np.int64)
    return a.astype(np.int64), unpanelize(bp, n).astype(np.int64)


def build_matmul(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression kernel of `qlinear_matmul_packed`."""
    a, bp, bias, multiplier, y_zp = inputs
    n = int(attrs["n"])
    lo, hi = out_range(attrs, y_zp.dtype)

    def value(*i: PrimExpr) -> PrimExpr:
        acc = _row_times_b(a, bp, i[:-1], i[-1], packed_group(attrs), qw.saturates(attrs))
        col = i[-1]
        return requantize_value(acc + bias[col], channel(multiplier, col), y_zp[()], lo, hi,
                                y_zp.dtype)

    return te.compute((*a.shape[:-1], n), value, y_zp.dtype, MATMUL)


def _matmul_ref(a: np.ndarray, bp: np.ndarray, bias: np.ndarray, multiplier: np.ndarray,
                y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    a64, b = _unpacked_b(a, bp, attrs)
    acc = (_product(a64, b, attrs) + bias).astype(np.int32)
    lo, hi = out_range(attrs, dt.from_numpy(y_zp.dtype))
    return requantize_ref(acc, multiplier, y_zp, lo, hi, acc.ndim - 1)


def _integer_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, bp, colsum, a_zp = types
    n = _check_packed_product(INTEGER, a, bp, attrs)
    if colsum.dtype != "int32" or tuple(colsum.shape) != (n,) or a_zp.ndim \
            or a_zp.dtype != a.dtype:
        raise IRError(f"{INTEGER}: expects int32 column sums ({n},) and a scalar "
                      f"zero point of A's type {a.dtype}")
    return TensorType((*a.shape[:-1], n), "int32")


def build_integer(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression kernel of `matmul_integer_packed`."""
    a, bp, colsum, a_zp = inputs
    n = int(attrs["n"])

    group = packed_group(attrs)
    shift = qw.a_shift(a.dtype) if group > 1 else 0

    def value(*i: PrimExpr) -> PrimExpr:
        zp = Cast("int32", a_zp[()]) + shift
        return _row_times_b(a, bp, i[:-1], i[-1], group,
                            qw.saturates(attrs)) - zp * colsum[i[-1]]

    return te.compute((*a.shape[:-1], n), value, "int32", INTEGER)


def _integer_ref(a: np.ndarray, bp: np.ndarray, colsum: np.ndarray, a_zp: np.ndarray,
                 **attrs: Any) -> np.ndarray:
    a64, b = _unpacked_b(a, bp, attrs)
    shift = qw.a_shift(str(a.dtype)) if packed_group(attrs) > 1 else 0
    acc = _product(a64, b, attrs) - (int(a_zp) + shift) * colsum
    return acc.astype(np.int32)


def _product(a64: np.ndarray, b: np.ndarray, attrs: Attrs) -> np.ndarray:
    """A @ B exactly, or with onnxruntime's saturating pairs (`pairs="saturate"`)."""
    return qw.saturated_matmul(a64, b) if qw.saturates(attrs) \
        else np.matmul(a64, b)


def conv_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """The type rule of `qlinear_conv_packed` (and `qlinear_conv_grouped`)."""
    x, wp, bias, x_zp, multiplier, y_zp = types
    if wp.dtype not in _WEIGHT_DTYPES:
        raise IRError(f"{CONV}: the packed weight must be int8 or int16, got {wp.dtype}")
    # the geometry and input checks of the unpacked op (a zero weight zero point)
    shape = conv_int_shape(CONV, [x, TensorType(wp.shape, "int8"), x_zp,
                                   TensorType((), "int8")], attrs)
    check_requant(CONV, wp.shape[0], bias, multiplier, y_zp, attrs)
    return TensorType(shape, y_zp.dtype)


def build_conv(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression kernel of `qlinear_conv_packed`: the input padded with its
    zero point is materialized once (when there are pads), so the reduction reads it
    without bounds tests."""
    x, wp, bias, x_zp, multiplier, y_zp = inputs
    rank, strides, dilations, begins, ends = conv_geometry(x.shape, wp.shape, attrs, CONV)
    ci, kernel = wp.shape[1], wp.shape[2:]
    group = int(attrs.get("group", 1))
    per_group = wp.shape[0] // group
    lo, hi = out_range(attrs, y_zp.dtype)
    src = x
    if any(begins) or any(ends):
        padded_shape = (*x.shape[:2], *(x.shape[2 + j] + begins[j] + ends[j]
                                         for j in range(rank)))
        src = te.compute(padded_shape, lambda n, c, *p: te.padded(
            x, (n, c, *(p[j] - begins[j] for j in range(rank))), x_zp[()]),
            x.dtype, "x_padded", materialize=True)
    out_shape = conv_int_shape(CONV, [TensorType(x.shape, x.dtype),
                                       TensorType(wp.shape, "int8"),
                                       TensorType((), x.dtype), TensorType((), "int8")], attrs)

    def value(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        first = (oc // per_group) * ci if group > 1 else as_expr(0)

        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] for j in range(rank))
            return Cast("int32", src[(n, first + c, *pos)]) * Cast("int32", wp[(oc, c, *k)])

        if qw.saturates(attrs):  # k = (tap, c), pairs clamped to int16
            k_total = int(ci) * int(np.prod(kernel))

            acc = qw.saturated_sum(lambda k: term(
                k % ci, *te.unflatten_index(k // ci, kernel)), k_total) + bias[oc]
        else:
            acc = te.reduce("sum", term, (ci, *kernel), "int32") + bias[oc]
        return requantize_value(acc, channel(multiplier, oc), y_zp[()], lo, hi, y_zp.dtype)

    return te.compute(out_shape, value, y_zp.dtype, CONV)


def conv_packed_ref(x: np.ndarray, wp: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
                    multiplier: np.ndarray, y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy reference of the packed integer convolution with its requantizing
    epilogue."""
    rank, _, _, begins, ends = conv_geometry(x.shape, wp.shape, attrs, CONV)
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), *zip(begins, ends)),
                constant_values=int(x_zp))
    unpadded = {a: v for a, v in attrs.items() if a != "pairs"} | {"pads": (0,) * (2 * rank)}
    if qw.saturates(attrs):
        acc = _saturated_conv(xp, wp.astype(np.int64), **unpadded)
    else:
        acc = conv_ref(xp, wp.astype(np.int64), **unpadded)
    acc = (acc + bias.astype(np.int64).reshape(-1, *([1] * rank))).astype(np.int32)
    lo, hi = out_range(attrs, dt.from_numpy(y_zp.dtype))
    return requantize_ref(acc, multiplier, y_zp, lo, hi, 1)


def _saturated_conv(xp: np.ndarray, wp: np.ndarray, **attrs: Any) -> np.ndarray:
    """The (padded) convolution of `int8-pairs=saturate`, group by group: an im2col in
    onnxruntime's k order (tap, channel) times the weight, pairs clamped to int16."""
    rank, strides, dilations, _, _ = conv_geometry(xp.shape, wp.shape, attrs, CONV)
    kernel, groups = wp.shape[2:], int(attrs.get("group", 1))
    spatial = [(xp.shape[2 + j] - (kernel[j] - 1) * dilations[j] - 1) // strides[j] + 1
               for j in range(rank)]
    cols = []
    for tap in np.ndindex(*kernel):
        window = tuple(slice(tap[j] * dilations[j],
                             tap[j] * dilations[j] + (spatial[j] - 1) * strides[j] + 1,
                             strides[j]) for j in range(rank))
        cols.append(xp[(slice(None), slice(None), *window)])
    taps = np.stack(cols, axis=2)  # [N][C][taps][spatial...]
    cig, cog = wp.shape[1], wp.shape[0] // groups
    parts = []
    for gi in range(groups):
        a = taps[:, gi * cig:(gi + 1) * cig].swapaxes(1, 2)  # [N][taps][cig][spatial...]
        a = np.moveaxis(a.reshape(a.shape[0], -1, *spatial), 1, -1)  # [..., K]
        b = k_order(wp[gi * cog:(gi + 1) * cog], True).T  # [K][cog]
        parts.append(np.moveaxis(qw.saturated_matmul(a, b), -1, 1))
    return np.concatenate(parts, axis=1)


register_op(MATMUL, pattern="anchor", infer=_matmul_infer, compute=build_matmul,
            reference=_matmul_ref)
register_op(INTEGER, pattern="anchor", infer=_integer_infer, compute=build_integer,
            reference=_integer_ref)
register_op(CONV, pattern="anchor", infer=conv_infer, compute=build_conv,
            reference=conv_packed_ref)
register_op(GROUPED, pattern="anchor", infer=conv_infer, compute=build_conv,
            reference=conv_packed_ref)
