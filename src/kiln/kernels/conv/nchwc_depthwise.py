"""The kernel of `conv2d_nchwc_depthwise` (kiln.ops.conv_nchwc_depthwise): a depthwise
convolution on NCHW{b}c activations, one vector = the `b` channels of one position.

A tile is `tile_w` consecutive output positions of one output row of one channel
block: `tile_w` vector accumulators (started at the bias), and for each window tap one
weight vector (contiguous in the packed weight) multiplied with the tile's input
vectors (contiguous in the blocked input, whatever the stride). Nothing is copied: a
window row outside the image is skipped by a test per (row, kh), and the columns whose
window leaves the image (at most `pad / stride` on each side) are one-position tiles
that leave the missing taps out, so the tiles between them run without tests. The
tiles of a row (rows of all blocks and images) form one parallel loop.

Where the output is read only as a bfloat16 convolution's words (`bf16_words` ends the
group, kiln.transform.bf16_words: MobileNetV2's depthwise layers before their
projections), a tile sums both blocks of a pair and rounds lane `v` of the two into one
int32 word (`bf16_pair`), after the epilogue in float32, as the consumer's own
conversion would: the float32 tensor and that pass are gone, and the layer writes half
the bytes. Words of half blocks (`half_words`: the readers of an odd count of blocks,
MobileNetV2's 144 channels) take one block a tile and round its lanes `v` and `v + b / 2`
into one word.

Where the input is its producer's words (`words_input`: kiln.transform.bf16_depthwise_words,
the large images' expansions), a tile storing words of pairs sums block `2p` from the
low halves of the pair's words (shifted up) and block `2p + 1` from the high halves
(masked): the producer writes, and the layer reads, half the bytes. Words of half
blocks in (`half_words` too: an odd count of blocks, MobileNetV2's 144 channels at 56x56)
are read as `b` bfloat16 values of one position in their memory order (channel `v`,
then `v + b/2`: one `vpmovzxwd` and a shift a vector), which the packed weight and bias
follow (kiln.ops.conv_nchwc_depthwise `halves_order`); such a layer stores words of half
blocks, which in that order are its `b` sums rounded to bfloat16 side by side (one
conversion, no shuffle). Its epilogue must not depend on the channel (a ReLU6).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir.analysis.tensor_queries import read_buffers
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_CONV_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    Const,
    DeclBuffer,
    IfThenElse,
    Load,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    reinterpret,
    select,
    seq,
)
from kiln.ir.types import TensorType
from kiln.ir.visitor import iter_exprs
from kiln.kernels.conv.bf16_words import words_output, zero_border
from kiln.kernels.conv.run_time_width import TilesKey
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.parallel_work import min_parallel_work
from kiln.kernels.tiles import Epilogue, lanes_loop, madd, parallel_tiles, parallel_when
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.ops import layout, te
from kiln.ops.conv_bf16 import HALF_WORDS, WORDS_INPUT, WordsSource
from kiln.ops.conv_geometry import ConvShape, conv_shape
from kiln.ops.conv_nchwc_depthwise import input_shape
from kiln.ops.packed_attrs import recorded_tile
from kiln.target.isa import ISA

#: Output positions per tile the rule prefers: 8 accumulators leave AVX2's 16 registers
#: room for the weight and an input vector, and keep the unrolled taps (kh x kw x 8
#: vector FMAs) small enough for LLVM.
TILE_POSITIONS = 8


def choose_tile_width(shape: ConvShape, isa: ISA) -> int:
    """Positions per tile: `TILE_POSITIONS` (fewer when the registers hold fewer), no
    wider than the columns whose window lies inside the image."""
    registers = isa.vector_registers or 16
    lo, hi = inner_columns(shape)
    return max(1, min(TILE_POSITIONS, registers - 3, hi - lo))


def inner_columns(shape: ConvShape) -> tuple[int, int]:
    """The output columns `[lo, hi)` whose whole window row lies inside the image."""
    sw, dw, left = shape.stride[1], shape.dilation[1], shape.pads[1]
    lo = min(shape.out_w, -(-left // sw))
    last = (shape.w - 1 + left - (shape.kw - 1) * dw) // sw  # the last such column
    return lo, max(lo, min(shape.out_w, last + 1))


def conv_geometry(x_shape: Sequence[Any], attrs: Mapping[str, Any], kernel: tuple[int, int]
                  ) -> ConvShape:
    """The NCHW geometry of a call on the blocked input shape `x_shape`."""
    c = int(attrs["channels"])
    return conv_shape((x_shape[0], c, x_shape[2], x_shape[3]), c, kernel, attrs)


#: The dimension scalars of a kernel over run-time sizes (`run_time_key`): its input's
#: channel blocks, height and width (axes 1, 2 and 3).
BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME = "kiln_dw_blocks", "kiln_dw_h", "kiln_dw_w"
_OP = "conv2d_nchwc_depthwise"


def run_time_key(x_shape: Sequence[Any], w_shape: Sequence[Any], x_dtype: str,
                 attrs: Mapping[str, Any], isa: ISA) -> tuple[Any, ...] | None:
    """What the kernel of a call on the blocked input `x_shape` and packed weight `w_shape`
    over run-time channel blocks, height and width is built from besides them, or None
    (a kernel of its own). Taken by undilated float32 layers (a `precision=bf16`
    target's words excluded) of whole blocks, at least one tile wide between the border
    columns (the columns whose window leaves the image). The key holds the tile,
    whether the tiles run in parallel (the call's own work; at run time for a symbolic
    batch) and the border columns (`border_columns`), which given the window, stride
    and pads (the call's attributes, keyed with it) depend only on the width's
    remainder modulo the stride: EfficientNet-B0's and MobileNetV2's depthwise layers
    of one window and stride share a kernel from 112x112 down to 14x14. The taps, the
    sums and their order are the static kernel's, so the outputs are the same bit for
    bit."""
    if isa.precision == "bf16" or x_dtype != "float32" or attrs.get(WORDS_INPUT) \
            or attrs.get(HALF_WORDS) or len(x_shape) != 5 \
            or not all(isinstance(d, int) for d in (*x_shape[1:], *w_shape)):
        return None
    block = int(x_shape[4])
    shape = conv_geometry(x_shape, attrs, (int(w_shape[1]), int(w_shape[2])))
    tile = recorded_tile(attrs, 1, _OP)
    tile_w = tile[0] if tile else choose_tile_width(shape, isa)
    lo, hi = inner_columns(shape)
    if tuple(shape.dilation) != (1, 1) or shape.c_in % block or hi - lo < tile_w:
        return None
    work = _work(shape)
    parallel = work >= min_parallel_work("madd", isa) if isinstance(work, int) else None
    return "depthwise image", block, tile_w, parallel, border_columns(shape)


def border_columns(shape: ConvShape) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """The count of left border columns and the taps of each right border column (the
    output columns whose window leaves the image) of a static `shape`."""
    lo, hi = inner_columns(shape)
    return lo, tuple(tuple(column_taps(shape, ow)) for ow in range(hi, shape.out_w))


def column_taps(shape: ConvShape, ow: int) -> list[int]:
    """The kw whose input column lies inside the image for output column `ow`."""
    sw, dw, left = shape.stride[1], shape.dilation[1], shape.pads[1]
    return [k for k in range(shape.kw) if 0 <= ow * sw - left + k * dw < shape.w]


def _work(shape: ConvShape) -> int:
    """The multiply-adds of a layer (`parallel_when`'s measure)."""
    return shape.n * shape.c_in * shape.out_h * shape.out_w * shape.kh * shape.kw


def _run_time_sizes(shape: ConvShape, block: int, x: Buffer, w: Buffer,
                    others: Sequence[Buffer | None]) -> tuple[ConvShape, dict[Buffer, Buffer]]:
    """The geometry over the run-time sizes and the buffers `x`, `w` and `others` (the
    bias or None, the output) over them: the input `[N][blocks][H][W][b]`, the weight
    `[blocks][kh][kw][b]`, the bias `[blocks * b]`, the output `[N][blocks][OH][OW][b]`
    (OH and OW expressions of H and W)."""
    blocks, h, wd = (Var(name, INDEX_DTYPE) for name in (BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME))
    channels = cast(int, blocks * block)  # ConvShape types its run-time sizes as ints
    sized = replace(shape, c_in=channels, c_out=channels, groups=channels, h=cast(int, h),
                    w=cast(int, wd))
    n = x.shape[0]
    dims = ((n, blocks, h, wd, block), (blocks, *w.shape[1:]), (blocks * block,),
            (n, blocks, sized.out_h, sized.out_w, block))
    return sized, {b: Buffer(b.name, d, b.dtype, b.scope)
                   for b, d in zip((x, w, *others), dims, strict=True) if b is not None}


def build(params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
          anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
    """The kernel for `isa` of a `conv2d_nchwc_depthwise` call with its fused elementwise
    tail (the arguments of kiln.kernels.lowering.Lowering.lower_fused); None when the
    tail needs statements."""
    x, wp = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    blocked = input_shape(x, attrs)
    block = int(blocked[-1])
    words_in, halves = bool(attrs.get(WORDS_INPUT)), bool(attrs.get(HALF_WORDS))
    shape = conv_geometry(blocked, attrs, (int(wp.shape[1]), int(wp.shape[2])))
    out_shape = layout.block_shape((shape.n, shape.c_out, shape.out_h, shape.out_w), block)
    output = words_output(params, anchor, result, out_shape)
    # The consumers' words (kiln.transform.bf16_words) pair the channel blocks, or the
    # halves of each block (`half`: any count of them).
    if output is None or (output.source is not None and int(out_shape[1]) % 2
                          and not output.source.half):
        return None
    if words_in and (output.source is None or output.source.half != halves):
        return None  # words of pairs in: the tiles sum both blocks of a pair (words out)
    store, out, words = output.store, output.out, output.source
    if halves and (shape.c_in % block or not _lane_free(store.epilogue, len(out_shape))):
        return None  # the lanes are in the words' order, not the channels'
    tile = recorded_tile(attrs, 1, _OP)
    tile_w = tile[0] if tile else choose_tile_width(shape, isa)
    xb, wb = store.buffers[x], store.buffers[wp]
    bb = None if bias is None else store.buffers[bias]
    buffers = [store.buffers[t] for t in params]
    fattrs: dict[str, Any] = {ATTR_CONV_KERNEL: _OP}
    # over run-time sizes where kiln.transform.fuse_ops keys the call so (`width_key`):
    # the group reads nothing but the convolution's operands, the epilogue none of them
    key = run_time_key(x.shape, wp.shape, x.dtype, attrs, isa) if words is None and all(
        any(t is a for a in args) for t in params) else None
    if key is not None:
        shape2, wide = _run_time_sizes(shape, block, xb, wb, (bb, out))
        work = _work(shape)  # a symbolic batch's: chosen at run time
        columns = key[-1]  # the key's border columns (`border_columns`)
        stmt = parallel_when(lambda: nest(
            shape2, block, wide[xb], wide[wb], None if bb is None else wide[bb], wide[out],
            tile_w, store.epilogue, isa.fma, columns=columns),
            work if isinstance(work, int) else _work(shape2), isa=isa)
        if not any(b in wide for b in read_buffers(stmt)):
            at = next(i for i, t in enumerate(params) if t is x)
            fattrs[ATTR_ARG_DIMS] = ((BLOCKS_NAME, at, 1), (HEIGHT_NAME, at, 2),
                                     (WIDTH_NAME, at, 3))
            return PrimFunc((*(wide.get(b, b) for b in buffers), wide[out]), stmt, fattrs)
    views: list[Stmt] = []
    if halves:  # the words as `b` bfloat16 values per position, in and out
        xb, outb = (Buffer(f"{buf.name}_halves", (*buf.shape[:-1], 2 * int(buf.shape[-1])),
                           "uint16") for buf in (xb, out))
        views = [DeclBuffer(xb, store.buffers[x], 0), DeclBuffer(outb, out, 0)]
    stmt = parallel_when(lambda: nest(
        shape, block, xb, wb, bb, outb if halves else out, tile_w,
        store.epilogue, isa.fma, words, words_in), _work(shape), isa=isa)
    border = [] if words is None else zero_border(out, words.pads)
    return PrimFunc((*buffers, out), seq(*border, *views, stmt), fattrs)


def _lane_free(epilogue: Epilogue, ndim: int) -> bool:
    """Whether `epilogue`'s value does not depend on the output index (a ReLU6: no
    per-channel operand, no load)."""
    idx = tuple(Var(f"i{k}", "int64") for k in range(ndim))
    probe = epilogue(Var("acc", "float32"), idx)
    seen = {id(i) for i in idx}
    return not any(isinstance(e, Load) or id(e) in seen for e in iter_exprs(probe))


@dataclass(frozen=True)
class NchwcDepthwise:
    """The lowering of `conv2d_nchwc_depthwise`: `build` for float32 calls of static
    channels and image sizes (the batch may be symbolic)."""

    supports_symbolic = True
    fuses_producers = False
    #: kiln.transform.fuse_ops: the run-time sizes are those of the input and weight, the
    #: attributes that only say them are not keyed, and only a group that reads nothing
    #: but the convolution's operands takes them
    width_operands = 2
    width_attrs = ("channels", "group")
    width_reads_anchor_only = True

    def builds(self, call: g.Call) -> bool:
        """Every call: `lower_fused` declines the ones `build` does not take."""
        return True

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` over run-time channel blocks, height and width
        (`run_time_key`) is built from besides them (the bias keyed by its dtype alone,
        `TilesKey`); None: a kernel of its own."""
        x, w, out = (t.type for t in (*call.args[:2], call))
        if not all(isinstance(t, TensorType) for t in (x, w, out)):
            return None
        assert isinstance(x, TensorType) and isinstance(w, TensorType)
        assert isinstance(out, TensorType)
        key = run_time_key(x.shape, w.shape, x.dtype, call.attrs, isa)
        return None if key is None else TilesKey(key, tuple(out.shape),
                                                 int(cast(int, call.attrs["channels"])))

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The hand-built kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        x_dtype = "int32" if attrs.get(WORDS_INPUT) else "float32"
        if args[0].dtype != x_dtype or any(
                t.dtype != "float32" for t in (*args, *params) if t is not args[0]) or not all(
                isinstance(d, int) for t in args for d in t.shape[1:]):
            return None
        return build(params, args, attrs, anchor, result, isa=isa)


NCHWC_DEPTHWISE = NchwcDepthwise()


@dataclass(frozen=True)
class TileSums:
    """The sums of a tile of one channel block: `x` `[N][C/b][H][W][b]`, `w`
    `[C/b][kh][kw][b]`, `bias` `[C/b * b]` or None (`nest`'s buffers)."""

    shape: ConvShape
    block: int
    x: Buffer
    w: Buffer
    bias: Buffer | None
    fused: bool
    #: `x` is the words `[N][C/2b][H * W][b]` (`words_input`), not float32 blocks.
    words: bool = False

    def load(self, n: PrimExpr, cb: PrimExpr, ih: PrimExpr, iw: PrimExpr, v: PrimExpr,
             pair: tuple[PrimExpr, bool] | None) -> PrimExpr:
        """Input lane `v` of block `cb` at `(ih, iw)`; of words, the low or high
        (`pair[1]`) half of word row `pair[0]`'s, as float32; of words of half blocks
        (`x` their bfloat16 values `[N][C/b][H * W][b]`), value `v` of block `cb`'s."""
        if self.x.dtype == "uint16":
            value = Cast("int32", self.x[n, cb, ih * self.shape.w + iw, v])
            return reinterpret(value << Const(16, "int32"), "float32")
        if pair is None:
            return self.x[n, cb, ih, iw, v]
        word = self.x[n, pair[0], ih * self.shape.w + iw, v]
        bits = word & Const(-0x10000, "int32") if pair[1] else word << Const(16, "int32")
        return reinterpret(bits, "float32")

    def __call__(self, n: PrimExpr, cb: PrimExpr, oh: PrimExpr, ow0: PrimExpr,
                 kws: list[list[int]], stage: Buffer,
                 pair: tuple[PrimExpr, bool] | None = None) -> Stmt:
        """The sums of block `cb` at output row `oh`, columns `ow0 + t` for `t` of
        `kws` (each column's taps kw), copied into `stage`; `pair` (the word row and
        which half: block `cb`'s place in the words) where the input is words."""
        shape, block, w, bias = self.shape, self.block, self.w, self.bias
        sh, sw = shape.stride
        dh, dw = shape.dilation
        top, left = shape.pads[0], shape.pads[1]
        dtype = w.dtype
        width = len(kws)
        acc = Buffer("acc", (width, block), dtype, "local")
        start = lanes_loop("v", block, lambda v: seq(*(
            Store(acc, bias[cb * block + v] if bias is not None else as_expr(0.0, dtype),
                  (_c(t), v)) for t in range(width))))

        def window_row(kh: PrimExpr) -> Stmt:
            ih = oh * sh - top + kh * dh
            steps: list[Stmt] = []
            for kw in range(shape.kw):
                ts = [t for t in range(width) if kw in kws[t]]
                if not ts:
                    continue

                def lane(v: PrimExpr, kw: int = kw, ts: list[int] = ts) -> Stmt:
                    wv = w[cb, kh, _c(kw), v]
                    return seq(*(Store(acc, madd(
                        acc[_c(t), v], self.load(n, cb, ih, (ow0 + t) * sw + (kw * dw - left),
                                                 v, pair),
                        wv, self.fused), (_c(t), v)) for t in ts))

                steps.append(lanes_loop("v", block, lane))
            body = seq(*steps)
            if not isinstance(shape.h, int) or top or \
                    (shape.out_h - 1) * sh - top + (shape.kh - 1) * dh >= shape.h:
                body = IfThenElse((ih >= 0) & (ih < shape.h), body)
            return body

        rows = _loop("kh", shape.kh, window_row) if shape.kh > 1 else window_row(_c(0))
        # The accumulators are staged (constant rows: they stay registers) and stored
        # through the epilogue by one loop: one copy of the epilogue's code per tile.
        copy = lanes_loop("v", block, lambda v: seq(*(
            Store(stage, acc[_c(t), v], (_c(t), v)) for t in range(width))))
        return seq(Allocate(acc), start, rows, Allocate(stage), copy)


def nest(shape: ConvShape, block: int, x: Buffer, w: Buffer, bias: Buffer | None,
         out: Buffer, tile_w: int, epilogue: Epilogue, fused: bool,
         words: WordsSource | None = None, words_in: bool = False,
         columns: tuple[int, tuple[tuple[int, ...], ...]] | None = None) -> Stmt:
    """The loop nest (see the module docstring): `x` `[N][C/b][H][W][b]`, `w`
    `[C/b][kh][kw][b]`, `bias` `[C/b * b]` or None, `out` `[N][C/b][OH][OW][b]`, or
    the words `words` describes (`[N][C/2b][rows][cols][b]` or `[N][C/2b][OH * OW][b]`:
    a tile then sums both blocks of a pair; of half blocks, `[N][C/b][...][b/2]`, one);
    `words_in`: `x` is words of pairs `[N][C/2b][H * W][b]` (the words out of pairs), or,
    uint16, the bfloat16 values of words of half blocks `[N][C/b][H * W][b]` in their
    memory order (`out` then the same of the words out)."""
    # over run-time sizes (`run_time_key`) `x`'s channel blocks, height and width are its
    # axes' variables, and `columns` the static call's `border_columns`
    blocks = x.shape[1] if columns is not None else -(-shape.c_in // block)
    dtype = w.dtype
    sums = TileSums(shape, block, x, w, bias, fused, words_in)

    def value(stage: Buffer, idx: tuple[PrimExpr, ...], j: PrimExpr) -> PrimExpr:
        """Output `idx` (`[n][cb][oh][ow][v]`), staged at `stage[j, v]`, through the
        epilogue."""
        cb, v = idx[1], idx[4]
        out_value = epilogue(stage[j, v], idx)
        if isinstance(shape.c_in, int) and shape.c_in % block:
            # the last block's padding channels stay zero
            out_value = select(cb * block + v < shape.c_in, out_value, as_expr(0.0, dtype))
        return out_value

    def tile(n: PrimExpr, cb: PrimExpr, oh: PrimExpr, ow0: PrimExpr,
             kws: list[list[int]]) -> Stmt:
        def word_at(row: PrimExpr, ow: PrimExpr) -> tuple[PrimExpr, ...]:
            """The index of word row `row`'s words at output `(oh, ow)` but the lane."""
            assert words is not None
            if words.flat:
                return n, row, oh * shape.out_w + ow
            return n, row, oh + words.pads[0], ow + words.pads[1]

        width = len(kws)
        stage = Buffer("stage", (width, block), dtype, "local")
        if words is None:
            def put(j: PrimExpr) -> Stmt:
                def lane(v: PrimExpr) -> Stmt:
                    idx = (n, cb, oh, ow0 + j, v)
                    return Store(out, value(stage, idx, j), idx)

                return lanes_loop("v", block, lane)

            body = sums(n, cb, oh, ow0, kws, stage)
        elif out.dtype == "uint16":  # the words' bfloat16 values: the sums' order
            def put(j: PrimExpr) -> Stmt:
                at = word_at(cb, ow0 + j)
                return lanes_loop("v", block, lambda v: Store(out, Cast("uint16", bf16_word(
                    *(value(stage, (n, cb, oh, ow0 + j, v), j),) * 2)), (*at, v)))

            body = sums(n, cb, oh, ow0, kws, stage)
        elif words.half:  # `cb` is a block: lanes `v` and `v + b / 2` into one word
            lanes = block // 2
            # the epilogue on whole vectors first (not on each half: twice the operations)
            done = Buffer("done", (width, block), dtype, "local")

            def put(j: PrimExpr) -> Stmt:
                at = word_at(cb, ow0 + j)
                return seq(
                    lanes_loop("v", block, lambda v: Store(
                        done, value(stage, (n, cb, oh, ow0 + j, v), j), (j, v))),
                    lanes_loop("v", lanes, lambda v: Store(out, bf16_word(
                        done[j, v], done[j, v + lanes]), (*at, v))))

            body = seq(sums(n, cb, oh, ow0, kws, stage), Allocate(done))
        else:  # `cb` is a pair of blocks: lane `v` of both rounded into one word
            upper = Buffer("stage", (width, block), dtype, "local")

            def put(j: PrimExpr) -> Stmt:
                ow = ow0 + j
                return lanes_loop("v", block, lambda v: Store(out, bf16_word(
                    value(stage, (n, 2 * cb, oh, ow, v), j),
                    value(upper, (n, 2 * cb + 1, oh, ow, v), j)), (*word_at(cb, ow), v)))

            low, high = ((cb, False), (cb, True)) if words_in else (None, None)
            body = seq(sums(n, 2 * cb, oh, ow0, kws, stage, low),
                       sums(n, 2 * cb + 1, oh, ow0, kws, upper, high))
        return seq(body, _loop("j", width, put) if width > 1 else put(_c(0)))

    def row(n: PrimExpr, cb: PrimExpr, oh: PrimExpr) -> Stmt:
        def at(ow0: PrimExpr, kws: list[list[int]]) -> Stmt:
            return tile(n, cb, oh, ow0, kws)

        if columns is not None:
            return _run_time_row(at, shape, tile_w, columns)
        return _static_row(at, shape, tile_w)

    rows = blocks if words is None or words.half else blocks // 2
    return parallel_tiles((shape.n, rows, shape.out_h), row)


def _static_row(tile: Callable[[PrimExpr, list[list[int]]], Stmt], shape: ConvShape,
                tile_w: int) -> Stmt:
    """The tiles of an output row (`tile(first column, each column's taps)`): the left
    border columns one a tile, the whole tiles, the rest's tile, the right border."""
    lo, hi = inner_columns(shape)
    parts: list[Stmt] = [tile(_c(ow), [column_taps(shape, ow)]) for ow in range(lo)]
    full, rest = divmod(hi - lo, tile_w)
    every = [list(range(shape.kw))]
    if full:
        parts.append(_loop("owt", full, lambda t: tile(t * tile_w + lo, every * tile_w))
                     if full > 1 else tile(_c(lo), every * tile_w))
    if rest:
        parts.append(tile(_c(lo + full * tile_w), every * rest))
    parts += [tile(_c(ow), [column_taps(shape, ow)]) for ow in range(max(hi, lo), shape.out_w)]
    return seq(*parts)


def _run_time_row(tile: Callable[[PrimExpr, list[list[int]]], Stmt], shape: ConvShape,
                  tile_w: int, columns: tuple[int, tuple[tuple[int, ...], ...]]) -> Stmt:
    """`_static_row` over run-time sizes, `columns` the static call's `border_columns`:
    the left border columns (their windows end inside the image, as the inner columns'
    do), the whole tiles; of the positions left before the right border, half a tile
    where as many remain, then one position a tile (a position's sums are the same
    whatever its tile: the outputs are the static kernel's, whose tile of the rest's
    width would be a copy of the tile's code for each width); then the right border
    columns with their taps."""
    sw, dw, left = shape.stride[1], shape.dilation[1], shape.pads[1]
    lo, right = columns
    # ConvShape types the run-time width's expressions as ints
    end = cast(PrimExpr, shape.out_w - len(right))
    every = [list(range(shape.kw))]
    full = (end - lo) // tile_w
    done = full * tile_w + lo
    half = tile_w // 2
    steps: list[Stmt] = [
        *(tile(_c(ow), [[k for k in range(shape.kw) if ow * sw - left + k * dw >= 0]])
          for ow in range(lo)),
        _loop("owt", full, lambda t: tile(t * tile_w + lo, every * tile_w))]
    if half > 1:
        fits = end - done >= half
        steps.append(IfThenElse(fits, tile(done, every * half)))
        done = done + fits.astype(INDEX_DTYPE) * half
    steps.append(_loop("owr", end - done, lambda t: tile(done + t, every)))
    return seq(*steps, *(tile(end + j if j else end, [list(taps)])
                         for j, taps in enumerate(right)))
