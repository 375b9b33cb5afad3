"""Hand-scheduled 2-D convolution kernels (float32): blocked direct and depthwise.

Both build tensor-level loop nests directly (no `te.compute`), shaped so that
LLVM keeps a register tile of accumulators and vectorizes it:

- **blocked direct convolution** (`blocked_conv_body`): the weight is packed at
  compile time into `[group][co_block][ci][kh][kw][cb]` (`pack_blocked_weight`),
  `cb` output channels side by side (a multiple of the vector width). An output
  tile is `tile_w` output positions x `cb` output channels held in a stack array
  of accumulators; for every `(ci, kh, kw)` each of the `tile_w` input values is
  broadcast and multiplied with one contiguous `cb`-wide weight row
  (onnxruntime's NCHWc convolution and TVM's `conv2d_NCHWc` work this way). The
  channel lanes are a `vectorized` loop (`lanes_loop`), emitted as vector
  instructions; the accumulators are only touched as whole vectors at constant
  rows, so they become registers.
- **depthwise convolution** (`depthwise_conv_body`): one channel per group; the
  tile is several output rows x `tile_w` columns, the `kh * kw` weights are
  scalars broadcast over it, and each input row segment it reads is loaded once
  for all the tile's rows.

Padding is applied once, outside the inner loops: the input is copied into a
zero-bordered workspace and the inner loops read it without bounds checks.
Each output value passes through `epilogue(value, (n, c, oh, ow))` as it is
stored (bias, activations, a residual add: whatever elementwise ops were fused).
The tiles of the blocked kernel form one `parallel` loop (threads split them
evenly); the depthwise kernel's loop over channels is left to the `parallelize`
pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod
from typing import cast

import numpy as np

from kiln.errors import IRError
from kiln.ir.dtype import INDEX_DTYPE, itemsize
from kiln.ir.shape_expr import simplify_dim
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    max_,
    min_,
    seq,
)
from kiln.kernels.gemm.micro_kernel import reduction_loop
from kiln.ops.kernels.flat_epilogue import FlatEpilogue
from kiln.ops.kernels.prefetch import WeightPrefetch
from kiln.ops.kernels.tiles import Epilogue, lanes_loop, madd, parallel_tiles, parallel_when
from kiln.ops.kernels.tiles import const as _c
from kiln.ops.kernels.tiles import loop as _loop
from kiln.ops.kernels.tiles import nest as _nest
from kiln.ops.spatial import conv_out
from kiln.target.isa import ISA


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution's geometry (NCHW input, OIHW weight, ONNX pads). The batch
    may be symbolic, and for the families that take one (`symbolic_image`) the image
    height and width: int64 expressions over dimension variables (kiln.ops.te.dims),
    typed as ints like those."""

    n: int
    c_in: int
    h: int
    w: int
    c_out: int
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]   # top, left, bottom, right
    groups: int = 1

    @property
    def out_h(self) -> int:
        return _out_size(self.h, self.kh, self.stride[0], self.dilation[0], self.pads[0],
                         self.pads[2])

    @property
    def out_w(self) -> int:
        return _out_size(self.w, self.kw, self.stride[1], self.dilation[1], self.pads[1],
                         self.pads[3])

    @property
    def symbolic_image(self) -> bool:
        """Whether the image height or width is symbolic (known at run time)."""
        return not (isinstance(self.h, int) and isinstance(self.w, int))

    @property
    def ci_group(self) -> int:
        return self.c_in // self.groups

    @property
    def co_group(self) -> int:
        return self.c_out // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups == self.c_in == self.c_out and self.groups > 1


def _out_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """A convolution's output length along one axis: an int, or for a symbolic `size`
    the canonical expression (the one the type rule gives its result's dimension)."""
    out = conv_out(size, k, stride, dilation, lo, hi)
    return out if isinstance(out, int) else cast(int, simplify_dim(out))


@dataclass(frozen=True)
class Tiling:
    """Register tile of the blocked kernel: `tile_w` columns x `cb` output channels."""

    cb: int
    tile_w: int


#: The positions per tile the blocked kernel's rule prefers, and the widths it may take
#: instead where that one leaves the last tile partly empty (`choose_tiling`).
TILE_POSITIONS = 6
TILE_POSITION_CHOICES = (5, 6, 7, 8)
#: The share of computed positions a rule's tile may waste (the last tile's surplus
#: slots) before a width that wastes fewer is taken instead.
MAX_POSITION_WASTE = 0.02


def choose_tiling(shape: ConvShape, lanes: int, registers: int = 16) -> Tiling:
    """`cb` = two vectors of output channels (one when the group has no more), `tile_w`
    6 positions: 12 vector accumulators, which fit AVX2's 16 registers with a weight row
    and a broadcast, and leave AVX-512/NEON's 32 room to spare.

    Where 6 leaves more than `MAX_POSITION_WASTE` of the computed positions in the last
    tile's surplus slots (a small image: 7x7 computes 54 for 49), the width of
    `TILE_POSITION_CHOICES` (whole image when it has fewer positions) that fits
    `registers` and computes the fewest positions is taken, 6 first on ties, then
    the widest: 7 on a 7x7 image at 16 lanes (ResNet's last stage, 1.1x faster on
    Zen 5, docs/performance.md), 5 at 8 lanes, where 7 does not fit."""
    cb = lanes if shape.co_group <= lanes else 2 * lanes
    vectors = cb // lanes
    positions = shape.out_h * shape.out_w

    def computed(w: int) -> int:
        return -(-positions // w) * w

    if computed(TILE_POSITIONS) - positions <= MAX_POSITION_WASTE * positions:
        return Tiling(cb=cb, tile_w=TILE_POSITIONS)
    widths = [positions] if positions < TILE_POSITIONS else list(TILE_POSITION_CHOICES)
    fits = [w for w in widths if vectors * w + vectors + 1 <= registers] or [TILE_POSITIONS]
    best = min(fits, key=lambda w: (computed(w), w != TILE_POSITIONS, -w))
    return Tiling(cb=cb, tile_w=best)


def pack_blocked_weight(w: np.ndarray, groups: int, cb: int) -> np.ndarray:
    """OIHW weight -> `[group][co_block][ci][kh][kw][cb]`, output channels padded with zeros."""
    co, ci, kh, kw = w.shape
    cog = co // groups
    blocks = -(-cog // cb)
    wg = w.reshape(groups, cog, ci, kh, kw)
    padded = np.zeros((groups, blocks * cb, ci, kh, kw), dtype=w.dtype)
    padded[:, :cog] = wg
    packed = padded.reshape(groups, blocks, cb, ci, kh, kw).transpose(0, 1, 3, 4, 5, 2)
    return np.ascontiguousarray(packed)


def unpack_blocked_weight(wp: np.ndarray, c_out: int) -> np.ndarray:
    """`pack_blocked_weight` undone: the OIHW weight with `c_out` output channels."""
    groups, blocks, ci, kh, kw, cb = wp.shape
    cog = c_out // groups
    w = wp.transpose(0, 1, 5, 2, 3, 4).reshape(groups, blocks * cb, ci, kh, kw)[:, :cog]
    return np.ascontiguousarray(w.reshape(c_out, ci, kh, kw))


# --------------------------------------------------------------------------- helpers

PhaseReader = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


def padded_input(x: Buffer, shape: ConvShape, phases: int = 1, border: PrimExpr | None = None,
                 cols: int = 0) -> tuple[PhaseReader, list[Stmt]]:
    """A reader `(n, c, row, phase, q) -> value` of the zero-padded input at padded column
    `q * phases + phase`, and the statements preparing it.

    With padding (or `phases > 1`) the input is copied once into a workspace: zeroed,
    then the image copied row by row (both loops vectorize), so the convolution loops
    read without bounds checks. `phases` splits the columns by their remainder modulo
    the stride: a stride-2 convolution then reads neighbouring outputs' inputs from
    neighbouring addresses. The border holds `border` (an integer kernel pads with its
    input's zero point), 0 by default; each phase's rows hold at least `cols` columns
    (the right border widened), for a kernel reading whole vectors past the last column."""
    if not needs_padding(shape, phases, cols):
        return unpadded_reader(x), []
    dims = padded_plane_dims(shape, phases, cols)
    xp = Buffer("xpad", (shape.n, shape.c_in, *dims), x.dtype)
    fill = plane_fill(x, shape, phases, border, cols,
                      lambda n, c, p, i, q: (n, c, _c(p), i, q), xp)
    return (lambda n, c, i, p, q: xp[n, c, p, i, q]), [
        Allocate(xp), _nest(("n", "c"), (shape.n, shape.c_in), fill)]


def unpadded_reader(x: Buffer) -> PhaseReader:
    """The `padded_input` reader of `x` itself (one phase, no border): `(n, c, row, 0,
    col) -> x[n, c, row, col]`."""
    return lambda n, c, i, p, q: x[n, c, i, q]


def needs_padding(shape: ConvShape, phases: int = 1, cols: int = 0) -> bool:
    """Whether `padded_input` copies the input (padding, phases or wide rows)."""
    if min(shape.pads) < 0:
        raise IRError(f"conv kernel: negative pads {shape.pads} are not supported")
    return any(shape.pads) or phases > 1 or cols > shape.w


def padded_plane_dims(shape: ConvShape, phases: int = 1, cols: int = 0
                      ) -> tuple[int, int, int]:
    """(phases, padded rows, columns per phase) of one channel's padded copy."""
    top, left, bottom, right = shape.pads
    hp, wp = shape.h + top + bottom, shape.w + left + right
    return phases, hp, max(-(-wp // phases), cols)


def padded_image_bytes(shape: ConvShape, item_bytes: int = 4) -> int:
    """The bytes of one image's zero-padded input (every channel, one column phase)."""
    return shape.c_in * prod(padded_plane_dims(shape)) * item_bytes


def kernel_taps(shape: ConvShape, taps: tuple[PrimExpr, PrimExpr] | None,
                step: Callable[[PrimExpr, PrimExpr], Stmt]) -> Stmt:
    """The `(kh, kw)` loop nest of a tile's sums around `step(kh, kw)`: every kernel row,
    or the `image_rows` range `taps` (first row, count)."""
    if taps is None:
        return _nest(("kh", "kw"), (shape.kh, shape.kw), step)
    kh = Var("kh", INDEX_DTYPE)
    return For(kh, taps[0], taps[1], "serial",
               _nest(("kw",), (shape.kw,), lambda kw: step(kh, kw)))


def image_rows(shape: ConvShape, first: PrimExpr, last: PrimExpr
               ) -> tuple[PrimExpr, PrimExpr] | None:
    """`(kh0, count)`: the kernel rows that read an image row (not the zero border above
    or below it) for some output row in `first .. last`; None when every one does (no
    top or bottom padding). A tile's sums then leave out the taps that only multiply
    border zeros (onnxruntime computes only in-bounds taps too): a 3x3 layer with pads
    1 skips a third of them in the first and last output rows."""
    top, bottom = shape.pads[0], shape.pads[2]
    if not top and not bottom:
        return None
    sh, dh = shape.stride[0], shape.dilation[0]
    # kernel row kh of output row oh reads padded row oh * sh + kh * dh, an image row
    # when top <= it < top + h
    lo = max_(_c(0), -((last * sh - top) // dh))
    hi = min_(_c(shape.kh), (top + shape.h - 1 - first * sh) // dh + 1)
    return lo, max_(hi - lo, _c(0))


def plane_fill(x: Buffer, shape: ConvShape, phases: int, border: PrimExpr | None, cols: int,
               at: Callable[[PrimExpr, PrimExpr, int, PrimExpr, PrimExpr],
                            tuple[PrimExpr, ...]],
               xp: Buffer) -> Callable[[PrimExpr, PrimExpr], Stmt]:
    """`fill(n, c)`: the statements writing channel `c` of image `n` zero-padded and
    split into column phases (`padded_input`) into `xp`, element `(phase, row, q)` at
    index `at(n, c, phase, row, q)`."""
    top, left = shape.pads[0], shape.pads[1]
    _, hp, wq = padded_plane_dims(shape, phases, cols)
    zero = as_expr(0.0, x.dtype) if border is None else border

    def fill(n: PrimExpr, c: PrimExpr) -> Stmt:
        # Each element written once: the border zeroed, the image copied (vectorized).
        parts: list[Stmt] = []

        def zeros(p: int, rows: tuple[int, int], cols: tuple[int, int]) -> None:
            if rows[1] > rows[0] and cols[1] > cols[0]:
                parts.append(_loop("i", rows[1] - rows[0], lambda i: _loop(
                    "q", cols[1] - cols[0], lambda q: Store(
                        xp, zero, at(n, c, p, i, q)), start=cols[0], kind="vectorized"),
                    start=rows[0]))

        for p in range(phases):
            # padded column q * phases + p holds input column q * phases + p - left
            lo = max(0, -(-(left - p) // phases))
            hi = min(wq - 1, (left + shape.w - 1 - p) // phases)
            if hi < lo:
                zeros(p, (0, hp), (0, wq))
                continue
            zeros(p, (0, top), (0, wq))
            zeros(p, (top + shape.h, hp), (0, wq))
            zeros(p, (top, top + shape.h), (0, lo))
            zeros(p, (top, top + shape.h), (hi + 1, wq))

            def copy(i: Var, p: int = p, lo: int = lo, hi: int = hi) -> Stmt:
                def put(q: PrimExpr) -> Stmt:
                    return Store(xp, x[n, c, i, q * phases + (p - left)],
                                 at(n, c, p, i + top, q))

                if phases == 1:  # a contiguous run: a lane loop, emitted as vector code
                    # (LLVM vectorizes no loop of a `kiln.no_slp` kernel itself)
                    return _loop("q", hi - lo + 1, put, start=lo, kind="vectorized")
                return _loop("q", hi - lo + 1, put, start=lo)

            parts.append(_loop("i", shape.h, copy))
        return seq(*parts)

    return fill


def padded_blocked_input(x: Buffer, shape: ConvShape, block: int
                         ) -> tuple[PhaseReader, list[Stmt]]:
    """`padded_input` for an NCHW{block}c input `x` (one phase): the reader takes the
    channel `c` and reads `[c/block][row][col][c%block]`; with padding the input is
    copied into a zero-bordered NCHW{block}c workspace (border zeroed, image copied one
    `block`-wide vector at a time)."""
    xp, prologue = padded_blocked_buffer(x, shape, block)
    return (lambda n, c, i, p, q: xp[n, c // block, i, q, c % block]), prologue


def padded_blocked_buffer(x: Buffer, shape: ConvShape, block: int
                          ) -> tuple[Buffer, list[Stmt]]:
    """The zero-padded NCHW{block}c input of `padded_blocked_input` as a buffer
    `[n][c/block][row][col][c%block]` (`x` itself without padding), and the statements
    filling it."""
    top, left, bottom, right = shape.pads
    if min(shape.pads) < 0:
        raise IRError(f"conv kernel: negative pads {shape.pads} are not supported")
    if not any(shape.pads):
        return x, []
    hp, wp = shape.h + top + bottom, shape.w + left + right
    cblocks = -(-shape.c_in // block)
    xp = Buffer("xpad", (shape.n, cblocks, hp, wp, block), x.dtype)
    zero = as_expr(0.0, x.dtype)

    def fill(n: PrimExpr, cb: PrimExpr) -> Stmt:
        def rect(rows: tuple[int, int], cols: tuple[int, int],
                 value: Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]) -> list[Stmt]:
            if rows[1] <= rows[0] or cols[1] <= cols[0]:
                return []
            return [_loop("i", rows[1] - rows[0], lambda i: _loop(
                "q", cols[1] - cols[0], lambda q: lanes_loop("v", block, lambda v: Store(
                    xp, value(i, q, v), (n, cb, i, q, v))), start=cols[0]), start=rows[0])]

        def zeros(i: PrimExpr, q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return zero

        def image(i: PrimExpr, q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return x[n, cb, i - top, q - left, v]

        return seq(*rect((0, top), (0, wp), zeros), *rect((top + shape.h, hp), (0, wp), zeros),
                   *rect((top, top + shape.h), (0, left), zeros),
                   *rect((top, top + shape.h), (left + shape.w, wp), zeros),
                   *rect((top, top + shape.h), (left, left + shape.w), image))

    return xp, [Allocate(xp), _nest(("n", "c"), (shape.n, cblocks), fill)]


def row_tiles(out_w: int, tile_w: int, lanes: int) -> list[tuple[int, int, int]]:
    """(first tile start, number of tiles, width) runs covering one output row: tiles of
    `tile_w`, then what is left as whole vectors, then the last few columns. Widths that
    are whole vectors fill the registers; any other width costs a partial register per
    accumulator row."""
    runs = []
    full = out_w // tile_w
    if full:
        runs.append((0, full, tile_w))
    start = full * tile_w
    rest = out_w - start
    if rest >= lanes and rest % lanes:
        runs.append((start, 1, rest // lanes * lanes))
        start += rest // lanes * lanes
        rest = out_w - start
    if rest:
        runs.append((start, 1, rest))
    return runs


def _store_row(acc_t: str, width: int, value: Callable[[PrimExpr], PrimExpr],
               index: Callable[[PrimExpr], tuple[PrimExpr, ...]], out: Buffer,
               epilogue: Epilogue) -> list[Stmt]:
    """Store `width` accumulators `value(j)` through the epilogue at `index(j)` (consecutive
    in the output). They are copied to a stack row first: the accumulators themselves are
    then only read as whole vectors and stay in registers, whatever the epilogue holds
    (an epilogue the backend cannot vectorize reads the row one element at a time)."""
    row = Buffer("row", (width,), acc_t, "local")
    return [Allocate(row), lanes_loop("j", width, lambda j: Store(row, value(j), (j,))),
            lanes_loop("j", width, lambda j: Store(out, epilogue(row[j], index(j)), index(j)))]


def blocked_tile_stores(out: Buffer, stage: Buffer, epilogue: Epilogue, n: PrimExpr,
                        ob: PrimExpr, rows: list[PrimExpr], cols: list[PrimExpr],
                        real: list[PrimExpr | None], block: int, channels: int,
                        blocks: int, out_blocks: int) -> list[Stmt]:
    """The stores of a tile of `len(rows)` positions x `cb` output channels (channel tile
    `ob` of `blocks`; `cb` the staged accumulators' width), staged in `stage`, into the
    NCHW{block}c `out` (`out_blocks` blocks) through `epilogue`: one contiguous vector of
    `block` channels per position and sub-block. The last block's padding lanes (past
    `channels`) hold zeros, a sub-block past the output is not stored, nor a slot whose
    `real` condition (None: always real) is false.

    The last block of a channel count no multiple of `block` is stored as two runs, its
    real lanes through `epilogue` and its padding lanes as zeros (the sub-block that may
    be the last one chooses between that and the whole block when the tile is the last
    channel tile): the epilogue never sees a padding lane, and each run is a vector loop
    of constant lanes. (One loop selecting zero for a lane past `channels`, its bias read
    at a clamped channel, had no vector form: LLVM vectorized it with SLP, which the
    convolution kernels leave off, kiln.ir.attrs.ATTR_NO_SLP, so it ran a lane at a time:
    EfficientNet-B0's and MobileNetV2's 24-channel layers.)"""
    cb = int(stage.shape[1])
    subs = cb // block
    last = out_blocks - 1            # the last block, partial when `rest`
    rest = channels - last * block if channels % block else 0
    last_sub = last - (blocks - 1) * subs  # its sub-block in the last channel tile
    zero = as_expr(0.0, stage.dtype)
    stores: list[Stmt] = []
    for r, (oh, ow) in enumerate(zip(rows, cols)):
        for sub in range(subs):
            obk = ob * subs + sub

            def lane(v: PrimExpr, r: int = r, sub: int = sub, obk: PrimExpr = obk,
                     oh: PrimExpr = oh, ow: PrimExpr = ow) -> Stmt:
                idx = (n, obk, oh, ow, v)
                return Store(out, epilogue(stage[_c(r), _c(sub * block) + v], idx), idx)

            def padding(v: PrimExpr, obk: PrimExpr = obk, oh: PrimExpr = oh,
                        ow: PrimExpr = ow) -> Stmt:
                return Store(out, zero, (n, obk, oh, ow, v + rest))

            st: Stmt = lanes_loop("v", block, lane)
            if rest and sub == last_sub:
                partial = seq(lanes_loop("v", rest, lane), lanes_loop("v", block - rest,
                                                                      padding))
                st = partial if blocks == 1 else IfThenElse(ob.eq(blocks - 1), partial, st)
            if blocks * cb > out_blocks * block:
                st = IfThenElse(obk < out_blocks, st)
            cond = real[r]
            if cond is not None:
                st = IfThenElse(cond, st)
            stores.append(st)
    return stores


# --------------------------------------------------------------------------- blocked

def blocked_conv_body(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer,
                      tiling: Tiling, epilogue: Epilogue, fused: bool = True,
                      block: int = 0, kblock: ConvKBlocking | None = None,
                      subsample: bool = False, unroll: int | None = None,
                      band: int = 0, prefetch: bool = False, *, isa: ISA) -> Stmt:
    """The loop nest of a blocked direct convolution reading packed weights `wp`
    (`pack_blocked_weight` layout) and writing `epilogue(acc, index)` into `out` (NCHW).

    With `block` > 0 (a divisor of `cb`, ungrouped) input and output are NCHW{block}c
    (kiln.ops.layout): the input is read as `x[n][ci/block][h][w][ci%block]` and each
    output position stores `cb / block` contiguous vectors at index
    `(n, oc/block, oh, ow, oc%block)`; output channels past the real ones in the last
    block are stored as zeros (their epilogue is not applied). A 4-D `x` is read as NCHW
    (NCHW in, NCHW{b}c out).

    A tile holds `tile_w` consecutive output positions of the flattened (oh, ow) plane:
    tile `t` takes `t * tile_w, ..., t * tile_w + tile_w - 1` (a run may wrap onto the
    next row). Consecutive positions read neighbouring input columns, so one tile's
    `ci * kh * kw` steps touch about a cache line per input row and channel, and the
    next tile reuses them from L1; positions spread over the plane touched a line per
    position, which left the large middle layers waiting on L2. Positions past the end
    (the last tile's last slots) read the last position and store nothing, so one tile
    shape covers every image. With top or bottom padding a tile's sums leave out the
    kernel rows that read only the zero border for all its positions (`image_rows`).

    With `kblock` (`choose_conv_k_blocking`) the sums run `kblock.kc` input channels at
    a time: a parallel task takes `kblock.band` consecutive tiles of one channel block
    and sums each channel segment over all of them before the next, the tiles' partial
    sums kept in a buffer of the task's between segments. With `subsample`, an
    unpadded strided 1x1 layer (`subsamples`) first copies the input values it reads
    into a workspace (`subsampled_input`, a quarter of the input at stride 2) and runs
    as a stride-1 layer on it: its tiles then read consecutive columns. With `unroll`
    (a tuning knob) the loop over input channels is unrolled by it
    (kiln.kernels.gemm.micro_kernel.reduction_loop: the sums in the same order). With `band`
    (unblocked sums only) the tiles run in bands of `band` consecutive tiles, each band's
    tiles for every channel block in turn (kiln.ops.kernels.conv_direct.band_tiles). With
    `prefetch` each step of the sums also prefetches the weights the next channel block
    (or segment) reads at that step (kiln.ops.kernels.prefetch)."""
    if subsample and not block and subsamples(shape):
        xs, copy = subsampled_input(x, shape, isa=isa)
        one = replace(shape, h=shape.out_h, w=shape.out_w, stride=(1, 1))
        return seq(*copy, blocked_conv_body(one, xs, wp, out, tiling, epilogue, fused, 0,
                                            kblock, unroll=unroll, prefetch=prefetch, isa=isa))
    cb, tile_w = tiling.cb, tiling.tile_w
    cig, cog = shape.ci_group, shape.co_group
    blocks = -(-cog // cb)
    ow_n = shape.out_w
    positions = shape.out_h * ow_n
    tile_w = min(tile_w, positions)
    tiles = -(-positions // tile_w)
    # slot r of tile t is position t * tile_w + r; it may pass the end in the last tile
    overflow = [(tiles - 1) * tile_w + r >= positions for r in range(tile_w)]
    sh, sw = shape.stride
    dh, dw = shape.dilation
    acc_t = x.dtype  # accumulate in the input dtype (float32); the epilogue may cast
    if block and (shape.groups != 1 or cb % block):
        raise IRError(f"NCHW{block}c conv kernel needs an ungrouped convolution and a "
                      f"channel tile that is a multiple of {block}: {shape}, cb={cb}")
    # a padded NCHW layer past BANDED_TILES_BYTES pads per band of tiles, not the whole input
    pads_per_band = (not block and kblock is None and not band and shape.groups == 1
                     and needs_padding(shape)
                     and padded_image_bytes(shape, itemsize(x.dtype)) >= BANDED_TILES_BYTES)
    # a region's first convolution (a 4-D `x`) reads its NCHW input in place
    xp, prologue = (padded_blocked_input(x, shape, block) if block and x.ndim == 5
                    else (unpadded_reader(x), []) if pads_per_band else padded_input(x, shape))
    out_blocks = -(-cog // block) if block else 0
    # NCHW, an epilogue reading a tensor shaped like the output (a residual Add) reads it
    # per channel along the tile's consecutive positions (`flat_stores`): read along the
    # channels, as the rest of the epilogue is computed, each value is a plane apart and
    # the loads became gathers (ResNet-50's 1x1 layers with their Add at 14x14 and 7x7:
    # 24 gathers of 8 per tile).
    flat = FlatEpilogue(epilogue, shape.out_h, shape.out_w)
    flat_out = flat.view(out) if not block and flat.reads_output_shaped() else None
    # the weights of one (block, input channel): kh * kw vectors of cb channels
    per_channel = shape.kh * shape.kw * cb
    pf = WeightPrefetch(wp, (kblock.kc if kblock else cig) * per_channel) if prefetch else None

    def tile(n: PrimExpr, g: PrimExpr, ob: PrimExpr, t: PrimExpr,
             seg: Segment | None = None, read: PhaseReader = xp) -> Stmt:
        acc = Buffer("acc", (tile_w, cb), acc_t, "local")
        head = tile_accumulators(acc, seg)
        ci0: PrimExpr = _c(0) if seg is None else seg.ci0
        rows: list[PrimExpr] = []
        cols: list[PrimExpr] = []
        for r in range(tile_w):
            pos: PrimExpr = t * tile_w + r
            if overflow[r]:
                pos = min_(pos, positions - 1)
            rv, cv = Var(f"oh{r}", INDEX_DTYPE), Var(f"ow{r}", INDEX_DTYPE)
            head += [LetStmt(rv, pos // ow_n), LetStmt(cv, pos % ow_n)]
            rows.append(rv)
            cols.append(cv)
        channels = cig if seg is None else seg.kc
        if pf is not None:
            head.append(pf.start((g, ob, ci0, _c(0), _c(0), _c(0)), channels * per_channel))

        def step_(ci: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
            # one load per input value, bound once; the weight row is one vector load
            stmts: list[Stmt] = []
            xs = []
            for r in range(tile_w):
                xv = Var(f"x{r}", acc_t)
                stmts.append(LetStmt(xv, read(n, g * cig + ci0 + ci, rows[r] * sh + kh * dh,
                                              _c(0), cols[r] * sw + kw * dw)))
                xs.append(xv)
            if pf is not None:
                stmts += pf.at(((ci * shape.kh + kh) * shape.kw + kw) * cb, cb)

            def lanes(v: PrimExpr) -> Stmt:
                wv = Var("w", acc_t)
                return seq(LetStmt(wv, wp[g, ob, ci0 + ci, kh, kw, v]), *(
                    Store(acc, madd(acc[_c(r), v], xs[r], wv, fused), (_c(r), v))
                    for r in range(tile_w)))

            return seq(*stmts, lanes_loop("v", cb, lanes))

        taps = image_rows(shape, rows[0], rows[-1])
        red = reduction_loop("ci", 0, channels, unroll, lambda ci: kernel_taps(
            shape, taps, lambda kh, kw: step_(ci, kh, kw)))
        # The accumulators are read at constant rows and whole vectors only, so LLVM keeps
        # them in registers; they are copied to `stage`, which the epilogue loop reads
        # one output channel at a time.
        stage = Buffer("stage", (tile_w, cb), acc_t, "local")
        copy = lanes_loop("v", cb, lambda v: seq(*(
            Store(stage, acc[_c(r), v], (_c(r), v)) for r in range(tile_w))))

        def emit_blocked() -> Stmt:
            real = [t * tile_w + r < positions if overflow[r] else None
                    for r in range(tile_w)]
            return seq(*blocked_tile_stores(out, stage, epilogue, n, ob, rows, cols, real,
                                            block, cog, blocks, out_blocks))

        # NCHW: a tile's `cb` channels of one position lie a plane apart, so the stores
        # are scalar. The epilogue's arithmetic (a sigmoid is dozens of operations) is
        # done first in vectors along the channels into `result`: `cb` of them, or in
        # the last block of a channel count no multiple of `cb` the channels there are.
        result = Buffer("result", (tile_w, cb), out.dtype, "local")

        def in_block(v: PrimExpr, body: Stmt) -> Stmt:
            # lane `v` of the last block of a channel count no multiple of `cb`: a real channel?
            return IfThenElse(ob * cb + v < cog, body) if cog % cb else body

        def index(r: int, v: PrimExpr) -> tuple[PrimExpr, ...]:
            oc_local = ob * cb + v
            oc = g * cog + oc_local if shape.groups > 1 else oc_local
            return n, oc, rows[r], cols[r]

        def apply(v: PrimExpr) -> Stmt:
            return seq(*(Store(result, epilogue(stage[_c(r), v], index(r, v)), (_c(r), v))
                         for r in range(tile_w)))

        def emit(v: Var) -> Stmt:
            stores: list[Stmt] = []
            for r in range(tile_w):
                st: Stmt = Store(out, result[_c(r), v], index(r, v))
                if overflow[r]:
                    st = IfThenElse(t * tile_w + r < positions, st)
                stores.append(st)
            return in_block(v, seq(*stores))

        def flat_stores(v: Var) -> Stmt:
            assert flat_out is not None
            stores: list[Stmt] = []
            for r in range(tile_w):
                n_, oc, _, _ = index(r, v)
                p = t * tile_w + r
                st: Stmt = Store(flat_out, flat(stage[_c(r), v], (n_, oc, p)), (n_, oc, p))
                stores.append(IfThenElse(p < positions, st) if overflow[r] else st)
            return in_block(v, seq(*stores))

        if block:
            finish = seq(Allocate(stage), copy, emit_blocked())
        elif flat_out is not None:
            finish = seq(Allocate(stage), copy, _loop("v", cb, flat_stores, kind="scalar"))
        else:
            applied = lanes_loop("v", cb, apply)
            if cog % cb:
                last = lanes_loop("v", cog % cb, apply)
                applied = IfThenElse(ob < blocks - 1, applied, last) if blocks > 1 else last
            finish = seq(Allocate(stage), copy, Allocate(result), applied, _loop("v", cb, emit))
        return seq(*head, red, finish if seg is None else segment_end(acc, seg, finish))

    def loops() -> Stmt:  # the parallel loops over `tile`
        if pads_per_band:
            return banded_tiles(shape, x, tiles, tile_w, blocks,
                                lambda n, ob, t, read: tile(n, _c(0), ob, t, read=read))
        if kblock is None and band and band < tiles:
            bands = -(-tiles // band)

            def banded(n: PrimExpr, g: PrimExpr, b: PrimExpr, ob: PrimExpr, tt: PrimExpr) -> Stmt:
                t = Var("t", INDEX_DTYPE)
                body: Stmt = tile(n, g, ob, t)
                if tiles % band:
                    body = IfThenElse(t < tiles, body)
                return seq(LetStmt(t, b * band + tt), body)

            return seq(*prologue, parallel_tiles((shape.n, shape.groups, bands, blocks, band),
                                                 banded))
        if kblock is None:
            return seq(*prologue, parallel_tiles((shape.n, shape.groups, blocks, tiles), tile))
        if cig % kblock.kc:
            raise IRError(f"blocked conv kernel: {kblock.kc} channels per segment do not divide "
                          f"the group's {cig}")

        def task(n: PrimExpr, g: PrimExpr, ob: PrimExpr, b: PrimExpr) -> Stmt:
            return segmented_band(kblock, cig, tiles, b, (tile_w, cb), acc_t,
                                  lambda t, seg: tile(n, g, ob, t, seg))

        bands = -(-tiles // min(kblock.band, tiles))
        return seq(*prologue, parallel_tiles((shape.n, shape.groups, blocks, bands), task))

    nest = loops()
    # the views the tiles' flat stores and prefetches made
    return seq(*flat.decls, *(pf.decls if pf else ()), nest)


#: The padded image size from which the NCHW blocked kernel pads per band of tiles
#: (`banded_tiles`): 3x3 layers reading 0.86 MB (64 channels at 56x56, stride 1 and 2)
#: ran 7-20% faster on two threads, those reading 0.46 MB or less (128 at 28x28, 256 at
#: 14x14) the same, and at 7x7 (one tile per band: each band streams every channel
#: block's weights again) 4% slower on one thread (Zen 4).
BANDED_TILES_BYTES = 512 * 1024


def banded_tiles(shape: ConvShape, x: Buffer, tiles: int, tile_w: int, blocks: int,
                 run: Callable[[PrimExpr, PrimExpr, PrimExpr, PhaseReader], Stmt]) -> Stmt:
    """The tiles of a padded NCHW blocked convolution as one parallel loop over bands of
    consecutive tiles (`ROW_BANDS` of them, as `banded_rows`), each band zero-padding the
    input rows its tiles read into a buffer of its own (`band_copy`) and then running
    `run(n, channel block, tile, reader)` for every channel block and tile of the band.
    A padded copy of the whole input made before the tiles, split over the threads by
    channel, was read by every thread's tiles: on two threads a 3x3 64>64 @56 layer
    spent a fifth of its time moving it between the cores (Zen 4)."""
    per = -(-tiles // min(ROW_BANDS, tiles))  # tiles per band
    bands = -(-tiles // per)
    positions = shape.out_h * shape.out_w
    sh, dh = shape.stride[0], shape.dilation[0]

    def first_row(b: int) -> int:
        return b * per * tile_w // shape.out_w

    def last_row(b: int) -> int:
        return (min((b + 1) * per * tile_w, positions) - 1) // shape.out_w

    # padded rows the tallest band reads
    rows_in = max((last_row(b) - first_row(b)) * sh for b in range(bands)) \
        + (shape.kh - 1) * dh + 1

    def body(n: PrimExpr, b: PrimExpr) -> Stmt:
        copy, read = band_copy(shape, x, n, b * per * tile_w // shape.out_w * sh, rows_in)

        def one(ob: PrimExpr, tt: PrimExpr) -> Stmt:
            t = Var("t", INDEX_DTYPE)
            stmt = run(n, ob, t, read)
            if tiles % per:
                stmt = IfThenElse(t < tiles, stmt)
            return seq(LetStmt(t, b * per + tt), stmt)

        return seq(*copy, _nest(("ob", "tt"), (blocks, per), one))

    return parallel_tiles((shape.n, bands), body)


def subsamples(shape: ConvShape) -> bool:
    """Whether the blocked kernel first copies the input's strided columns and rows: an
    unpadded strided 1x1 layer (a projection shortcut)."""
    return ((shape.kh, shape.kw) == (1, 1) and shape.stride != (1, 1)
            and not any(shape.pads))


def subsampled_input(x: Buffer, shape: ConvShape, *, isa: ISA) -> tuple[Buffer, list[Stmt]]:
    """The workspace `[n][c][oh][ow]` of the input values an unpadded strided 1x1 layer
    reads (`x[n, c, oh * sh, ow * sw]`), and the statements filling it (one parallel
    loop over images and channels)."""
    sh, sw = shape.stride
    xs = Buffer("xsub", (shape.n, shape.c_in, shape.out_h, shape.out_w), x.dtype)

    def fill(n: PrimExpr, c: PrimExpr) -> Stmt:
        return _loop("i", shape.out_h, lambda i: _loop("j", shape.out_w, lambda j: Store(
            xs, x[n, c, i * sh, j * sw], (n, c, i, j))))

    work = shape.n * shape.c_in * shape.out_h * shape.out_w
    return xs, [Allocate(xs), parallel_when(lambda: parallel_tiles((shape.n, shape.c_in), fill),
                                            work, "element", isa=isa)]


@dataclass(frozen=True)
class ConvKBlocking:
    """How the blocked kernel splits its sums (`blocked_conv_body`): `kc` input channels
    per segment (a divisor of the group's), `band` tiles per parallel task."""

    kc: int
    band: int


@dataclass(frozen=True)
class Segment:
    """One segment of a K-blocked tile's sums: channels `ci0 .. ci0 + kc` of tile `tile`
    of the task's partial sums `part`; `first`/`last`: whether it is the first / last."""

    part: Buffer
    tile: PrimExpr
    ci0: PrimExpr
    kc: int
    first: PrimExpr
    last: PrimExpr


def tile_accumulators(acc: Buffer, seg: Segment | None) -> list[Stmt]:
    """`acc` (a tile's `[tile_w][cb]` accumulators) allocated and zeroed; in a segment
    after the first, loaded from the partial sums instead."""
    tile_w, cb = (int(d) for d in acc.shape)
    zero = lanes_loop("v", cb, lambda v: seq(*(
        Store(acc, as_expr(0.0, acc.dtype), (_c(r), v)) for r in range(tile_w))))
    if seg is None:
        return [Allocate(acc), zero]
    return [Allocate(acc), IfThenElse(seg.first, zero, lanes_loop("v", cb, lambda v: seq(*(
        Store(acc, seg.part[seg.tile, _c(r), v], (_c(r), v)) for r in range(tile_w)))))]


def segment_end(acc: Buffer, seg: Segment, finish: Stmt) -> Stmt:
    """`finish` (the tile's stores) after the last segment; the partial sums kept after
    the others."""
    tile_w, cb = (int(d) for d in acc.shape)
    keep = lanes_loop("v", cb, lambda v: seq(*(
        Store(seg.part, acc[_c(r), v], (seg.tile, _c(r), v)) for r in range(tile_w))))
    return IfThenElse(seg.last, finish, keep)


def segmented_band(kblock: ConvKBlocking, channels: int, tiles: int, b: PrimExpr,
                   tile: tuple[int, int], dtype: str,
                   body: Callable[[PrimExpr, Segment], Stmt]) -> Stmt:
    """Band `b` of `kblock.band` consecutive tiles (of `tiles`), each `tile` = `(tile_w,
    cb)` accumulators, summed `kblock.kc` of `channels` input channels at a time: every
    tile's segment (`body(tile index, segment)`) before the next segment, the partial
    sums in a buffer of the band's."""
    kc, band = kblock.kc, min(kblock.band, tiles)
    segments = channels // kc
    part = Buffer("part", (band, *tile), dtype)
    here: PrimExpr = _c(band) if tiles % band == 0 else min_(band, tiles - b * band)
    k, tt = Var("kseg", INDEX_DTYPE), Var("tt", INDEX_DTYPE)
    seg = Segment(part, tt, k * kc, kc, compare("eq", k, 0), compare("eq", k, segments - 1))
    return seq(Allocate(part), For(k, _c(0), _c(segments), "serial", For(
        tt, _c(0), here, "serial", body(b * band + tt, seg))))


# --------------------------------------------------------------------------- depthwise

def depthwise_tile_width(shape: ConvShape, lanes: int) -> int:
    """Columns per depthwise tile: as for the row-tiled kernel (`rows_tile_width`)."""
    return rows_tile_width(shape.out_w, lanes)


#: The most output rows one depthwise tile holds: past it an input row's loads are
#: shared by few more rows (8 measured no faster than 4), and the tile's code (and
#: LLVM's time on it) grows with the rows.
DEPTHWISE_MAX_ROWS = 4


def depthwise_tile_rows(shape: ConvShape, tile_w: int, lanes: int, registers: int) -> int:
    """Output rows per depthwise tile: as many as the register file holds accumulators
    for (`tile_w` columns each, next to an input vector and a broadcast weight), at most
    `DEPTHWISE_MAX_ROWS`, evened out over the image (3 rows of a 9-row image, not 4,
    4 and 1) so that few tiles are partial."""
    vectors = -(-tile_w // lanes)
    most = max(1, min(DEPTHWISE_MAX_ROWS, (registers - 2) // vectors, shape.out_h))
    return -(-shape.out_h // -(-shape.out_h // most))


#: The largest padded channel (bytes) a window kernel copies onto the stack, next to
#: where it reads it (a 112x112 float32 channel, padded, is 52 KB); a larger input is
#: padded into a workspace first.
WINDOW_PLANE_BYTES = 1 << 16


#: One tap of a window kernel: (accumulator, input value, channel, kh, kw) -> the new
#: accumulator (a multiply-add with the depthwise weight, a max or a sum for pooling).
Tap = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


def depthwise_conv_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, tile_w: int,
                        epilogue: Epilogue, fused: bool, lanes: int, registers: int,
                        l2_bytes: int = 0) -> Stmt:
    """The loop nest of a depthwise convolution (`groups == c_in == c_out`); `w` is the
    OIHW weight (C, 1, kh, kw). See `window_body`."""
    if not shape.depthwise:
        raise IRError(f"depthwise kernel needs groups == channels, got {shape}")

    def tap(acc: PrimExpr, xv: PrimExpr, c: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> PrimExpr:
        return madd(acc, xv, w[c, _c(0), kh, kw], fused)

    return window_body(shape, x, out, tile_w, lanes, registers, tap, as_expr(0.0, x.dtype),
                       epilogue, l2_bytes)


def window_body(shape: ConvShape, x: Buffer, out: Buffer, tile_w: int, lanes: int,
                registers: int, tap: Tap, init: PrimExpr, epilogue: Epilogue,
                l2_bytes: int = 0) -> Stmt:
    """The loop nest of a per-channel window kernel (a depthwise convolution, a 2-D
    pooling) over the NCHW input `x`: each output is `init` combined with `tap` over its
    `kh x kw` window of the input padded with zeros, then stored
    through `epilogue`.

    A tile is `rows` consecutive output rows (`depthwise_tile_rows`) x `tile_w`
    columns of one channel, vectors along the columns. It walks the input rows the tile
    reads once: each (input row, kw) vector is loaded once and combined into every
    output row that reads it (with that row's kh), so a k x k window costs about
    (rows * stride + k) * k / rows loads per output row instead of k * k, and the tile's
    fixed costs (its initialisation, the epilogue's staging) are shared by its rows. The
    input rows are unrolled, the kw taps of each a loop: the code grows with the rows,
    not with rows x kw. `l2_bytes` (the ISA's L2; 0: never) decides where a padded
    stride-1 input is padded: channel by channel on the stack past it."""
    oh_n, ow_n = shape.out_h, shape.out_w
    sh, sw = shape.stride
    dh, dw = shape.dilation
    acc_t = x.dtype  # accumulate in the input dtype (float32); the epilogue may cast
    plane = padded_plane_dims(shape, sw)
    # Stride 1, a padded input larger than the L2 (`l2_bytes`, 0: never): each channel
    # is padded into a stack plane just before its tiles read it, in cache, instead of a
    # workspace of every channel filled first, a pass through memory of its own
    # (144x56x56 3x3: 0.155 -> 0.139 ms on one Zen 5 core). Where the workspace fits
    # the L2 (960x7x7: 0.038 -> 0.055 ms) and for a strided layer's phase-split copy
    # (96x112x112 3x3/2: 0.36 -> 0.56 ms) the plane measured slower.
    plane_bytes = plane[0] * plane[1] * plane[2] * itemsize(x.dtype)
    local = sw == 1 and needs_padding(shape, sw) and plane_bytes <= WINDOW_PLANE_BYTES \
        and shape.c_in * plane_bytes > l2_bytes > 0  # one image's (the batch may be symbolic)
    if local:
        xplane = Buffer("xplane", plane, x.dtype, "local")
        fill_plane = plane_fill(x, shape, sw, None, 0,
                                lambda n, c, p, i, q: (_c(p), i, q), xplane)
        prologue: list[Stmt] = []
        xp: PhaseReader = lambda n, c, i, p, q: xplane[p, i, q]  # noqa: E731
    else:
        xp, prologue = padded_input(x, shape, phases=sw)
    rows = depthwise_tile_rows(shape, tile_w, lanes, registers)
    # input row offset i (from the tile's first row's first input row) feeds output row
    # j of the tile through window row kh when i = j * sh + kh * dh
    readers: dict[int, list[tuple[int, int]]] = {}
    for j in range(rows):
        for kh in range(shape.kh):
            readers.setdefault(j * sh + kh * dh, []).append((j, kh))

    def tile(n: PrimExpr, c: PrimExpr, oh0: PrimExpr, height: int, ow0: PrimExpr,
             width: int) -> Stmt:
        acc = Buffer("acc", (height, width), acc_t, "local")
        start = lanes_loop("r", width, lambda r: seq(*(
            Store(acc, init, (_c(j), r)) for j in range(height))))
        steps: list[Stmt] = []
        for i, pairs in sorted(readers.items()):
            uses = [(j, kh) for j, kh in pairs if j < height]
            if not uses:
                continue

            def column(kw: PrimExpr, i: int = i, uses: list[tuple[int, int]] = uses) -> Stmt:
                # column (ow0 + r) * sw + kw * dw lies in phase (kw * dw) % sw at
                # ow0 + r + (kw * dw) // sw: consecutive in r whatever the stride
                phase, shift = ((kw * dw) % sw, (kw * dw) // sw) if sw > 1 else (_c(0), kw * dw)

                def step(r: PrimExpr) -> Stmt:
                    xv = Var("xv", acc_t)
                    return seq(LetStmt(xv, xp(n, c, oh0 * sh + i, phase, ow0 + r + shift)),
                               *(Store(acc, tap(acc[_c(j), r], xv, c, _c(kh), kw), (_c(j), r))
                                 for j, kh in uses))

                return lanes_loop("r", width, step)

            # the kw loop stays a loop: the tile's code grows with its rows, not rows x kw
            steps.append(_loop("kw", shape.kw, column) if shape.kw > 1 else column(_c(0)))

        # The accumulators are copied to a stack array at constant rows (so they stay in
        # registers), which one loop over the rows stores through the epilogue: one copy
        # of the epilogue's code per tile shape, however many rows the tile has.
        stage = Buffer("stage", (height, width), acc_t, "local")
        copy = lanes_loop("r", width, lambda r: seq(*(
            Store(stage, acc[_c(j), r], (_c(j), r)) for j in range(height))))

        def store(j: PrimExpr) -> Stmt:
            return lanes_loop("r", width, lambda r: Store(
                out, epilogue(stage[j, r], (n, c, oh0 + j, ow0 + r)), (n, c, oh0 + j, ow0 + r)))

        stores = _loop("j", height, store) if height > 1 else store(_c(0))
        return seq(Allocate(acc), start, *steps, Allocate(stage), copy, stores)

    def block(n: PrimExpr, c: PrimExpr, oh0: PrimExpr, height: int) -> Stmt:
        return tiled_row(ow_n, tile_w, lanes,
                         lambda ow0, width: tile(n, c, oh0, height, ow0, width))

    def channel(n: PrimExpr, c: PrimExpr) -> Stmt:
        # Every channel writes its own output plane: `parallelize` splits this loop nest
        # at its first loop with enough iterations (the channels, at batch 1).
        full, rest = divmod(oh_n, rows)
        parts: list[Stmt] = []
        if full:
            parts.append(_loop("ob", full, lambda ob: block(n, c, ob * rows, rows))
                         if full > 1 else block(n, c, _c(0), rows))
        if rest:
            parts.append(block(n, c, _c(full * rows), rest))
        if local:
            return seq(Allocate(xplane), fill_plane(n, c), *parts)
        return seq(*parts)

    return seq(*prologue, _nest(("n", "c"), (shape.n, shape.c_in), channel))


def tiled_row(out_w: int, tile_w: int, lanes: int,
              tile: Callable[[PrimExpr, int], Stmt]) -> Stmt:
    """One output row as the runs of `row_tiles`: `tile(first column, width)` for each
    tile, a loop over a run of several."""
    parts: list[Stmt] = []
    for start, count, width in row_tiles(out_w, tile_w, lanes):
        if count == 1:
            parts.append(tile(_c(start), width))
        else:
            def run(t: Var, wd: int = width, s: int = start) -> Stmt:
                return tile(t * wd + s, wd)

            parts.append(_loop("owt", count, run))
    return seq(*parts)


# --------------------------------------------------------------------------- row tiles

ROW_TILE_CHANNELS = 6


def pack_rows_weight(w: np.ndarray, rows: int = ROW_TILE_CHANNELS) -> np.ndarray:
    """OIHW weight -> `[co_block][ci][kh][kw][rows]`, output channels padded with zeros."""
    co, ci, kh, kw = w.shape
    blocks = -(-co // rows)
    padded = np.zeros((blocks * rows, ci, kh, kw), dtype=w.dtype)
    padded[:co] = w
    return np.ascontiguousarray(
        padded.reshape(blocks, rows, ci, kh, kw).transpose(0, 2, 3, 4, 1))


def unpack_rows_weight(wp: np.ndarray, c_out: int) -> np.ndarray:
    """`pack_rows_weight` undone: the OIHW weight with `c_out` output channels."""
    blocks, ci, kh, kw, rows = wp.shape
    w = wp.transpose(0, 4, 1, 2, 3).reshape(blocks * rows, ci, kh, kw)[:c_out]
    return np.ascontiguousarray(w)


def rows_tile_width(width: int, lanes: int) -> int:
    """Output columns per row tile: two vectors (12 accumulators for 6 rows fit AVX2's 16
    registers with an input vector pair and a broadcast weight), one for narrower rows,
    the whole row when it is narrower than a vector."""
    if width >= 2 * lanes:
        return 2 * lanes
    return lanes if width >= lanes else width


def rows_conv_body(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer, tile_w: int,
                   epilogue: Epilogue, fused: bool, lanes: int) -> Stmt:
    """An ungrouped convolution tiled along output rows: a tile is `rows` output
    channels x `tile_w` consecutive columns of one output row, vectors along the
    columns (contiguous in the input, split by stride phase as in the depthwise kernel,
    and in the output); each (ci, kh, kw) step broadcasts `rows` weights (contiguous in
    the `pack_rows_weight` layout) against one input row segment. For a 1x1 stride-1
    convolution this is a matrix-product tile; it suits layers with few input channels
    (the blocked kernel's tile would spend more on its epilogue than on the sums). A
    tile's sums leave out the kernel rows reading the zero border (`image_rows`)."""
    if shape.groups != 1:
        raise IRError(f"row-tiled conv kernel needs an ungrouped convolution: {shape}")
    blocks, ci_n, _, _, rows = (int(d) for d in wp.shape)
    sh, sw = shape.stride
    dh, dw = shape.dilation
    acc_t = x.dtype  # accumulate in the input dtype (float32); the epilogue may cast
    xp, prologue = padded_input(x, shape, phases=sw)

    def tile(n: PrimExpr, ob: PrimExpr, oh: PrimExpr, ow0: PrimExpr, width: int,
             xp: PhaseReader = xp) -> Stmt:
        acc = Buffer("acc", (rows, width), acc_t, "local")
        head: list[Stmt] = [Allocate(acc), lanes_loop("j", width, lambda j: seq(*(
            Store(acc, as_expr(0.0, acc_t), (_c(r), j)) for r in range(rows))))]

        def step(ci: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
            tap = kw * dw
            phase, shift = (tap % sw, tap // sw) if sw > 1 else (_c(0), tap)
            stmts: list[Stmt] = []
            ws = []
            for r in range(rows):
                wv = Var(f"w{r}", acc_t)
                stmts.append(LetStmt(wv, wp[ob, ci, kh, kw, _c(r)]))
                ws.append(wv)

            def lanes(j: PrimExpr) -> Stmt:
                xv = Var("x", acc_t)
                return seq(LetStmt(xv, xp(n, ci, oh * sh + kh * dh, phase, ow0 + j + shift)),
                           *(Store(acc, madd(acc[_c(r), j], xv, ws[r], fused), (_c(r), j))
                             for r in range(rows)))

            return seq(*stmts, lanes_loop("j", width, lanes))

        taps = image_rows(shape, oh, oh)
        sums = _nest(("ci",), (ci_n,), lambda ci: kernel_taps(
            shape, taps, lambda kh, kw: step(ci, kh, kw)))
        body: list[Stmt] = [*head, sums]
        for r in range(rows):
            co = ob * rows + r
            def value(j: PrimExpr, r: int = r) -> PrimExpr:
                return acc[_c(r), j]

            def index(j: PrimExpr, co: PrimExpr = co) -> tuple[PrimExpr, ...]:
                return (n, co, oh, ow0 + j)

            stores = seq(*_store_row(acc_t, width, value, index, out, epilogue))
            if shape.c_out % rows and r >= shape.c_out % rows:
                stores = IfThenElse(co < shape.c_out, stores)
            body.append(stores)
        return seq(*body)

    runs = row_tiles(shape.out_w, tile_w, lanes)
    per_row = sum(count for _, count, _ in runs)

    def run(n: PrimExpr, ob: PrimExpr, oh: PrimExpr, t: PrimExpr,
            read: PhaseReader = xp) -> Stmt:
        # tile t of the row: the full tiles first, then the remainders
        start, count, width = runs[0]
        stmt = tile(n, ob, oh, t * width + start if count > 1 else _c(start), width, read)
        first = count
        for rs, _, rw in runs[1:]:
            stmt = IfThenElse(t < first, stmt, tile(n, ob, oh, _c(rs), rw, read))
            first += 1
        return stmt

    if prologue:
        return banded_rows(shape, x, blocks, per_row, run)
    return parallel_tiles((shape.n, blocks, shape.out_h, per_row), run)


#: Bands of output rows a padded row-tiled convolution is split into (fewer on an image
#: of fewer rows), their heights within one of each other: two, four or eight threads
#: then take equal shares of whole bands. (Bands of `out_h // 8` rows made 9 bands of
#: SqueezeNet's 109- and 54-row layers: shares of 5 and 4 bands on two threads.)
ROW_BANDS = 8


def banded_rows(shape: ConvShape, x: Buffer, blocks: int, per_row: int,
                run: Callable[..., Stmt]) -> Stmt:
    """The tiles of a padded row-tiled convolution as one parallel loop over bands of
    output rows, each band zero-padding the input rows it reads into a buffer of its
    own (`band_copy`) and then running its tiles (`run(n, block, row, tile, reader)`). A
    padded copy of the whole input made before the tile loop is written by one thread and
    read by all: every call then moves it between the cores' caches, which cost more than
    the second thread saved (a 32x32x32 3x3 layer: 192 us on one thread, 221 on two; with
    bands the copy a thread reads is its own). The rows around a band are copied twice."""
    sh, dh = shape.stride[0], shape.dilation[0]
    bands = min(ROW_BANDS, shape.out_h)
    band = -(-shape.out_h // bands)  # the tallest band's rows
    rows_in = (band - 1) * sh + (shape.kh - 1) * dh + 1  # padded rows a band reads

    def body(n: PrimExpr, b: PrimExpr) -> Stmt:
        # band b: output rows b * out_h // bands .. (b + 1) * out_h // bands
        even = shape.out_h % bands == 0
        first_row: PrimExpr = b * band if even else b * shape.out_h // bands
        copy, read = band_copy(shape, x, n, first_row * sh, rows_in, shape.stride[1])
        here: PrimExpr = (_c(band) if even
                          else (b + 1) * shape.out_h // bands - first_row)
        j = Var("j", INDEX_DTYPE)
        tiles = _loop("ob", blocks, lambda ob: For(j, _c(0), here, "serial", _loop(
            "t", per_row, lambda t: run(n, ob, first_row + j, t, read))))
        return seq(*copy, tiles)

    return parallel_tiles((shape.n, bands), body)


def band_copy(shape: ConvShape, x: Buffer, n: PrimExpr, row0: PrimExpr, rows_in: int,
              phases: int = 1) -> tuple[list[Stmt], PhaseReader]:
    """The statements copying padded rows `row0 .. row0 + rows_in` of image `n`, zero
    padded and split into `phases` column phases (as `padded_input`), into a buffer of
    the task's own, and the reader of that buffer (at padded rows, as `padded_input`'s)."""
    sw = phases
    top, left = shape.pads[0], shape.pads[1]
    _, _, wq = padded_plane_dims(shape, sw)
    zero = as_expr(0.0, x.dtype)
    xb = Buffer("xband", (shape.c_in, sw, rows_in, wq), x.dtype)

    def fill(c: PrimExpr) -> Stmt:
        parts: list[Stmt] = []
        for p in range(sw):
            lo = max(0, -(-(left - p) // sw))
            hi = min(wq - 1, (left + shape.w - 1 - p) // sw)

            def zeros(r: PrimExpr, q0: int, q1: int, p: int = p) -> list[Stmt]:
                return [_loop("q", q1 - q0, lambda q: Store(xb, zero, (c, _c(p), r, q)),
                              start=q0)] if q1 > q0 else []

            def row(r: Var, p: int = p, lo: int = lo, hi: int = hi) -> Stmt:
                if hi < lo:
                    return seq(*zeros(r, 0, wq))
                src = row0 + r - top

                def put(q: PrimExpr, p: int = p, lo: int = lo) -> Stmt:
                    return Store(xb, x[n, c, src, (q + lo) * sw + (p - left)],
                                 (c, _c(p), r, q + lo))

                # One phase (stride 1) reads the row's columns consecutively: a vector
                # loop (a serial one was left as scalar copies, 7% of a 32x32x32 3x3
                # layer's time on Zen 4).
                cols = (lanes_loop("q", hi - lo + 1, put) if sw == 1
                        else _loop("q", hi - lo + 1, put))
                copy = seq(*zeros(r, 0, lo), cols, *zeros(r, hi + 1, wq))
                # each branch its own loops (a loop variable is bound once)
                return IfThenElse(src >= 0, IfThenElse(src < shape.h, copy, seq(
                    *zeros(r, 0, wq))), seq(*zeros(r, 0, wq)))

            parts.append(_loop("r", rows_in, row))
        return seq(*parts)

    def read(n_: PrimExpr, c: PrimExpr, i: PrimExpr, p: PrimExpr, q: PrimExpr) -> PrimExpr:
        return xb[c, p, i - row0, q]

    return [Allocate(xb), _loop("c", shape.c_in, fill)], read
