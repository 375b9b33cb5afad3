"""The kernel of `qlinear_conv_grouped` (kiln.ops.quant_packed): depthwise and grouped
2-D int8 convolutions on vector tiles.

The packer (kiln.kernels.int8.packing) gives a `qlinear_conv` with constant weights and
more than one group this form on every target (it needs no dot-product instruction). The operands
are those of `qlinear_conv_packed`: the weight shifted by its zero point (`wp`, int8 or
int16, OIHW), the bias with the zero-point correction `- x_zp * sum(wp)` folded in, the
input's zero point, the requantization multiplier (per tensor or per output channel)
and the output zero point.

The kernel (kiln.kernels.conv.window's depthwise layout, in int32): the input is copied
once into a workspace bordered with `x_zp` (so the correction term holds at the
borders too) and, for a strided convolution, split into column phases, so every tap
reads consecutive addresses. A tile is up to two vectors of consecutive output columns
of one row of one output channel; it starts from the bias and adds
`int32(x) * int32(wp)` for every input channel of the group and tap (the weight a
broadcast scalar), then the row is requantized (per-channel multiplier, round half to
even, the ReLU/Clip range) and stored as bytes.

A depthwise convolution of stride 1 or 2 whose channel fits a stack plane
(`PLANE_BYTES`) runs on whole *planes* instead (`plane_body`; rows narrower than two
vectors would leave the row tiles' lanes idle, and wider ones run faster so too): each
input channel is copied into a stack plane bordered with `x_zp`, its rows `wq` (the
padded width) wide, so output `(oh, ow)` at flat position `oh * wq + ow` reads tap
`(kh, kw)` at that position plus `kh * wq + kw` (dilated). Every tap is then one run of whole
vectors over all output rows at once (the `wq - out_w` columns between rows are computed
and not stored), so the tiles fill their vectors.

A depthwise convolution of stride 2 runs on planes too, split into stride phases: the
rows are copied whole into a row phase each (padded row `r` is row `r // 2` of phase
`r % 2`), then one long loop deinterleaves the plane's bytes into column phases (`wq`
rounded up to even, so a column phase's rows are `wq / 2` wide). Output `(oh, ow)` at
flat position `oh * wq/2 + ow` reads tap `(kh, kw)` in column phase `kw % 2` at that
position plus the start of row phase `kh % 2` plus `(kh // 2) * wq/2 + kw // 2`
(`PlaneGeometry.tap`, dilated taps likewise). Either way the planes of a block of
channels (`plane_block`) are all filled before the first is read, and where one channel's
outputs fit a single tile of few vectors (7x7; 14x14 at stride 2) a tile computes several
channels side by side (`plane_pair`): one accumulator per vector and tap chain is too
few to hide the multiply-add latency. The planes requantize with
`requantize_value(magic_round=True)` (the clamped value rounded by a float addition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.graph import Call
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels import conv as ck
from kiln.kernels.int8.per_sample import PerSample
from kiln.kernels.tiles import const, lanes_loop, nest, tile_lanes, tile_registers
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import quant_words as qw
from kiln.ops import te
from kiln.ops.nn import conv_geometry
from kiln.ops.quant import out_range, requantize_value
from kiln.ops.quant_packed import GROUPED, conv_infer
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]


def conv_shape(x_shape: Sequence[Any], w_shape: Sequence[Any], attrs: Attrs) -> ck.ConvShape | None:
    """The geometry of a static 2-D convolution, None for any other."""
    if len(x_shape) != 4 or not all(isinstance(d, int) for d in (*x_shape, *w_shape)):
        return None
    _, strides, dilations, begins, ends = conv_geometry(tuple(x_shape), tuple(w_shape), attrs,
                                                        GROUPED)
    return ck.ConvShape(x_shape[0], x_shape[1], x_shape[2], x_shape[3], w_shape[0],
                        w_shape[2], w_shape[3], (strides[0], strides[1]),
                        (dilations[0], dilations[1]), (begins[0], begins[1], ends[0], ends[1]),
                        int(attrs.get("group", 1)))


def grouped_body(shape: ck.ConvShape, x: Buffer, wp: Buffer, bias: Buffer, x_zp: Buffer,
                 multiplier: Buffer, y_zp: Buffer, out: Buffer, attrs: Attrs,
                 lanes: int) -> Stmt:
    """The loop nest of the module docstring (NCHW input and output, OIHW weight)."""
    sh, sw = shape.stride
    dh, dw = shape.dilation
    cig, cog = shape.ci_group, shape.co_group
    saturate = qw.saturates(attrs)
    lo, hi = out_range(attrs, y_zp.dtype)
    tile_w = ck.rows_tile_width(shape.out_w, lanes)
    # a row narrower than a vector spans whole vectors of 8: the extra lanes read the
    # widened border of the padded copy and are not stored (for a narrow row only: a
    # partial last tile of a wider row runs slower so)
    lanes_of = {shape.out_w: _vector_width(shape.out_w, lanes)} if shape.out_w < lanes else {}
    cols = max(lanes_of.values(), default=0) + (shape.kw - 1) * dw // sw
    xp, prologue = ck.padded_input(x, shape, phases=sw, border=x_zp[()], cols=cols)

    def tile(n: PrimExpr, oc: PrimExpr, oh: PrimExpr, ow0: PrimExpr, stored: int) -> Stmt:
        width = lanes_of.get(stored, stored)
        acc = Buffer("acc", (width,), "int32", "local")
        start = lanes_loop("r", width, lambda r: Store(acc, bias[oc], (r,)))
        first = oc if cig == 1 and cog == 1 else (oc // cog) * cig

        def step(ci: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
            wv = Var("w", "int32")
            row = oh * sh + kh * dh
            # column (ow0 + r) * sw + kw * dw lies in phase (kw * dw) % sw at
            # ow0 + r + (kw * dw) // sw: consecutive in r whatever the stride
            tap = kw * dw
            phase, shift = (tap % sw, tap // sw) if sw > 1 else (const(0), tap)
            return seq(LetStmt(wv, Cast("int32", wp[oc, ci, kh, kw])), lanes_loop(
                "r", width, lambda r: Store(acc, acc[r] + Cast("int32", xp(
                    n, first + ci, row, phase, ow0 + r + shift)) * wv, (r,))))

        def pair(taps: Sequence[tuple[int, int, int]]) -> Stmt:
            # `int8-pairs=saturate`: two products summed and clamped to int16 first
            # (onnxruntime's im2col + u8 x s8 GEMM: k in the order (tap, channel))
            tap_cols = [(ci, oh * sh + kh * dh, const((kw * dw) % sw), (kw * dw) // sw)
                        for ci, kh, kw in taps]
            weights = [Cast("int32", wp[oc, ci, kh, kw]) for ci, kh, kw in taps]

            def product(r: PrimExpr) -> PrimExpr:
                terms = [Cast("int32", xp(n, first + ci, row, phase, ow0 + r + shift)) * w
                         for (ci, row, phase, shift), w in zip(tap_cols, weights, strict=True)]
                return qw.clamp16(terms[0] + terms[1] if len(terms) > 1 else terms[0])

            return lanes_loop("r", width, lambda r: Store(acc, acc[r] + product(r), (r,)))

        if saturate:
            order = [(ci, kh, kw) for kh in range(shape.kh) for kw in range(shape.kw)
                     for ci in range(cig)]
            reduction = seq(*(pair(order[i:i + 2]) for i in range(0, len(order), 2)))
        else:
            reduction = nest(("ci", "kh", "kw"), (cig, shape.kh, shape.kw), step)
        mult = multiplier[()] if multiplier.ndim == 0 else multiplier[oc]
        # the accumulators go through a stack row, so they are only read as whole vectors
        staged = Buffer("row", (width,), "int32", "local")
        parts = [Allocate(acc), start, reduction, Allocate(staged),
                 lanes_loop("j", width, lambda j: Store(staged, acc[j], (j,)))]
        if stored == width:
            return seq(*parts, lanes_loop("j", width, lambda j: Store(
                out, requantize_value(staged[j], mult, y_zp[()], lo, hi, y_zp.dtype),
                (n, oc, oh, ow0 + j))))
        # requantized as whole vectors, then the stored columns copied
        result = Buffer("result", (width,), y_zp.dtype, "local")
        return seq(*parts, Allocate(result), lanes_loop("j", width, lambda j: Store(
            result, requantize_value(staged[j], mult, y_zp[()], lo, hi, y_zp.dtype), (j,))),
            tile_loop("j", stored, lambda j: Store(out, result[j], (n, oc, oh, ow0 + j))))

    def row(n: PrimExpr, oc: PrimExpr, oh: PrimExpr) -> Stmt:
        return ck.tiled_row(shape.out_w, tile_w, lanes,
                            lambda ow0, width: tile(n, oc, oh, ow0, width))

    return seq(*prologue, nest(("n", "oc", "oh"), (shape.n, shape.c_out, shape.out_h), row))


def _vector_width(columns: int, lanes: int) -> int:
    """Lanes a tile of `columns` computes: a multiple of 8 on vector targets (a partial
    vector of another width would be split into scalars), `columns` elsewhere."""
    return -(-columns // 8) * 8 if lanes >= 8 else columns


#: Accumulator vectors of a plane tile (registers: these, an input vector, the weight).
PLANE_VECTORS = 8
#: Whether the plane kernel requantizes with `requantize_value(magic_round=True)`.
MAGIC_ROUND = True
#: The largest stack plane (bytes of input) the plane kernel copies a channel into.
PLANE_BYTES = 1 << 14


@dataclass(frozen=True)
class PlaneGeometry:
    """The plane kernel's layout for one convolution (see the module docstring).

    `wq`: a padded row's width in the byte plane (a multiple of the column stride);
    `pitch`: a row's width in a column phase (`wq / stride_w`), also the row pitch of the
    flat output positions; `rows`: the rows of one row phase; `chunks`, `vectors`: the
    tiles over the output positions and the vectors of a tile."""

    stride: tuple[int, int]
    dilation: tuple[int, int]
    wq: int
    pitch: int
    rows: int
    chunks: int
    vectors: int

    @property
    def phase_size(self) -> int:
        """Elements of one column phase (all its row phases)."""
        return self.stride[0] * self.rows * self.pitch

    def tap(self, kh: int, kw: int) -> tuple[int, int]:
        """`(column phase, offset)`: where tap `(kh, kw)` of output position `p` (flat,
        `oh * pitch + ow`) reads: element `offset + p` of that column phase."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        row, col = kh * dh, kw * dw
        return col % sw, (row % sh) * self.rows * self.pitch + row // sh * self.pitch + col // sw


def plane_geometry(shape: ck.ConvShape, lanes: int) -> PlaneGeometry | None:
    """The plane kernel's layout for `shape`; None where the kernel does not apply:
    grouped, strides above 2, fewer than 8 int32 lanes, or a channel's plane larger than
    PLANE_BYTES (the planes beat the row tiles wherever they fit, strided or not)."""
    sh, sw = shape.stride
    if shape.ci_group != 1 or max(sh, sw) > 2 or lanes < 8:
        return None
    top, left, bottom, right = shape.pads
    wq = -(-(shape.w + left + right) // sw) * sw
    pitch = wq // sw
    tiles = -(-shape.out_h * pitch // lanes)
    chunks = -(-tiles // PLANE_VECTORS)
    vectors = -(-tiles // chunks)
    # a row phase holds its padded rows and what the last tile of any tap reads past them
    reach = (shape.kh - 1) * shape.dilation[0] // sh * pitch \
        + (shape.kw - 1) * shape.dilation[1] // sw + chunks * vectors * lanes
    rows = max(-(-(shape.h + top + bottom) // sh), -(-reach // pitch))
    geometry = PlaneGeometry(shape.stride, shape.dilation, wq, pitch, rows, chunks, vectors)
    if geometry.phase_size * sw > PLANE_BYTES:  # bytes: the plane (and its phases)
        return None
    return geometry


def plane_body(shape: ck.ConvShape, x: Buffer, wp: Buffer, bias: Buffer, x_zp: Buffer,
               multiplier: Buffer, y_zp: Buffer, out: Buffer, attrs: Attrs,
               lanes: int, registers: int = 16) -> Stmt:
    """The plane kernel of the module docstring (depthwise, with a channel multiplier;
    `registers`: the target's vector registers, which bound the channels per tile)."""
    g = plane_geometry(shape, lanes)
    assert g is not None
    sh, sw = shape.stride
    top, left = shape.pads[:2]
    width = g.vectors * lanes
    size = g.phase_size * sw
    lo, hi = out_range(attrs, y_zp.dtype)

    block = plane_block(shape.c_in, size)
    pair = plane_pair(g, block, registers)
    flat_out = Buffer("out_flat", (out.numel(),), out.dtype)

    def channels(n: PrimExpr, cb: PrimExpr) -> Stmt:
        # `block` channels' planes are filled before any is read: a tap's vector load
        # right after the narrow row stores that wrote its bytes cannot take them from the
        # store buffer and stalls
        plane = Buffer("plane", (block * size,), x.dtype, "local")
        fill = lanes_loop("i", block * size, lambda i: Store(plane, x_zp[()], (i,)))

        def row(i: PrimExpr) -> PrimExpr:
            # padded row r is row r // sh of row phase r % sh (whole rows, so contiguous)
            r = i + top
            return (r % sh) * g.rows + r // sh if sh > 1 else r

        copy = nest(("b", "i"), (block, shape.h), lambda b, i: lanes_loop(
            "q", shape.w, lambda q: Store(plane, x[n, cb * block + b, i, q],
                                          (b * size + row(i) * g.wq + left + q,))))
        prepare: list[Stmt] = [Allocate(plane), fill, copy]
        phases = plane
        if sw > 1:
            # the column phases ([phase][channel][element]): element k of phase p is byte
            # sw * k + p of the planes, one long deinterleaving loop (LLVM's loop
            # vectorizer turns it into wide loads and byte shuffles; short per-row loops
            # stayed scalar)
            phases = Buffer("phases", (block * size,), x.dtype, "local")
            count = block * g.phase_size
            prepare += [Allocate(phases), lanes_loop("k", count, lambda k: seq(*(
                Store(phases, plane[k * sw + p], (p * count + k,)) for p in range(sw))))]

        def output(b0: PrimExpr, j: int) -> Stmt:
            # `pair` channels' tiles side by side: their accumulator chains interleave
            cs = [cb * block + b0 * pair + i for i in range(pair)]
            ocs = [c * shape.co_group + j if shape.co_group > 1 else c for c in cs]
            results = [Buffer("result", (g.chunks * width,), y_zp.dtype, "local")
                       for _ in cs]

            def chunk(t: PrimExpr) -> Stmt:
                # one tile: `vectors` vectors of output positions, every tap a shifted run
                accs = [Buffer("acc", (width,), "int32", "local") for _ in cs]

                def tap(kh: int, kw: int, i: int) -> Stmt:
                    # channel i's tap (kh, kw): a shifted run of its plane
                    acc, wv = accs[i], Var("w", "int32")
                    phase, offset = g.tap(kh, kw)
                    at = t * width + (b0 * pair + i + phase * block) * g.phase_size + offset
                    return seq(LetStmt(wv, Cast("int32", wp[ocs[i], 0, kh, kw])), lanes_loop(
                        "r", width, lambda r: Store(
                            acc, acc[r] + Cast("int32", phases[at + r]) * wv, (r,))))

                def start(acc: Buffer, oc: PrimExpr) -> Stmt:
                    return seq(Allocate(acc), lanes_loop("r", width, lambda r: Store(
                        acc, bias[oc], (r,))))

                def finish(acc: Buffer, oc: PrimExpr, result: Buffer) -> Stmt:
                    mult = multiplier[()] if multiplier.ndim == 0 else multiplier[oc]
                    return lanes_loop("r", width, lambda r: Store(
                        result, requantize_value(acc[r], mult, y_zp[()], lo, hi, y_zp.dtype,
                                                 bounds_first=True, magic_round=MAGIC_ROUND),
                        (t * width + r,)))

                steps = [tap(kh, kw, i) for kh in range(shape.kh) for kw in range(shape.kw)
                         for i in range(pair)]
                return seq(*(start(a, oc) for a, oc in zip(accs, ocs)), *steps,
                           *(finish(a, oc, r) for a, oc, r in zip(accs, ocs, results)))

            return seq(*(Allocate(r) for r in results), tile_loop("t", g.chunks, chunk),
                       *(plane_stores(shape, g, r, flat_out,
                                      (n * shape.c_out + oc) * (shape.out_h * shape.out_w))
                         for r, oc in zip(results, ocs)))

        compute = tile_loop("b", block // pair, lambda b: seq(
            *(output(b, j) for j in range(shape.co_group))))
        return seq(*prepare, compute)

    return seq(DeclBuffer(flat_out, out, 0),
               nest(("n", "cb"), (shape.n, shape.c_in // block), channels))


def plane_stores(shape: ck.ConvShape, g: PlaneGeometry, result: Buffer, out: Buffer,
                 base: PrimExpr) -> Stmt:
    """Store one output channel's rows from its plane results (`result[oh * pitch + ow]`)
    into the flat output at `base`; the columns between rows are not stored.

    Every row but the last is stored as whole vectors of 8 bytes (`out_w` rounded up):
    the bytes past the row land on the next row's first columns, which that row's store
    then overwrites, so they never reach another channel (a row of 7 is one 8-byte store,
    not 4 + 2 + 1). The last row is
    stored exactly, and so is every row where the rounded rows would read past
    `result`."""
    w = shape.out_w
    wide = -(-w // 8) * 8

    def row(oh: PrimExpr, width: int) -> Stmt:
        return lanes_loop("ow", width, lambda ow: Store(out, result[oh * g.pitch + ow],
                                                        (base + oh * w + ow,)))

    last = shape.out_h - 1
    if last == 0 or (last - 1) * g.pitch + wide > result.numel():
        return tile_loop("oh", shape.out_h, lambda oh: row(oh, w))
    return seq(tile_loop("oh", last, lambda oh: row(oh, wide)), row(const(last), w))


def plane_pair(g: PlaneGeometry, block: int, registers: int) -> int:
    """Channels one plane tile computes side by side: where a channel's tile is a single
    chunk (7x7 rows, 14x14 at stride 2), the most channels of the block whose
    accumulators fill at most half the vector registers, so their chains (one dependent
    multiply-add per tap) overlap; one else."""
    if g.chunks != 1:
        return 1
    return max(p for p in range(1, block + 1)
               if block % p == 0 and (p == 1 or p * g.vectors <= registers // 2))


#: The most channels whose planes the plane kernel fills before reading them.
PLANE_BLOCK = 8


def plane_block(channels: int, size: int) -> int:
    """How many channels' planes (of `size` bytes) to fill at once: the largest divisor of
    `channels` up to PLANE_BLOCK whose planes fit PLANE_BYTES."""
    return max(b for b in range(1, PLANE_BLOCK + 1)
               if channels % b == 0 and (b == 1 or b * size <= PLANE_BYTES))


@dataclass(frozen=True)
class GroupedConv:
    """The vector-tile kernel for a static 2-D convolution (the te definition else)."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """Whether the kernel applies to `call`: the tiles take it whole."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The tiled kernel of the convolution alone (None under a fused tail)."""
        if result is not None or len(args) != len(params):
            return None
        shape = conv_shape(params[0].shape, params[1].shape, attrs)
        if shape is None or min(shape.pads) < 0:
            return None
        x, wp, bias, x_zp, multiplier, y_zp = (Buffer(t.name, t.shape, t.dtype)
                                               for t in params)
        out_type = conv_infer([TensorType(t.shape, t.dtype) for t in params], attrs)
        assert isinstance(out_type, TensorType)
        out = Buffer("out", out_type.shape, y_zp.dtype)
        lanes = tile_lanes(isa, "int32")
        operands = (shape, x, wp, bias, x_zp, multiplier, y_zp, out, attrs, lanes)
        # the planes add one product at a time: saturating pairs take the row tiles
        body = grouped_body(*operands) if plane_geometry(shape, lanes) is None \
            or qw.saturates(attrs) else plane_body(*operands, registers=tile_registers(isa))
        return PrimFunc((x, wp, bias, x_zp, multiplier, y_zp, out), body,
                        {ATTR_GEMM_KERNEL: GROUPED})


#: The lowering of `qlinear_conv_grouped` (kiln.kernels.lowering); over a symbolic
#: batch, chunk by chunk (kiln.kernels.int8.per_sample).
GROUPED_CONV = PerSample(GroupedConv())
