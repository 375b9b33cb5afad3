"""Integer products with their weights prepared at compile time (docs/quantization.md):
the packers of the int8 kernel families (kiln.kernels.int8.families).

`qlinear_conv` and `qlinear_matmul` with constant weights, zero points and bias become
the packed ops of kiln.ops.quant_packed and kiln.ops.quant_conv_words: the weight shifted
by its zero point (`wp`, int8 when every weight zero point is 0, else int16), the input
zero point's correction `- x_zp * colsum(wp)` folded into the int32 bias; a
`matmul_integer` with a constant B (and a `dynamic_quant_matmul`, kiln.ops.quant_dynamic)
becomes `matmul_integer_packed`, B's column sums applied at run time (its A zero point is
known only then).

`plan(call, isa)` decides which packed op a `qlinear_conv` / `qlinear_matmul` becomes
on `isa` (None: it is not packed, e.g. when the corrected bias would not fit int32):
the matrix product's `qlinear_matmul_packed`; a 2-D convolution of one group with int8
`wp` on a target with a dot product the dot form `qlinear_conv_dot`; one of several
groups `qlinear_conv_grouped`; any other `qlinear_conv_packed`. `pack_product(plan)` is
the packed call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.kernels.int8 import dot
from kiln.kernels.int8.conv_tile import choose_tile
from kiln.kernels.int8.matmul import TILE_COLS
from kiln.ops import quant_words as qw
from kiln.ops.quant_conv_words import CONV_DOT
from kiln.ops.quant_dynamic import DYNAMIC, PACKED, quantized_type
from kiln.ops.quant_packed import CONV, GROUPED, INTEGER, MATMUL
from kiln.ops.quant_words import panelize, weight_panels, weight_words
from kiln.ops.registry import call as op_call
from kiln.target.isa import ISA


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


@dataclass(frozen=True)
class ProductPlan:
    """How a `qlinear_conv` / `qlinear_matmul` is packed (`plan`): the packed `op`, the
    call's attributes less those the packing consumes, the shifted weight `wp` (its
    element type chosen), the corrected bias, the dot form's planning ISA (None: no dot
    form) and whether the products saturate (`int8-pairs=saturate`)."""

    call: g.Call
    op: str
    attrs: dict[str, Any]
    wp: np.ndarray
    bias: np.ndarray
    dot_isa: ISA | None
    saturate: bool


def plan(call: g.Call, isa: ISA) -> ProductPlan | None:
    """The packing of a `qlinear_conv` / `qlinear_matmul` for `isa`, or None when
    `applies(call)` is false or the corrected bias would not fit the int32 accumulator."""
    if not applies(call) or call.op == "matmul_integer":
        return None
    w, bias, x_zp, w_zp = call.args[1:5]
    assert isinstance(w, g.Constant) and isinstance(bias, g.Constant)
    assert isinstance(x_zp, g.Constant) and isinstance(w_zp, g.Constant)
    attrs = dict(call.attrs)
    # int8 activations onnxruntime runs as uint8 (kiln.ops.quant_ort): its AVX2 kernels
    # then take them as uint8, and their pairs saturate as uint8 ones do
    as_uint8 = bool(attrs.pop("as_uint8", False))
    zw = np.asarray(w_zp.data, np.int64)
    if call.op == "qlinear_matmul":
        wp = shifted_b(w.data, w_zp.data, bool(attrs.pop("transpose_b", False)))
        sums = wp.astype(np.int64).sum(axis=0)
    else:
        # 8-bit weights minus an 8-bit zero point fit int16: a quarter of int64's
        # memory traffic over every weight
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
    sat = (dot.target_saturates(isa) and np.asarray(w.data).dtype == np.int8
           and (np.asarray(x_zp.data).dtype == np.uint8 or as_uint8) and not zw.any()
           and (call.op == "qlinear_matmul" or two_d_conv or (two_d_grouped and not depthwise)))
    dot_isa = dot.target_isa(isa, sat) if (call.op == "qlinear_matmul" or two_d_conv) \
        and weight_dtype == np.int8 else None
    if dot_isa is not None and two_d_conv and dot_isa.int8_dot == "dsp" and not sat:
        # microcontrollers (Cortex-M): the run-time im2col words would cost RAM and flash
        # the element form does not spend; it reads the input in place
        dot_isa = None
    # the dot form multiplies unsigned bytes: an int8 x is shifted by 128 (quant_words)
    shift = qw.a_shift(str(np.asarray(x_zp.data).dtype)) if dot_isa else 0
    bias_eff = np.asarray(bias.data, np.int64) - (int(x_zp.data) + shift) * sums
    if np.abs(bias_eff).max(initial=0) >= 2 ** 31:
        return None  # the corrected bias would not fit the int32 accumulator
    op = (MATMUL if call.op == "qlinear_matmul" else CONV_DOT if dot_isa is not None
          else GROUPED if two_d_grouped else CONV)
    return ProductPlan(call, op, attrs, wp.astype(weight_dtype), bias_eff.astype(np.int32),
                       dot_isa, sat)


def pack_product(p: ProductPlan) -> g.Call:
    """The packed call of plan `p`."""
    x, w, _, x_zp, _, multiplier, y_zp = p.call.args
    assert isinstance(w, g.Constant)
    attrs, dot_isa, wp = p.attrs, p.dot_isa, p.wp
    packed = g.Constant(np.ascontiguousarray(wp), w.name)
    corrected = g.Constant(p.bias)
    pairs = {"pairs": qw.SATURATE} if p.saturate and dot_isa is not None else {}
    if p.op == MATMUL:
        panels = g.Constant(_panels(np.asarray(packed.data), dot_isa), w.name)
        group = {"k_group": dot.k_group(dot_isa)} if dot_isa else {}
        return op_call(MATMUL, x, panels, corrected, multiplier, y_zp, n=wp.shape[1],
                       **group, **pairs, **attrs)
    if p.op == CONV_DOT:
        assert dot_isa is not None
        by_tap = bool(pairs) or _whole_word_taps(wp, dot_isa)
        words = _conv_words(wp.astype(np.int8), p.call, dot_isa, by_tap)
        k_group = dot.k_group(dot_isa)
        return op_call(CONV_DOT, x, g.Constant(words, w.name), corrected, x_zp, multiplier,
                       y_zp, w_shape=tuple(wp.shape), **pairs, **attrs,
                       **({"k_group": k_group} if k_group != qw.GROUP else {}),
                       **({"tap_major": True} if by_tap and not pairs else {}))
    if p.op == GROUPED:
        return op_call(GROUPED, x, packed, corrected, x_zp, multiplier, y_zp,
                       **({"pairs": qw.SATURATE} if p.saturate else {}), **attrs)
    return op_call(CONV, x, packed, corrected, x_zp, multiplier, y_zp, **attrs)


def _whole_word_taps(wp: np.ndarray, isa: ISA) -> bool:
    """Whether a convolution with exact dot products takes k = (tap, channel): input
    channels a multiple of a word's 4 and more than one tap, so that every im2col word is
    4 channels of one tap, copied whole from the input's words (or read in place)."""
    return (dot.k_group(isa) == qw.GROUP and isa.int8_dot in dot.EXACT_FAMILIES
            and wp.ndim == 4 and wp.shape[1] % qw.GROUP == 0
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
            return weight_panels(wp, tile.cols, tap_major, dot.k_group(isa))
    return weight_words(wp, tap_major, dot.k_group(isa))


def shifted_b(b: np.ndarray, b_zp: np.ndarray, transpose: bool) -> np.ndarray:
    """B as `[K][N]` minus its zero point (scalar or per column), int8 or int16."""
    data = np.asarray(b, np.int64)
    if transpose:
        data = data.T
    zb = np.asarray(b_zp, np.int64)
    wp = data - zb.reshape(1, -1) if zb.ndim else data - zb
    return wp.astype(np.int8 if wp.min() >= -128 and wp.max() <= 127 else np.int16)


def pack_matmul_integer(call: g.Call, isa: ISA) -> g.Call:
    """A `matmul_integer` (`applies`) as `matmul_integer_packed` for `isa`."""
    # (a - a_zp) @ (b - b_zp) = a @ bp - a_zp * colsum(bp): a_zp is known at run time
    # only (DynamicQuantizeLinear computes it), so the kernel multiplies it in.
    a, b, a_zp, b_zp = call.args
    assert isinstance(b, g.Constant) and isinstance(b_zp, g.Constant)
    wp = shifted_b(b.data, b_zp.data, bool(call.attrs.get("transpose_b")))
    colsum = wp.astype(np.int64).sum(axis=0).astype(np.int32)
    sat = (dot.target_saturates(isa) and np.asarray(b.data).dtype == np.int8
           and isinstance(a.type, TensorType) and a.type.dtype == "uint8"
           and not np.asarray(b_zp.data).any())
    dot_isa = dot.target_isa(isa, sat) if wp.dtype == np.int8 else None
    group = {"k_group": dot.k_group(dot_isa)} if dot_isa else {}
    pairs = {"pairs": qw.SATURATE} if sat and dot_isa is not None else {}
    return op_call(INTEGER, a, g.Constant(_panels(wp, dot_isa), b.name), g.Constant(colsum),
                   a_zp, n=wp.shape[1], **group, **pairs)


def _panels(b: np.ndarray, isa: ISA | None) -> np.ndarray:
    """B's panels: of int8/int16 elements, or of the dot form's words (`isa` given)."""
    if isa is None:
        return panelize(b, TILE_COLS)
    return panelize(qw.words(b, dot.k_group(isa)), dot.tile_cols(isa))


def dynamic_applies(call: g.Call) -> bool:
    """Whether `call` is a `dynamic_quant_matmul` whose B and zero point are constants
    (packed as `matmul_integer_packed` packs them)."""
    if call.op != DYNAMIC:
        return False
    _, b, b_zp, _, _ = call.args
    return isinstance(b, g.Constant) and b.data.ndim == 2 and isinstance(b_zp, g.Constant)


def pack_dynamic(call: g.Call, isa: ISA) -> g.Call:
    """A `dynamic_quant_matmul` (`dynamic_applies`) as `dynamic_quant_matmul_packed` for
    `isa` (B packed as `matmul_integer_packed` packs it)."""
    a, b, b_zp, b_scale, bias = call.args
    at = a.type
    assert isinstance(at, TensorType)
    a_q = g.Var("a_q", quantized_type(at))
    integer = pack_matmul_integer(op_call("matmul_integer", a_q, b, g.Var(
        "a_zp", TensorType((), "uint8")), b_zp), isa)
    return op_call(PACKED, a, integer.args[1], integer.args[2], b_scale, bias,
                   **integer.attrs)
