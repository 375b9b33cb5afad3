"""A stride-1 depthwise convolution over planes narrower than half a vector (ShuffleNet's
7 x 7 channels in 16 lanes), computed on the flattened plane (`flat_plane_body`).

A row tile (kiln.kernels.conv.window) holds one output row per vector: a 7-column row
leaves 9 of 16 lanes empty. Here each channel is copied as one flat run, its rows
`pitch` apart with the zero columns between them (a row's right padding is the next
row's left padding), so that output `(r, c)` at flat position `r * pitch + c` reads tap
`(kh, kw)` at that position plus `kh * pitch + kw` (times the dilation): every tap is
one shifted load per vector of the whole plane, the positions between rows computed and
not stored. A 7 x 7 plane (pitch 8) is 4 vectors a tap instead of 7.

The channels go in blocks of `FLAT_BLOCK` (or a smaller divisor of their count): a
block's planes are copied onto the stack, then convolved, so that a tap's loads come
several channels' stores after the ones they read (read right after its own plane's
stores, a channel waited on them and ran slower than the row tiles).
"""

from __future__ import annotations

from kiln.ir.tensor import Allocate, Buffer, PrimExpr, Stmt, Store, as_expr, seq
from kiln.kernels.tiles import Epilogue, lanes_loop, madd
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops.conv_geometry import ConvShape

#: Channels per block: the most, and the fewest a block may have (a channel count with
#: no divisor in between keeps the row tiles).
FLAT_BLOCK, FLAT_BLOCK_MIN = 8, 4


def flat_plane_vectors(shape: ConvShape, lanes: int, registers: int) -> int:
    """The vectors of one channel's flattened output plane (`flat_plane_body`), or 0
    where the row tiles are used instead: strided or symbolic geometry, rows
    of more than half a vector, a plane whose accumulators do not fit the registers
    (beside an input vector and a weight), one the flat plane saves fewer than a quarter
    of the row tiles' vectors on, or channels that split into no block."""
    if shape.symbolic_image or shape.stride != (1, 1) or 2 * shape.out_w > lanes \
            or not channel_block(shape):
        return 0
    vectors = -(-shape.out_h * _pitch(shape) // lanes)
    rows = shape.out_h * -(-shape.out_w // lanes)
    return vectors if vectors <= registers - 2 and 4 * vectors <= 3 * rows else 0


def _pitch(shape: ConvShape) -> int:
    """Elements between flattened rows: the row and the wider of its two paddings."""
    return shape.w + max(shape.pads[1], shape.pads[3])


def channel_block(shape: ConvShape) -> int:
    """Channels per block: the largest divisor of the channels up to `FLAT_BLOCK`, or 0
    when it is under `FLAT_BLOCK_MIN`."""
    block = max(d for d in range(1, FLAT_BLOCK + 1) if shape.c_in % d == 0)
    return block if block >= FLAT_BLOCK_MIN else 0


def flat_plane_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, vectors: int,
                    lanes: int, epilogue: Epilogue, fused: bool) -> Stmt:
    """The loop nest of a depthwise convolution (OIHW weight `w`) over flattened planes
    of `vectors` vectors each (`flat_plane_vectors`); see the module docstring."""
    pitch, top, left, block = _pitch(shape), shape.pads[0], shape.pads[1], channel_block(shape)
    dh, dw = shape.dilation
    span = vectors * lanes
    # the last vector's farthest tap, rounded up to whole vectors for the zero fill
    size = -(-(span + (shape.kh - 1) * dh * pitch + (shape.kw - 1) * dw) // lanes) * lanes
    plane = Buffer("xflat", (block, size), x.dtype, "local")
    acc = Buffer("acc", (span,), x.dtype, "local")
    stage = Buffer("stage", (span,), x.dtype, "local")
    zero = as_expr(0.0, x.dtype)

    def fill(n: PrimExpr, c: PrimExpr, k: PrimExpr) -> Stmt:
        # padded (row y, input column q) at y * pitch + left + q: zeros, then the image
        return seq(lanes_loop("q", size, lambda q: Store(plane, zero, (k, q))),
                   _loop("i", shape.h, lambda i: _loop(
                       "q", shape.w, lambda q: Store(
                           plane, x[n, c, i, q], (k, (i + top) * pitch + left + q)),
                       kind="vectorized")))

    def channel(n: PrimExpr, c: PrimExpr, k: PrimExpr) -> Stmt:
        taps: list[Stmt] = [lanes_loop("r", span, lambda r: Store(acc, zero, (r,)))]
        for kh in range(shape.kh):
            for kw in range(shape.kw):
                def tap(r: PrimExpr, kh: int = kh, kw: int = kw) -> Stmt:
                    xv = plane[k, r + kh * dh * pitch + kw * dw]
                    return Store(acc, madd(acc[r], xv, w[c, _c(0), _c(kh), _c(kw)], fused),
                                 (r,))
                taps.append(lanes_loop("r", span, tap))

        def store(j: PrimExpr) -> Stmt:
            return lanes_loop("r", shape.out_w, lambda r: Store(
                out, epilogue(stage[j * pitch + r], (n, c, j, r)), (n, c, j, r)))

        return seq(Allocate(acc), *taps, Allocate(stage),
                   lanes_loop("r", span, lambda r: Store(stage, acc[r], (r,))),
                   _loop("j", shape.out_h, store))

    def blocks(n: PrimExpr, b: PrimExpr) -> Stmt:
        return seq(Allocate(plane),
                   _loop("k", block, lambda k: fill(n, b * block + k, k)),
                   _loop("k", block, lambda k: channel(n, b * block + k, k)))

    return seq(_nest(("n", "b"), (shape.n, shape.c_in // block), blocks))
