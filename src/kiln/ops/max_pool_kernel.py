"""The row-by-row 2-D max pooling kernel (NCHW, static shapes; float32, int8, uint8).

A max needs no multiply and no neutral value inside the input, so unlike the window
kernel of a depthwise convolution (kiln.ops.conv_kernels.window_body) nothing is copied
into a padded workspace. Each output row is made in two steps:

1. vertical: the max of the window's input rows, contiguous vector loads straight from
   the input into one row buffer on the stack (in L1). Rows outside the input are left
   out: which rows are inside is known per output row at compile time, so the output
   rows are grouped into runs with the same rows (the top border, the interior loop,
   the bottom border).
2. horizontal: the max over the window's columns of that buffer. The buffer holds the
   padding columns (the lowest value, written once per channel) at its ends only. For
   a stride s > 1 the row is first split by column phase (column q * s + p to phase p),
   so every window column is again a contiguous vector load.

The channels run as one loop over (image, channel), parallel when its work (window
values read, MAX_ELEMENTS operations each) reaches the threshold of
kiln.ops.kernels.parallel_work.

The row loops are vector loops of the ISA's lanes (32 bytes of an int8/uint8 pool with
AVX2: kiln.ir.analysis.vector_loops), except the horizontal step of a byte pool whose
output row is shorter than half a register (SqueezeNet's 512 x 27 x 27 one, 13 wide):
its pieces of 8, 4 and 1 bytes read the phase row one byte apart, which LLVM keeps in
registers and spills, and the reloads wait for the spilled stores (0.033 -> 0.10 ms);
that loop stays a plain loop for LLVM. (An 8-byte load at offset 1 spans the 8- and
4-byte spills, so the store buffer cannot forward it. Covering the row with two
overlapping pieces instead, 8 + 8 for 13 bytes, was slower for every byte pool, the
wide rows' too: 256 x 54 x 54 0.10 -> 0.17 ms, Zen 3.)

Max is exact, so the result equals the tensor-expression definition bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.dtype import itemsize as dtype_bytes
from kiln.ir.tensor import Allocate, Buffer, PrimExpr, Stmt, Store, max_, seq
from kiln.ops import conv_kernels as ck
from kiln.ops import te
from kiln.ops.kernels.tiles import const as _c
from kiln.ops.kernels.tiles import lanes_loop, parallel_tiles, parallel_when
from kiln.ops.kernels.tiles import loop as _loop

Epilogue = Callable[[PrimExpr, tuple[PrimExpr, ...]], PrimExpr]
#: Vector operations per window value read (the "element" unit of
#: kiln.ops.kernels.parallel_work): kiln's max propagates NaN, a compare and a select
#: beside the `max` instruction.
MAX_ELEMENTS = 2


def row_runs(shape: ck.ConvShape) -> list[tuple[int, int, tuple[int, ...]]]:
    """(first output row, number of rows, window rows inside the input) runs covering
    the output rows: consecutive rows that read the same window rows share a loop."""
    runs: list[tuple[int, int, tuple[int, ...]]] = []
    sh, dh, top = shape.stride[0], shape.dilation[0], shape.pads[0]
    for oh in range(shape.out_h):
        inside = tuple(kh for kh in range(shape.kh) if 0 <= oh * sh - top + kh * dh < shape.h)
        if runs and runs[-1][2] == inside:
            start, count, _ = runs[-1]
            runs[-1] = (start, count + 1, inside)
        else:
            runs.append((oh, 1, inside))
    return runs


def max_pool_body(shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int,
                  epilogue: Epilogue) -> Stmt:
    """The loop nest of a max pool of `shape` (its pads already widened for
    `ceil_mode`) over `x` into `out`, each output stored through `epilogue`."""
    sh, sw = shape.stride
    dh, dw = shape.dilation
    top, left, _, right = shape.pads
    lowest = te.lowest_value(x.dtype)
    width = left + shape.w + right
    phase_w = -(-width // sw)
    row = Buffer("maxrow", (phase_w * sw,), x.dtype, "local")
    phases = Buffer("maxphase", (sw, phase_w), x.dtype, "local") if sw > 1 else None
    tile_w = 4 * lanes
    short_phases = phases is not None and dtype_bytes(x.dtype) == 1 and 2 * shape.out_w < lanes

    def vertical(n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]) -> Stmt:
        def tile(w0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                value: PrimExpr = lowest
                for k, kh in enumerate(inside):
                    v = x[n, c, oh * sh + (kh * dh - top), w0 + r]
                    value = v if k == 0 else max_(value, v)
                return Store(row, value, (w0 + r + left,))
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.w, tile_w, lanes, tile)

    def split() -> Stmt:
        # a plain loop LLVM's and the C compiler's vectorizers turn into
        # loads and shuffles (an interleaved access group)
        assert phases is not None
        return _loop("q", phase_w, lambda q: seq(*(
            Store(phases, row[q * sw + p], (_c(p), q)) for p in range(sw))))

    def horizontal(n: PrimExpr, c: PrimExpr, oh: PrimExpr) -> Stmt:
        def tile(ow0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                value: PrimExpr = lowest
                for kw in range(shape.kw):
                    col = kw * dw
                    v = (phases[_c(col % sw), ow0 + r + col // sw] if phases is not None
                         else row[ow0 + r + col])
                    value = v if kw == 0 else max_(value, v)
                idx = (n, c, oh, ow0 + r)
                return Store(out, epilogue(value, idx), idx)
            if short_phases:
                return _loop("r", wd, lane)
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.out_w, tile_w, lanes, tile)

    def output_row(n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]) -> Stmt:
        parts = [vertical(n, c, oh, inside)]
        if phases is not None:
            parts.append(split())
        parts.append(horizontal(n, c, oh))
        return seq(*parts)

    def channel(n: PrimExpr, c: PrimExpr) -> Stmt:
        # the padding columns (and the phase split's tail) never change: written once
        ends = [Store(row, lowest, (_c(i),)) for i in range(left)]
        ends += [Store(row, lowest, (_c(i),)) for i in range(left + shape.w, phase_w * sw)]
        parts: list[Stmt] = [Allocate(row), *([Allocate(phases)] if phases else []), *ends]
        for start, count, inside in row_runs(shape):
            if count == 1:
                parts.append(output_row(n, c, _c(start), inside))
            else:
                def run(t: PrimExpr, s: int = start, i: tuple[int, ...] = inside) -> Stmt:
                    return output_row(n, c, t + s, i)

                parts.append(_loop("oh", count, run))
        return seq(*parts)

    # Every channel writes its own output plane: one loop over (image, channel), parallel
    # when its work reaches the threshold of kiln.ops.kernels.parallel_work, like every
    # kernel family's (`parallelize`'s estimate in expression nodes split even the cnn's
    # 1 us pool on AVX2: docs/performance.md, "Pools and the 2-thread split (Zen 3)").
    work = shape.n * shape.c_in * shape.out_h * (shape.kh * shape.w + shape.kw * shape.out_w)
    def build() -> Stmt:
        if shape.n == 1:  # the channel is the loop's index (no remainder to take)
            return parallel_tiles((shape.c_in,), lambda c: channel(_c(0), c))
        return parallel_tiles((shape.n, shape.c_in), channel)

    return parallel_when(build, work * MAX_ELEMENTS, "element", x.dtype)
