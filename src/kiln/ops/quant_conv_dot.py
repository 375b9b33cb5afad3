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
    DeclBuffer,
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
from kiln.ops.kernels.tiles import nest
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import channel, check_requant, conv_int_shape, out_range, requantize_value
from kiln.ops.registry import OPS, HandBuiltOp

Attrs = Mapping[str, Any]
CONV_DOT = "qlinear_conv_dot"
#: Column tiles that keep the threads busy; with fewer, row tiles (channels) run in parallel.
PARALLEL_TILES = 8


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


def _padded_input(x: Buffer, x_zp: Buffer, begins: Sequence[int], ends: Sequence[int]
                  ) -> tuple[Buffer, Stmt]:
    """`x` padded with its zero point (a scratch copy: the im2col reads need no bounds
    tests), or `x` itself when the convolution is not padded. The copy fills the whole
    scratch with `x_zp`, then copies the rows: both contiguous, so both vectorize."""
    if not any(begins) and not any(ends):
        return x, seq()
    shape = (*(int(d) for d in x.shape[:2]),
             *(int(d) + b + e for d, b, e in zip(x.shape[2:], begins, ends)))
    xp = Buffer("x_padded", shape, x.dtype, "global")
    flat = Buffer("x_padded_flat", (int(np.prod(shape)),), x.dtype)
    fill = tile_loop("i", int(np.prod(shape)), lambda i: Store(flat, x_zp[()], (i,)))

    def copy(*i: PrimExpr) -> Stmt:
        n, c, rest = i[0], i[1], i[2:]
        return Store(xp, x[(n, c, *rest)], (n, c, *(r + b for r, b in zip(rest, begins))))

    rows = nest(("n", "c", *(f"i{j}" for j in range(len(shape) - 2))),
                [int(d) for d in x.shape], copy)
    return xp, seq(Allocate(xp), DeclBuffer(flat, xp, 0), fill, rows)


def _tiles(x: Buffer, ww: Buffer, bias: Buffer, x_zp: Buffer, multiplier: Buffer,
           y_zp: Buffer, out: Buffer, attrs: Attrs, isa: Any) -> Stmt:
    ws = _w_shape(attrs)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, ws, attrs, CONV_DOT)
    batch, oc_n, spatial = int(out.shape[0]), ws[0], tuple(int(d) for d in out.shape[2:])
    positions = int(np.prod(spatial))
    taps, k_total, groups = int(np.prod(ws[2:])), int(np.prod(ws[1:])), int(ww.shape[1])
    nr = quant_dot.tile_cols_for(isa, positions)
    col_tiles = -(-positions // nr)
    mr = min(quant_dot.tile_rows(isa, nr), oc_n)
    row_tiles = -(-oc_n // mr)
    words = Buffer("x_words", (batch, groups, col_tiles * nr), "int32", "global")
    lo, hi = out_range(attrs, y_zp.dtype)
    big = batch * positions * oc_n * k_total >= 1 << 18
    # the padding past the input's end that the last output position reads
    ends = [max(0, (spatial[j] - 1) * strides[j] + (ws[2 + j] - 1) * dilations[j]
                - begins[j] + 1 - int(x.shape[2 + j])) for j in range(rank)]
    xp, pad = _padded_input(x, x_zp, begins, ends)

    def word(n: PrimExpr, g: PrimExpr, o: Sequence[PrimExpr]) -> PrimExpr:
        # the im2col word of group g at output position o: 4 k = (c, tap), 0 past K
        total: PrimExpr = as_expr(0, "int32")
        for i in range(quant_dot.GROUP):
            k = g * quant_dot.GROUP + i
            c, kk = k // taps, te.unflatten_index(k % taps, ws[2:])
            pos = [o[j] * strides[j] + kk[j] * dilations[j] for j in range(rank)]
            byte = quant_dot.a_byte(xp[(n, min_(c, ws[1] - 1), *pos)])
            if k_total % quant_dot.GROUP:
                byte = Select(compare("lt", k, k_total), byte, as_expr(0, "int32"))
            if i == quant_dot.GROUP - 1:
                byte = Select(compare("ge", byte, 128), byte - 256, byte)
            total = total + byte * (1 << (8 * i))
        return total

    names = tuple(f"o{j}" for j in range(rank))

    def pack_group(n: PrimExpr, g: PrimExpr) -> Stmt:
        rows = nest(names, spatial, lambda *o: Store(
            words, word(n, g, o), (n, g, te.flat_index(o, spatial))))
        if positions == col_tiles * nr:
            return rows
        tail = tile_loop("p", col_tiles * nr - positions, lambda p: Store(
            words, as_expr(0, "int32"), (n, g, p)), start=positions)
        return seq(rows, tail)

    pack = tile_loop("n", batch, lambda n: tile_loop(
        "g", groups, lambda g: pack_group(n, g),
        "parallel" if big and groups > 1 else "serial"))
    flat_out = Buffer("out_flat", (batch, oc_n, positions), out.dtype)

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
            mult = multiplier[()] if multiplier.ndim == 0 else multiplier[row(r)]
            value = requantize_value(acc[r, v] + bias[row(r)], mult, y_zp[()], lo, hi,
                                     y_zp.dtype)
            return Store(flat_out, value, (n, rt * mr + r, ct * nr + v))

        def store_row(r: PrimExpr) -> Stmt:
            # whole column tiles store unguarded (a loop LLVM vectorizes); the last,
            # partial one stores its positions only
            full = tile_loop("v", nr, lambda v: store(r, v))
            rest = positions - (col_tiles - 1) * nr
            if rest == nr:
                stores = full
            else:
                stores = IfThenElse(compare("lt", ct, col_tiles - 1), full,
                                    tile_loop("v", rest, lambda v: store(r, v)))
            if oc_n % mr == 0:
                return stores
            return IfThenElse(compare("lt", rt * mr + r, oc_n), stores)

        return seq(Allocate(acc), zero, step, tile_loop("r", mr, store_row))

    if col_tiles >= PARALLEL_TILES or row_tiles < col_tiles:
        # column tiles in parallel: each thread reads the input words of its positions
        nest_ = tile_loop("n", batch, lambda n: tile_loop("ct", col_tiles, lambda ct: tile_loop(
            "rt", row_tiles, lambda rt: tile(n, ct, rt)),
            "parallel" if big and col_tiles > 1 else "serial"))
    else:
        # few output positions (7 x 7: one column tile): output channels in parallel
        nest_ = tile_loop("n", batch, lambda n: tile_loop("rt", row_tiles, lambda rt: tile_loop(
            "ct", col_tiles, lambda ct: tile(n, ct, rt)), "parallel" if big else "serial"))
    return seq(pad, Allocate(words), pack, DeclBuffer(flat_out, out, 0), nest_)


OPS.register(CONV_DOT, _TiledConv(CONV_DOT, "anchor", _infer, _build, _reference))
