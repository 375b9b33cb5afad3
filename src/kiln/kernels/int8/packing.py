"""Integer products with their weights prepared at compile time (docs/quantization.md).

`qlinear_conv` and `qlinear_matmul` compute `sum((x - x_zp) * (w - w_zp))`. When the
weight and both zero points are constants, the zero-point corrections move out of
the inner loop:

    sum((x - x_zp) * (w - w_zp)) = sum(x * wp) - x_zp * colsum(wp),   wp = w - w_zp

so the packed ops below multiply the raw input by `wp` (int8 when every weight zero
point is 0, else int16) and start from `bias - x_zp * colsum(wp)`, an int32 constant
computed here. A padded convolution reads its input padded with `x_zp`, whose product
the correction term already counts. The B of a matrix product is stored `[K][N]`
(Gemm's `transpose_b` applied) in panels `[ceil(N / 64)][K][64]` (`panelize`), so a
column tile reads one contiguous panel row per k.

- `qlinear_matmul_packed(a, bp, bias, multiplier, y_zp)`: `acc = a @ bp + bias`;
- `qlinear_conv_packed(x, wp, bias, x_zp, multiplier, y_zp)`: `acc = conv(x padded with
  x_zp, wp) + bias`;
- `matmul_integer_packed(a, bp, colsum, a_zp)`: `a @ bp - a_zp * colsum` (int32, not
  requantized: MatMulInteger of dynamic quantization, whose `a_zp` is computed at run
  time);

both requantized like the unpacked ops (`qmin`/`qmax`, round half to even).

API (kept small so the kernels can move to their own package): `applies(call)`,
`pack(call)` (the packed call, or None) and the two ops' `build` (their tensor-
expression lowering).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import (
    DOT4_U8S8,
    Allocate,
    Buffer,
    Cast,
    IfThenElse,
    Intrin,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.ir.types import TensorType, Type
from kiln.kernels.int8 import dot as quant_dot
from kiln.kernels.int8.conv_dot import (
    CONV_DOT,
    choose_tile,
    k_order,
    weight_panels,
    weight_words,
)
from kiln.ops import te
from kiln.ops.kernels.parallel_work import worth_parallel
from kiln.ops.kernels.tiles import loop as tile_loop
from kiln.ops.kernels.tiles import parallel_tiles, parallel_when
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
from kiln.ops.registry import OPS, HandBuiltOp, register_op
from kiln.ops.registry import call as op_call
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
#: `epilogue(acc, column, output index)`: the value a matrix-product tile stores
TileEpilogue = Callable[[PrimExpr, PrimExpr, tuple[PrimExpr, ...]], PrimExpr]
MATMUL = "qlinear_matmul_packed"
CONV = "qlinear_conv_packed"
INTEGER = "matmul_integer_packed"
_WEIGHT_DTYPES = ("int8", "int16")


def applies(call: g.Call) -> bool:
    """Whether `call` is a `qlinear_conv`/`qlinear_matmul` with constant weights, zero
    points and bias (a 2-D B for the matrix product), or a `matmul_integer` with a
    constant 2-D B and B zero point."""
    if call.op == "matmul_integer":
        b, b_zp = call.args[1], call.args[3]
        return isinstance(b, g.Constant) and b.data.ndim == 2 and isinstance(b_zp, g.Constant)
    if call.op not in ("qlinear_conv", "qlinear_matmul"):
        return False
    w, bias, x_zp, w_zp = call.args[1], call.args[2], call.args[3], call.args[4]
    if not all(isinstance(e, g.Constant) for e in (w, bias, x_zp, w_zp)):
        return False
    assert isinstance(w, g.Constant)
    return call.op == "qlinear_conv" or w.data.ndim == 2


def pack(call: g.Call, isa: ISA) -> g.Call | None:
    """The packed form of `call` for `isa`, or None when `applies(call)` is false."""
    if not applies(call):
        return None
    if call.op == "matmul_integer":
        return _pack_matmul_integer(call, isa)
    x, w, bias, x_zp, w_zp, multiplier, y_zp = call.args
    assert isinstance(w, g.Constant) and isinstance(bias, g.Constant)
    assert isinstance(x_zp, g.Constant) and isinstance(w_zp, g.Constant)
    attrs = dict(call.attrs)
    # int8 activations onnxruntime runs as uint8 (kiln.ops.quant_ort): its AVX2 kernels
    # then take them as uint8, and their pairs saturate as uint8 ones do
    as_uint8 = bool(attrs.pop("as_uint8", False))
    zw = np.asarray(w_zp.data, np.int64)
    if call.op == "qlinear_matmul":
        wp = _shifted_b(w.data, w_zp.data, bool(attrs.pop("transpose_b", False)))
        sums = wp.astype(np.int64).sum(axis=0)
    else:
        # 8-bit weights minus an 8-bit zero point fit int16: a quarter of int64's
        # memory traffic over every weight (ResNet-50: 23.5 M)
        data = np.asarray(w.data)
        data = data.astype(np.int16 if data.dtype.itemsize == 1 else np.int64)
        zw = zw.astype(data.dtype)
        wp = data - zw.reshape(-1, *([1] * (data.ndim - 1))) if zw.ndim else data - zw
        sums = wp.reshape(wp.shape[0], -1).sum(axis=1, dtype=np.int64)
    weight_dtype = np.int8 if wp.min() >= -128 and wp.max() <= 127 else np.int16
    groups = int(attrs.get("group", 1))  # type: ignore[arg-type]
    two_d_conv = call.op == "qlinear_conv" and wp.ndim == 4 and groups == 1
    two_d_grouped = call.op == "qlinear_conv" and wp.ndim == 4 and groups > 1
    # onnxruntime's AVX2 pairs (`int8-pairs=saturate`): its u8 x s8 kernels take int8
    # weights as they are, so only those with zero points of 0 (wp = w) saturate as it
    # does, and only with uint8 activations (its s8 x s8 products are exact)
    # (its depthwise kernel, one input and one output channel a group, is exact too)
    depthwise = two_d_grouped and wp.shape[1] == 1 and wp.shape[0] == groups
    sat = (quant_dot.target_saturates(isa) and np.asarray(w.data).dtype == np.int8
           and (np.asarray(x_zp.data).dtype == np.uint8 or as_uint8) and not zw.any()
           and (call.op == "qlinear_matmul" or two_d_conv or (two_d_grouped and not depthwise)))
    dot = quant_dot.target_isa(isa, sat) if (call.op == "qlinear_matmul" or two_d_conv) \
        and weight_dtype == np.int8 else None
    pairs = {"pairs": quant_dot.SATURATE} if sat and dot is not None else {}
    if dot is not None and two_d_conv and dot.int8_dot == "dsp" and not pairs:
        # microcontrollers (Cortex-M): the run-time im2col words would cost RAM and flash
        # the element form does not spend; it reads the input in place
        dot = None
    # the dot form multiplies unsigned bytes: an int8 x is shifted by 128 (quant_dot)
    shift = quant_dot.a_shift(str(np.asarray(x_zp.data).dtype)) if dot else 0
    bias_eff = np.asarray(bias.data, np.int64) - (int(x_zp.data) + shift) * sums
    if np.abs(bias_eff).max(initial=0) >= 2 ** 31:
        return None  # the corrected bias would not fit the int32 accumulator
    packed = g.Constant(np.ascontiguousarray(wp.astype(weight_dtype)), w.name)
    corrected = g.Constant(bias_eff.astype(np.int32))
    if call.op == "qlinear_matmul":
        panels = g.Constant(_panels(np.asarray(packed.data), dot), w.name)
        group = {"k_group": quant_dot.k_group(dot)} if dot else {}
        return op_call(MATMUL, x, panels, corrected, multiplier, y_zp, n=wp.shape[1],
                       **group, **pairs, **attrs)
    if dot is not None:
        by_tap = bool(pairs) or _whole_word_taps(wp, dot)
        words = _conv_words(wp.astype(np.int8), call, dot, by_tap)
        k_group = quant_dot.k_group(dot)
        return op_call(CONV_DOT, x, g.Constant(words, w.name), corrected, x_zp, multiplier,
                       y_zp, w_shape=tuple(wp.shape), **pairs, **attrs,
                       **({"k_group": k_group} if k_group != quant_dot.GROUP else {}),
                       **({"tap_major": True} if by_tap and not pairs else {}))
    if two_d_grouped:
        from kiln.kernels.int8.grouped import GROUPED

        return op_call(GROUPED, x, packed, corrected, x_zp, multiplier, y_zp,
                       **({"pairs": quant_dot.SATURATE} if sat else {}), **attrs)
    return op_call(CONV, x, packed, corrected, x_zp, multiplier, y_zp, **attrs)


def _whole_word_taps(wp: np.ndarray, isa: ISA) -> bool:
    """Whether a convolution with exact dot products takes k = (tap, channel): input
    channels a multiple of a word's 4 and more than one tap, so that every im2col word is
    4 channels of one tap, copied whole from the input's words (or read in place)."""
    return (quant_dot.k_group(isa) == quant_dot.GROUP and isa.int8_dot in quant_dot.EXACT_FAMILIES
            and wp.ndim == 4 and wp.shape[1] % quant_dot.GROUP == 0
            and math.prod(wp.shape[2:]) > 1)


def _conv_words(wp: np.ndarray, call: g.Call, isa: ISA, tap_major: bool) -> np.ndarray:
    """The dot-form convolution's weight: in panels of the channels-as-lanes tile when
    `choose_tile` picks it for the (static) output, else words per output channel (k in
    the order (tap, channel) with `tap_major`)."""
    out = call.type
    spatial = [d for d in out.shape[2:] if isinstance(d, int)] \
        if isinstance(out, TensorType) and out.ndim > 2 else []
    if isinstance(out, TensorType) and spatial and len(spatial) == out.ndim - 2:
        positions = math.prod(spatial)
        tile = choose_tile(isa, positions, int(wp.shape[0]), math.prod(wp.shape[1:]))
        if tile.channels_as_lanes:
            return weight_panels(wp, tile.cols, tap_major, quant_dot.k_group(isa))
    return weight_words(wp, tap_major, quant_dot.k_group(isa))


def _shifted_b(b: np.ndarray, b_zp: np.ndarray, transpose: bool) -> np.ndarray:
    """B as `[K][N]` minus its zero point (scalar or per column), int8 or int16."""
    data = np.asarray(b, np.int64)
    if transpose:
        data = data.T
    zb = np.asarray(b_zp, np.int64)
    wp = data - zb.reshape(1, -1) if zb.ndim else data - zb
    return wp.astype(np.int8 if wp.min() >= -128 and wp.max() <= 127 else np.int16)


def _pack_matmul_integer(call: g.Call, isa: ISA) -> g.Call:
    # (a - a_zp) @ (b - b_zp) = a @ bp - a_zp * colsum(bp): a_zp is known at run time
    # only (DynamicQuantizeLinear computes it), so the kernel multiplies it in.
    a, b, a_zp, b_zp = call.args
    assert isinstance(b, g.Constant) and isinstance(b_zp, g.Constant)
    wp = _shifted_b(b.data, b_zp.data, bool(call.attrs.get("transpose_b")))
    colsum = wp.astype(np.int64).sum(axis=0).astype(np.int32)
    sat = (quant_dot.target_saturates(isa) and np.asarray(b.data).dtype == np.int8
           and isinstance(a.type, TensorType) and a.type.dtype == "uint8"
           and not np.asarray(b_zp.data).any())
    dot = quant_dot.target_isa(isa, sat) if wp.dtype == np.int8 else None
    group = {"k_group": quant_dot.k_group(dot)} if dot else {}
    pairs = {"pairs": quant_dot.SATURATE} if sat and dot is not None else {}
    return op_call(INTEGER, a, g.Constant(_panels(wp, dot), b.name), g.Constant(colsum), a_zp,
                   n=wp.shape[1], **group, **pairs)


def _panels(b: np.ndarray, isa: ISA | None) -> np.ndarray:
    """B's panels: of int8/int16 elements, or of the dot form's words (`isa` given)."""
    if isa is None:
        return panelize(b)
    return panelize(quant_dot.words(b, quant_dot.k_group(isa)), quant_dot.tile_cols(isa))


def panelize(b: np.ndarray, cols: int = 0) -> np.ndarray:
    """B `[K][N]` as panels `[ceil(N / nr)][K][nr]`, nr = min(cols or TILE_COLS, N),
    zero-padded: the kernel's column tile reads one contiguous panel row per k."""
    k, n = b.shape
    nr = min(cols or TILE_COLS, n)
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def unpanelize(bp: np.ndarray, n: int) -> np.ndarray:
    """`panelize` undone: B `[K][N]`."""
    panels, k, nr = bp.shape
    return bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n]


# --------------------------------------------------------------------------- matmul

def _check_packed_product(op: str, a: TensorType, bp: TensorType, attrs: Attrs) -> int:
    """N, the columns of the packed B `[panels][K][nr]` (attribute `n`), checked."""
    n = int(attrs.get("n", -1))
    group = _group(attrs)
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


def _group(attrs: Attrs) -> int:
    """k per element of the packed B: 1, or that of the dot form's words (quant_dot.GROUP
    bytes, quant_dot.PAIR_GROUP int16 halves)."""
    group = int(attrs.get("k_group", 1))
    if group not in (1, quant_dot.GROUP, quant_dot.PAIR_GROUP):
        raise IRError(f"k_group must be 1, {quant_dot.GROUP} or {quant_dot.PAIR_GROUP}, "
                      f"got {group}")
    return group


def tile_isa(attrs: Attrs, isa: ISA) -> ISA | None:
    """The ISA whose register tiles run a packed product of words (`k_group` > 1) on
    `isa`, or None when its dot form packs other words (the te definition reads them)."""
    group = _group(attrs)
    dot = quant_dot.target_isa(isa, quant_dot.saturates(attrs)) if group > 1 else None
    return dot if dot is not None and quant_dot.k_group(dot) == group else None


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
        return quant_dot.saturated_sum(lambda k: quant_dot.a_byte(a[(*rows, k)]) * quant_dot.b_byte(
            bp[col // nr, k // group, col % nr], k, group), k_extent)
    if group > 1:
        return te.reduce("sum", lambda k: quant_dot.a_byte(a[(*rows, k)]) * quant_dot.b_byte(
            bp[col // nr, k // group, col % nr], k, group), (a.shape[-1],), "int32")
    return te.reduce("sum", lambda k: Cast("int32", a[(*rows, k)])
                     * Cast("int32", bp[col // nr, k, col % nr]), (bp.shape[1],), "int32")


def _unpacked_b(a: np.ndarray, bp: np.ndarray, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    """A (int64, shifted as the dot form shifts it) and B `[K][N]` of a packed product."""
    n = int(attrs["n"])
    if _group(attrs) > 1:
        b = unpanelize(quant_dot.unwords(bp, a.shape[-1], _group(attrs)), n)
        shift = quant_dot.a_shift(str(a.dtype))
        return a.astype(np.int64) + shift, b.astype(np.int64)
    return a.astype(np.int64), unpanelize(bp, n).astype(np.int64)


def build_matmul(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression kernel of `qlinear_matmul_packed`."""
    a, bp, bias, multiplier, y_zp = inputs
    n = int(attrs["n"])
    lo, hi = out_range(attrs, y_zp.dtype)

    def value(*i: PrimExpr) -> PrimExpr:
        acc = _row_times_b(a, bp, i[:-1], i[-1], _group(attrs), quant_dot.saturates(attrs))
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

    group = _group(attrs)
    shift = quant_dot.a_shift(a.dtype) if group > 1 else 0

    def value(*i: PrimExpr) -> PrimExpr:
        zp = Cast("int32", a_zp[()]) + shift
        return _row_times_b(a, bp, i[:-1], i[-1], group,
                            quant_dot.saturates(attrs)) - zp * colsum[i[-1]]

    return te.compute((*a.shape[:-1], n), value, "int32", INTEGER)


def _integer_ref(a: np.ndarray, bp: np.ndarray, colsum: np.ndarray, a_zp: np.ndarray,
                 **attrs: Any) -> np.ndarray:
    a64, b = _unpacked_b(a, bp, attrs)
    shift = quant_dot.a_shift(str(a.dtype)) if _group(attrs) > 1 else 0
    acc = _product(a64, b, attrs) - (int(a_zp) + shift) * colsum
    return acc.astype(np.int32)


def _product(a64: np.ndarray, b: np.ndarray, attrs: Attrs) -> np.ndarray:
    """A @ B exactly, or with onnxruntime's saturating pairs (`pairs="saturate"`)."""
    return quant_dot.saturated_matmul(a64, b) if quant_dot.saturates(attrs) \
        else np.matmul(a64, b)




# --------------------------------------------------------------------------- convolution

def conv_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
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

        if quant_dot.saturates(attrs):  # k = (tap, c), pairs clamped to int16
            k_total = int(ci) * int(np.prod(kernel))

            acc = quant_dot.saturated_sum(lambda k: term(
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
    if quant_dot.saturates(attrs):
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
        parts.append(np.moveaxis(quant_dot.saturated_matmul(a, b), -1, 1))
    return np.concatenate(parts, axis=1)


register_op(CONV, pattern="anchor", infer=conv_infer, compute=build_conv,
            reference=conv_packed_ref)


# --------------------------------------------------------------------------- register tiles

#: Rows x columns of int32 accumulators of the matrix-product tile: 4 x 64 = 16 AVX-512
#: registers; every B row loaded from cache feeds MR rows of A.
TILE_ROWS, TILE_COLS = 4, 64


def build_matmul_tiles(a: Buffer, bp: Buffer, n: int, out: Buffer, epilogue: TileEpilogue,
                       isa: ISA | None, intrinsic: str = DOT4_U8S8, *, target: ISA) -> Stmt:
    """The register-tiled loop nest of a packed matrix product (A's leading dims are its
    rows, flattened): tiles of rows x `bp.shape[2]` int32 accumulators (surplus rows and
    columns read the last row/column and are not stored). `epilogue(acc, column, at)`
    is the value stored at output index `at` for an accumulator of output column
    `column` (clamped into the output: safe to read per-column parameters with).

    The tiles run column panel by column panel, every row tile of a panel in turn, as
    one loop over (panel, row tile) split over threads in contiguous chunks: a panel of
    B (`K x nr`, 196 KB for K = 3072 words of 64 columns) is read from memory once and
    then from cache by all row tiles, instead of once per row tile.

    Without `isa`, B holds int8/int16 elements and a tile has TILE_ROWS rows; with it,
    B holds the dot form's words (quant_dot), A's rows are packed into words first and
    a tile has `quant_dot.tile_rows(isa)` rows. `target`: the target's ISA (threads)."""
    lead = tuple(int(d) for d in a.shape[:-1])
    m, k_extent = int(np.prod(lead, dtype=np.int64)), int(a.shape[-1])
    col_tiles, nr = int(bp.shape[0]), int(bp.shape[2])
    mr = min(quant_dot.tile_rows(isa, nr) if isa else TILE_ROWS, m)
    row_tiles = -(-m // mr)
    work = m * n * k_extent
    prologue: list[Stmt] = []
    if isa is not None:
        packed_a = Buffer("a_words", (m, int(bp.shape[1])), "int32", "global")
        prologue = [Allocate(packed_a), quant_dot.pack_a(
            a, packed_a, "parallel" if worth_parallel(work, "madd", target, "int8") and m > 1
            else "serial", quant_dot.k_group(isa))]

    def tile(ct: PrimExpr, rt: PrimExpr) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        def col(v: PrimExpr) -> PrimExpr:
            # clamped only when the last tile is partial: full tiles load contiguously
            return ct * nr + v if n % nr == 0 else min_(ct * nr + v, n - 1)

        def row(r: PrimExpr) -> PrimExpr:
            return rt * mr + r if m % mr == 0 else min_(rt * mr + r, m - 1)

        def update(k: PrimExpr, r: PrimExpr, v: PrimExpr) -> PrimExpr:
            if isa is not None:
                return Intrin(intrinsic, (acc[r, v], packed_a[row(r), k], bp[ct, k, v]))
            a_rk = Cast("int32", a[(*te.unflatten_index(row(r), lead), k)])
            return acc[r, v] + a_rk * Cast("int32", bp[ct, k, v])

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, as_expr(0, "int32"), (r, v)), "vectorized"))
        step = tile_loop("k", int(bp.shape[1]), lambda k: tile_loop(
            "r", mr, lambda r: tile_loop(
                "v", nr, lambda v: Store(acc, update(k, r, v), (r, v)), "vectorized"),
            "unrolled"))

        def store(r: PrimExpr, v: PrimExpr) -> Stmt:
            j = ct * nr + v
            at = (*te.unflatten_index(rt * mr + r, lead), j)
            return Store(out, epilogue(acc[r, v], col(v), at), at)

        def store_row(r: PrimExpr) -> Stmt:
            # whole columns store as vectors (a fused tail then runs on vectors too)
            row = tile_loop("v", nr, lambda v: store(r, v), "vectorized") if n % nr == 0 \
                else tile_loop("v", nr, lambda v: IfThenElse(compare("lt", ct * nr + v, n),
                                                             store(r, v)))
            return row if m % mr == 0 else IfThenElse(compare("lt", rt * mr + r, m), row)

        stores = tile_loop("r", mr, store_row)
        return seq(Allocate(acc), zero, step, stores)

    tiles = parallel_when(lambda: parallel_tiles((col_tiles, row_tiles), tile), work,
                          "madd", "int8", isa=target)
    return seq(*prologue, tiles)


@dataclass(frozen=True)
class _TiledMatmul(HandBuiltOp):
    """A packed matrix product on register tiles for a static A of rank >= 2 (the te
    definition otherwise, and under a fused elementwise tail)."""

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        if result is not None or len(args) != len(params) or args[0].ndim < 2 \
                or not is_static((*args[0].shape, *args[1].shape)):
            return None
        buffers = [Buffer(t.name, t.shape, t.dtype) for t in params]
        a, bp = buffers[0], buffers[1]
        epilogue: TileEpilogue
        if self.name == MATMUL:
            bias, multiplier, y_zp = buffers[2:]
            lo, hi = out_range(attrs, y_zp.dtype)
            dtype = y_zp.dtype

            def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
                mult = multiplier[()] if multiplier.ndim == 0 else multiplier[j]
                return requantize_value(acc + bias[j], mult, y_zp[()], lo, hi, y_zp.dtype)
        else:
            colsum, a_zp = buffers[2:]
            dtype = "int32"

            shift = quant_dot.a_shift(a.dtype) if _group(attrs) > 1 else 0

            def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
                return acc - (Cast("int32", a_zp[()]) + shift) * colsum[j]

        n = int(attrs["n"])
        out = Buffer("out", (*a.shape[:-1], n), dtype)
        tiles = tile_isa(attrs, isa)
        if _group(attrs) > 1 and tiles is None:
            return None  # words packed for another target: the te definition reads them
        body = build_matmul_tiles(a, bp, n, out, epilogue, tiles, quant_dot.dot_intrinsic(attrs),
                                  target=isa)
        return PrimFunc((*buffers, out), body,
                        {ATTR_GEMM_KERNEL: self.name})

OPS.register(MATMUL, _TiledMatmul(MATMUL, "anchor", _matmul_infer, build_matmul, _matmul_ref))
OPS.register(INTEGER, _TiledMatmul(INTEGER, "anchor", _integer_infer, build_integer,
                                   _integer_ref))
