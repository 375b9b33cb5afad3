"""`qlinear_conv_dot`: a 2-D int8 convolution on the dot-product form
(kiln.ops.quant_words; its kernel: kiln.kernels.int8.conv_dot).

The quantize-ops pass gives a `qlinear_conv` with int8 weights and one group this form
on targets with a dot-product family. The weight `[OC][C][KH][KW]` (shifted by its zero
point) is flattened to `[OC][K]`, K = C KH KW, and packed in words of 4 k at compile
time: `w_words [OC][ceil(K / 4)]` int32 (`weight_words`), attribute `w_shape`; or, for
the kernel's channels-as-lanes tile, in panels of its channels, `w_words
[ceil(OC / nr)][ceil(K / 4)][nr]` (`weight_panels`). The input is read with the zero
point where the convolution is padded, shifted to unsigned bytes like A of the packed
matrix products (`a_byte`), and the sum is requantized (bias with the zero-point
correction, per-channel multiplier, range).

Without VNNI the words hold 2 k as int16 halves (attribute `k_group=2`: `[OC][ceil(K /
2)]`). With `int8-pairs=saturate` or `tap_major` k runs (tap, c) (`tap_major_k`), else
(c, tap).

Between such convolutions the activations may be kept as words of 4 channels
(WORDS_LAYOUT, `NCHW4c`: attributes `in_layout` / `out_layout`, chosen by
kiln.transform.quant_layout): `reads_words` and `writes_words` say which convolutions
may read and write them.

A residual `qlinear_add` whose operand is the convolution's output may be fused into it
(kiln.transform.quant_residual): the op then takes the add's other operand and scalars
after its own, `(x, w_words, bias, x_zp, multiplier, y_zp, residual, a_scale, a_zp,
b_scale, b_zp, y_scale, y_zp_add)`, attribute `residual_operand` (0: the convolution's
output is the add's `a`, 1: its `b`) and `residual_as_uint8` (the add's `as_uint8`), and
computes the convolution's requantized value, then the add (kiln.ops.quant_elementwise)
of it and the residual element, which has the output's shape and layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.ops.layout import block_shape, blocked_layout, from_blocked, reorder, to_blocked
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import channel, check_requant, conv_int_shape, out_range, requantize_value
from kiln.ops.quant_elementwise import ADD, add_tensors, qlinear_add_ref
from kiln.ops.quant_packed import conv_packed_ref
from kiln.ops.quant_words import unpacked_weight
from kiln.ops.registry import get_op, register_op

Attrs = Mapping[str, Any]
CONV_DOT = "qlinear_conv_dot"
#: The activation layout of int8 convolution chains (kiln.transform.quant_layout): NCHW
#: with 4 channels to a word, `[N][C / 4][H][W][4]` bytes, the unit the dot form's input
#: word holds (k = (tap, c)): read in place, no byte gather from 4 channel planes.
WORDS_LAYOUT = blocked_layout(qw.GROUP)
#: Operands of the convolution itself; a fused residual add's follow (`residual_args`).
CONV_ARGS = 6
#: The attributes of a fused residual add (the module docstring).
RESIDUAL_ATTRS = ("residual_operand", "residual_as_uint8")


def fused_residual(attrs: Attrs) -> bool:
    """Whether a `qlinear_conv_dot` with `attrs` carries a fused residual add."""
    return "residual_operand" in attrs


def add_operands(conv: Any, rest: Sequence[Any], attrs: Attrs) -> list[Any]:
    """The operands of the fused `qlinear_add` (a, a_scale, a_zp, b, b_scale, b_zp,
    y_scale, y_zp): `conv` the convolution's output, `rest` the op's operands after its
    own (residual, a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)."""
    residual, a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = rest
    a, b = (conv, residual) if int(attrs["residual_operand"]) == 0 else (residual, conv)
    return [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp]


def add_attrs(attrs: Attrs) -> dict[str, Any]:
    """The fused `qlinear_add`'s attributes."""
    return {"as_uint8": True} if attrs.get("residual_as_uint8") else {}


def tap_major_k(attrs: Attrs) -> bool:
    """Whether a dot-form convolution's k runs (tap, channel): with `int8-pairs=saturate`
    (onnxruntime's order, which its saturation depends on), or `tap_major` (exact
    products, where the order changes no result)."""
    return qw.saturates(attrs) or bool(attrs.get("tap_major", False))


def w_shape(attrs: Attrs) -> tuple[int, ...]:
    """The unpacked weight's shape `[OC][C][taps...]` (attribute `w_shape`)."""
    return tuple(int(d) for d in attrs["w_shape"])


def layouts(attrs: Attrs) -> tuple[bool, bool]:
    """Whether a dot-form convolution's input and output are in WORDS_LAYOUT (attributes
    `in_layout`, `out_layout`: "NCHW", the default, or WORDS_LAYOUT)."""
    flags = []
    for key in ("in_layout", "out_layout"):
        value = str(attrs.get(key, "NCHW"))
        if value not in ("NCHW", WORDS_LAYOUT):
            raise IRError(f"{CONV_DOT}: {key} must be 'NCHW' or {WORDS_LAYOUT!r}, got {value!r}")
        flags.append(value == WORDS_LAYOUT)
    return flags[0], flags[1]


def reads_words(attrs: Attrs, x: TensorType) -> bool:
    """Whether a dot-form convolution with `attrs` on NCHW input `x` (a 2-D one) can read
    its input as words of 4 channels: 4 k to a word (not the int16 pairs), every word
    4 channels of one tap (k = (tap, c), or a single tap), unsigned or signed bytes."""
    ws = w_shape(attrs)
    return (len(ws) == 4 and ws[1] % qw.GROUP == 0 and x.ndim == 4
            and qw.word_group(attrs) == qw.GROUP
            and (tap_major_k(attrs) or int(np.prod(ws[2:])) == 1)
            and x.dtype in ("uint8", "int8"))


def writes_words(attrs: Attrs, out: TensorType) -> bool:
    """Whether a dot-form convolution with `attrs` and NCHW output `out` can write it as
    words of 4 channels: a 2-D one, output channels a multiple of 4, bytes."""
    return out.ndim == 4 and int(w_shape(attrs)[0]) % qw.GROUP == 0 \
        and out.dtype in ("uint8", "int8")


def _nchw_input(x: TensorType, in_words: bool) -> TensorType:
    """The NCHW type of input `x` (WORDS_LAYOUT with `in_words`; checked)."""
    if not in_words:
        return x
    if x.ndim != 5 or x.shape[4] != qw.GROUP or not isinstance(x.shape[1], int):
        raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} input is 5-D [N][C / 4][H][W][4] with "
                      f"static channels, got {x.shape}")
    return TensorType((x.shape[0], x.shape[1] * qw.GROUP, *x.shape[2:4]), x.dtype)


def conv_dot_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """The type rule of `qlinear_conv_dot` (its operands checked)."""
    if fused_residual(attrs) != (len(types) == CONV_ARGS + 7):
        raise IRError(f"{CONV_DOT}: takes {CONV_ARGS} operands, {CONV_ARGS + 7} with a fused "
                      f"residual add (attribute residual_operand), got {len(types)}")
    out = _conv_type(types[:CONV_ARGS], attrs)
    if fused_residual(attrs):
        if int(attrs["residual_operand"]) not in (0, 1) or types[CONV_ARGS] != out:
            raise IRError(f"{CONV_DOT}: a fused residual add takes residual_operand 0 or 1 "
                          f"and a residual of the output's type {out}, got "
                          f"{attrs['residual_operand']!r} and {types[CONV_ARGS]}")
        get_op(ADD).infer(add_operands(out, types[CONV_ARGS:], attrs), add_attrs(attrs))
    return out


def _conv_type(types: Sequence[TensorType], attrs: Attrs) -> TensorType:
    """The output type of the convolution itself (its operands checked)."""
    x, ww, bias, x_zp, multiplier, y_zp = types
    ws = w_shape(attrs)
    groups = -(-int(np.prod(ws[1:])) // qw.word_group(attrs))
    # words [OC][groups], or panels [ceil(OC / nr)][groups][nr] of the channels tile
    shape = tuple(ww.shape)
    words = shape == (ws[0], groups) or (
        len(shape) == 3 and shape[1] == groups and isinstance(shape[2], int) and shape[2] > 0
        and shape[0] == -(-ws[0] // shape[2]))
    if ww.dtype != "int32" or not words or int(attrs.get("group", 1)) != 1:
        raise IRError(f"{CONV_DOT}: expects one group and int32 weight words "
                      f"({ws[0]}, {groups}) or panels (ceil({ws[0]} / nr), {groups}, nr) for "
                      f"w_shape {ws}, got {ww.dtype}{shape}")
    in_words, out_words = layouts(attrs)
    x = _nchw_input(x, in_words)
    if in_words and not reads_words(attrs, x):
        raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} input needs words of 4 channels of one "
                      f"tap (a 2-D convolution, k_group 4, tap_major or 1x1), got w_shape {ws}")
    shape = conv_int_shape(CONV_DOT, [x, TensorType(ws, "int8"), x_zp,
                                       TensorType((), "int8")], attrs)
    check_requant(CONV_DOT, ws[0], bias, multiplier, y_zp, attrs)
    out = TensorType(shape, y_zp.dtype)
    if out_words:
        if not writes_words(attrs, out):
            raise IRError(f"{CONV_DOT}: a {WORDS_LAYOUT} output needs a 2-D convolution with "
                          f"a multiple of 4 output channels, got {shape}")
        return TensorType(block_shape(shape, qw.GROUP), y_zp.dtype)
    return out


def _build(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression definition (used where the tiled kernel is not)."""
    y = _build_conv(inputs[:CONV_ARGS], attrs)
    if not fused_residual(attrs):
        return y
    return add_tensors(add_operands(y, inputs[CONV_ARGS:], attrs), add_attrs(attrs))


def _build_conv(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The convolution's own tensor-expression definition."""
    x, ww, bias, x_zp, multiplier, y_zp = inputs
    in_words, out_words = layouts(attrs)
    if in_words:  # read through an NCHW view of the words
        x = reorder([x], {"src": WORDS_LAYOUT, "dst": "NCHW",
                          "channels": int(x.shape[1]) * qw.GROUP})
    ws = w_shape(attrs)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, ws, attrs, CONV_DOT)
    lo, hi = out_range(attrs, y_zp.dtype)
    taps = int(np.prod(ws[2:]))
    out_shape = conv_int_shape(CONV_DOT, [TensorType(x.shape, x.dtype), TensorType(ws, "int8"),
                                           TensorType((), x.dtype), TensorType((), "int8")],
                                attrs)

    saturate = qw.saturates(attrs)
    by_tap = tap_major_k(attrs)
    k_total = int(np.prod(ws[1:]))
    group = qw.word_group(attrs)

    def value(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] - begins[j] for j in range(rank))
            flat = (te.flat_index(k, ws[2:]) * ws[1] + c if by_tap
                    else c * taps + te.flat_index(k, ws[2:]))
            g = flat // group
            word = ww[oc, g] if ww.ndim == 2 else ww[oc // ww.shape[2], g, oc % ww.shape[2]]
            return qw.a_byte(te.padded(x, (n, c, *pos), x_zp[()])) * qw.b_byte(
                word, flat, group)

        if saturate:  # k = (tap, c); the products of k = 2p and 2p + 1 clamped to int16
            acc = qw.saturated_sum(lambda k: term(
                k % ws[1], *te.unflatten_index(k // ws[1], ws[2:])), k_total) + bias[oc]
        else:
            acc = te.reduce("sum", term, tuple(ws[1:]), "int32") + bias[oc]
        return requantize_value(acc, channel(multiplier, oc), y_zp[()], lo, hi, y_zp.dtype)

    y = te.compute(out_shape, value, y_zp.dtype, CONV_DOT)
    return reorder([y], {"src": "NCHW", "dst": WORDS_LAYOUT}) if out_words else y


def _reference(x: np.ndarray, ww: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
               multiplier: np.ndarray, y_zp: np.ndarray, *rest: np.ndarray, **attrs: Any
               ) -> np.ndarray:
    y = _conv_reference(x, ww, bias, x_zp, multiplier, y_zp, **attrs)
    if not fused_residual(attrs):
        return y
    return qlinear_add_ref(*add_operands(y, rest, attrs), **add_attrs(attrs))


def _conv_reference(x: np.ndarray, ww: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
                    multiplier: np.ndarray, y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    w = unpacked_weight(ww, w_shape(attrs), tap_major_k(attrs), qw.word_group(attrs))
    in_words, out_words = layouts(attrs)
    if in_words:
        x = from_blocked(x, x.shape[1] * qw.GROUP)
    shift = qw.a_shift(str(x.dtype))
    rest = {a: v for a, v in attrs.items()
            if a not in ("w_shape", "k_group", "in_layout", "out_layout", *RESIDUAL_ATTRS)}
    y = conv_packed_ref(x.astype(np.int64) + shift, w, bias,
                        np.asarray(int(x_zp) + shift), multiplier, y_zp, **rest)
    return to_blocked(y, qw.GROUP) if out_words else y


register_op(CONV_DOT, pattern="anchor", infer=conv_dot_infer, compute=_build,
            reference=_reference)
