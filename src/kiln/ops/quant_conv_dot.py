"""`qlinear_conv_dot`: a 2-D int8 convolution on the dot-product form (quant_dot).

`quant_kernels.pack` gives a `qlinear_conv` with int8 weights and one group this form
on targets with a dot-product family. The weight `[OC][C][KH][KW]` (shifted by its zero
point) is flattened to `[OC][K]`, K = C KH KW, and packed in words of 4 k at compile
time: `w_words [OC][ceil(K / 4)]` int32, attribute `w_shape`. At run time the input is
packed into words of the same k for every output position (`[N][ceil(K / 4)][P]`, P the
output positions padded to whole column tiles): the input rows of an im2col, 4 k to a
word, read with the zero point where the convolution is padded (shifted to unsigned bytes
like A in quant_dot). The register tile is rows of output channels (a broadcast weight
word each) x `nr` output positions (vectors of input words), one `dot4_u8s8` per
accumulator and word; stores are contiguous along the output row, requantized in the
epilogue (bias with the zero-point correction, per-channel multiplier, range).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import (
    DOT4_U8S8,
    Allocate,
    Buffer,
    IfThenElse,
    Intrin,
    PrimExpr,
    PrimFunc,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.ir.types import TensorType, Type
from kiln.ops import quant_dot, te
from kiln.ops.kernels.tiles import loop as tile_loop
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import channel, check_requant, conv_int_shape, out_range, requantize_value
from kiln.ops.registry import OPS, HandBuiltOp

Attrs = Mapping[str, Any]
CONV_DOT = "qlinear_conv_dot"


def weight_words(wp: np.ndarray) -> np.ndarray:
    """The shifted int8 weight `[OC][C][...]` as words `[OC][ceil(K / 4)]`."""
    flat = np.asarray(wp).reshape(wp.shape[0], -1)
    return np.ascontiguousarray(quant_dot.words(flat.T).T)


def _w_shape(attrs: Attrs) -> tuple[int, ...]:
    return tuple(int(d) for d in attrs["w_shape"])


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, ww, bias, x_zp, multiplier, y_zp = types
    ws = _w_shape(attrs)
    k = int(np.prod(ws[1:]))
    if ww.dtype != "int32" or tuple(ww.shape) != (ws[0], -(-k // quant_dot.GROUP)) \
            or int(attrs.get("group", 1)) != 1:
        raise IRError(f"{CONV_DOT}: expects one group and int32 weight words "
                      f"({ws[0]}, {-(-k // quant_dot.GROUP)}) for w_shape {ws}, got "
                      f"{ww.dtype}{tuple(ww.shape)}")
    shape = conv_int_shape(CONV_DOT, [x, TensorType(ws, "int8"), x_zp,
                                       TensorType((), "int8")], attrs)
    check_requant(CONV_DOT, ws[0], bias, multiplier, y_zp, attrs)
    return TensorType(shape, y_zp.dtype)


def _build(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The tensor-expression definition (used where the tiled kernel is not)."""
    x, ww, bias, x_zp, multiplier, y_zp = inputs
    ws = _w_shape(attrs)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, ws, attrs, CONV_DOT)
    lo, hi = out_range(attrs, y_zp.dtype)
    taps = int(np.prod(ws[2:]))
    out_shape = conv_int_shape(CONV_DOT, [TensorType(x.shape, x.dtype), TensorType(ws, "int8"),
                                           TensorType((), x.dtype), TensorType((), "int8")],
                                attrs)

    def value(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] - begins[j] for j in range(rank))
            flat = c * taps + te.flat_index(k, ws[2:])
            return quant_dot.a_byte(te.padded(x, (n, c, *pos), x_zp[()])) * quant_dot.b_byte(
                ww[oc, flat // quant_dot.GROUP], flat)

        acc = te.reduce("sum", term, tuple(ws[1:]), "int32") + bias[oc]
        return requantize_value(acc, channel(multiplier, oc), y_zp[()], lo, hi, y_zp.dtype)

    return te.compute(out_shape, value, y_zp.dtype, CONV_DOT)


def _reference(x: np.ndarray, ww: np.ndarray, bias: np.ndarray, x_zp: np.ndarray,
               multiplier: np.ndarray, y_zp: np.ndarray, **attrs: Any) -> np.ndarray:
    from kiln.ops.quant_kernels import conv_packed_ref

    ws = _w_shape(attrs)
    k = int(np.prod(ws[1:]))
    w = quant_dot.unwords(np.asarray(ww).T, k).T.reshape(ws)
    shift = quant_dot.a_shift(str(x.dtype))
    rest = {a: v for a, v in attrs.items() if a != "w_shape"}
    return conv_packed_ref(x.astype(np.int64) + shift, w, bias,
                            np.asarray(int(x_zp) + shift), multiplier, y_zp, **rest)


@dataclass(frozen=True)
class _TiledConv(HandBuiltOp):
    """The register-tiled kernel for static shapes on a target with a dot product."""

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str) -> PrimFunc | None:
        isa = quant_dot.target_isa()
        if result is not None or len(args) != len(params) or isa is None:
            return None
        x, ww, bias, x_zp, multiplier, y_zp = (Buffer(t.name, t.shape, t.dtype) for t in params)
        out_type = _infer([TensorType(t.shape, t.dtype) for t in params], attrs)
        assert isinstance(out_type, TensorType)
        out = Buffer("out", out_type.shape, y_zp.dtype)
        return PrimFunc((x, ww, bias, x_zp, multiplier, y_zp, out),
                        _tiles(x, ww, bias, x_zp, multiplier, y_zp, out, attrs, isa),
                        {"kiln.gemm_kernel": CONV_DOT})


def _tiles(x: Buffer, ww: Buffer, bias: Buffer, x_zp: Buffer, multiplier: Buffer,
           y_zp: Buffer, out: Buffer, attrs: Attrs, isa: Any) -> Stmt:
    ws = _w_shape(attrs)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, ws, attrs, CONV_DOT)
    batch, oc_n, spatial = int(out.shape[0]), ws[0], tuple(int(d) for d in out.shape[2:])
    positions = int(np.prod(spatial))
    taps, k_total, groups = int(np.prod(ws[2:])), int(np.prod(ws[1:])), int(ww.shape[1])
    nr = min(quant_dot.tile_cols(isa), positions)
    col_tiles = -(-positions // nr)
    mr = min(quant_dot.tile_rows(isa, nr), oc_n)
    row_tiles = -(-oc_n // mr)
    words = Buffer("x_words", (batch, groups, col_tiles * nr), "int32", "global")
    lo, hi = out_range(attrs, y_zp.dtype)
    big = batch * positions * oc_n * k_total >= 1 << 18

    def x_byte(n: PrimExpr, k: PrimExpr, p: PrimExpr) -> PrimExpr:
        # input element of im2col row k (c, taps) at output position p, x_zp outside
        c, tap = k // taps, k % taps
        o = te.unflatten_index(p, spatial)
        kk = te.unflatten_index(tap, ws[2:])
        pos = [o[j] * strides[j] + kk[j] * dilations[j] - begins[j] for j in range(rank)]
        inside: PrimExpr = compare("lt", k, k_total) & compare("lt", p, positions)
        for j in range(rank):
            inside = inside & compare("ge", pos[j], 0) & compare("lt", pos[j], x.shape[2 + j])
        safe = [min_(pos[j] * Select(compare("ge", pos[j], 0), as_expr(1), as_expr(0)),
                     x.shape[2 + j] - 1) for j in range(rank)]
        value = Select(inside, x[(n, min_(c, ws[1] - 1), *safe)], x_zp[()])
        byte = quant_dot.a_byte(value)
        return Select(compare("lt", k, k_total), byte, as_expr(0, "int32"))

    def word(n: PrimExpr, g: PrimExpr, p: PrimExpr) -> PrimExpr:
        total: PrimExpr = as_expr(0, "int32")
        for i in range(quant_dot.GROUP):
            byte = x_byte(n, g * quant_dot.GROUP + i, p)
            if i == quant_dot.GROUP - 1:
                byte = Select(compare("ge", byte, 128), byte - 256, byte)
            total = total + byte * (1 << (8 * i))
        return total

    pack = tile_loop("n", batch, lambda n: tile_loop("g", groups, lambda g: tile_loop(
        "p", col_tiles * nr, lambda p: Store(words, word(n, g, p), (n, g, p))),
        "parallel" if big and groups > 1 else "serial"))

    def tile(n: Var, ct: Var, rt: Var) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")

        def row(r: PrimExpr) -> PrimExpr:
            return rt * mr + r if oc_n % mr == 0 else min_(rt * mr + r, oc_n - 1)

        zero = tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, as_expr(0, "int32"), (r, v)), "vectorized"))
        step = tile_loop("g", groups, lambda g: tile_loop("r", mr, lambda r: tile_loop(
            "v", nr, lambda v: Store(acc, Intrin(DOT4_U8S8, (
                acc[r, v], words[n, g, ct * nr + v], ww[row(r), g])), (r, v)),
            "vectorized"), "unrolled"))

        def store(r: PrimExpr, v: PrimExpr) -> Stmt:
            oc, p = rt * mr + r, ct * nr + v
            mult = multiplier[()] if multiplier.ndim == 0 else multiplier[row(r)]
            value = requantize_value(acc[r, v] + bias[row(r)], mult, y_zp[()], lo, hi,
                                     y_zp.dtype)
            inside = compare("lt", oc, oc_n) & compare("lt", p, positions)
            return IfThenElse(inside, Store(out, value, (n, oc, *te.unflatten_index(p, spatial))))

        stores = tile_loop("r", mr, lambda r: tile_loop("v", nr, lambda v: store(r, v)))
        return seq(Allocate(acc), zero, step, stores)

    kind = "parallel" if big and col_tiles > 1 else "serial"
    nest = tile_loop("n", batch, lambda n: tile_loop("ct", col_tiles, lambda ct: tile_loop(
        "rt", row_tiles, lambda rt: tile(n, ct, rt)), kind))
    return seq(Allocate(words), pack, nest)


OPS.register(CONV_DOT, _TiledConv(CONV_DOT, "anchor", _infer, _build, _reference))
