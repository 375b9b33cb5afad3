"""The row-by-row 2-D max pooling kernel (NCHW, static shapes; float32, int8, uint8).

A max needs no multiply and no neutral value inside the input, so unlike the window
kernel of a depthwise convolution (kiln.kernels.conv.window.window_body) nothing is copied
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

Where they fit half the L1, a channel stages the first step's results for all its
output rows and then runs all the second steps (`staged_rows`: loads right after the
stores they read stall).

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

Max is exact, so the result equals the tensor-expression definition bit for bit. The
max is `window_max` from `max_floor` (NaN skipped, onnxruntime's rule for MaxPool): one
`maxps` per value on x86, the padding columns holding `max_floor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.dtype import itemsize as dtype_bytes
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Const,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    seq,
)
from kiln.kernels import conv as ck
from kiln.ops import nan_order, te
from kiln.ops.kernels.tiles import const as _c
from kiln.ops.kernels.tiles import lanes_loop, parallel_tiles, parallel_when
from kiln.ops.kernels.tiles import loop as _loop
from kiln.target.isa import ISA

Epilogue = Callable[[PrimExpr, tuple[PrimExpr, ...]], PrimExpr]
#: Vector operations per window value read (the "element" unit of
#: kiln.ops.kernels.parallel_work): its load and its max.
MAX_ELEMENTS = 2


def max_floor(dtype: str) -> PrimExpr:
    """Where a max pool's window starts and what its padding holds: the most negative
    finite value of a float `dtype` (onnxruntime's initial value, -3.4028235e38 for
    float32: a window of -inf, NaN and padding alone gives it), the smallest value of an
    integer one."""
    if not dt.is_float(dtype):
        return te.lowest_value(dtype)
    top = (2 - 2 ** -7) * 2.0 ** 127 if dtype == "bfloat16" else \
        float(np.finfo(dt.to_numpy(dtype)).max)
    return Const(-top, dtype)


def window_max(acc: PrimExpr, v: PrimExpr) -> PrimExpr:
    """A max pool's step: `v` where strictly greater than `acc` (a NaN `v` is skipped;
    from `max_floor`, `acc` is never NaN), onnxruntime's MaxPool rule
    (kiln.ops.nan_order.max_keep_first: one `maxps` on x86)."""
    return nan_order.max_keep_first(acc, v)


def max_chain(start: PrimExpr, values: Sequence[PrimExpr], name: str
              ) -> tuple[list[Stmt], PrimExpr]:
    """`window_max` folded over `values` from `start`: each step a let (its operand is
    read twice, so a nested expression would double with every value), the result."""
    lets: list[Stmt] = []
    acc = start
    for v in values:
        var = Var(name, v.dtype)
        lets.append(LetStmt(var, window_max(acc, v)))
        acc = var
    return lets, acc


def first_tap(o: PrimExpr, stride: int, pad: int, dilation: int) -> PrimExpr:
    """The input index of output `o`'s first window tap inside the input along one axis
    (every window has one: its pads are smaller than it)."""
    skipped = max_(as_expr(0, o.dtype), (pad - o * stride + (dilation - 1)) // dilation)
    return o * stride - pad + skipped * dilation


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


def staged_rows(shape: ck.ConvShape, dtype: str, short_phases: bool, l1d_bytes: int) -> int:
    """How many output rows' horizontal inputs (the vertical maxima at stride 1, their
    column phases at stride 2) a channel stages before its horizontal steps: all of them
    when they fit half the L1 (`l1d_bytes`), else one.

    The horizontal step reads the staged row at offsets 1, 2, ... of the vector stores
    that wrote it; straight after those stores each such load spans two of them, which
    the store buffer cannot forward, and waits for both to reach the cache. With every
    row staged first, the loads come long after the stores. Zen 3, one thread:
    512 x 14 x 14 3x3/1 0.110 -> 0.071 ms, 832 x 7 x 7 0.089 -> 0.044, 512 x 27 x 27
    3x3/2 0.094 -> 0.066, uint8 256 x 54 x 54 0.102 -> 0.066 (docs/performance.md,
    "Max pooling"). A byte pool's short phase rows (`short_phases`) ran slower staged
    (uint8 512 x 27 x 27 0.031 -> 0.043 ms) and stay one row at a time."""
    _, sw = shape.stride
    width = shape.pads[1] + shape.w + shape.pads[3]
    row_bytes = -(-width // sw) * sw * dtype_bytes(dtype)
    fits = shape.out_h * row_bytes <= l1d_bytes // 2
    return shape.out_h if fits and not short_phases else 1


def max_pool_body(shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int,
                  epilogue: Epilogue, l1d_bytes: int, scan: bool = False, *, isa: ISA) -> Stmt:
    """The loop nest of a max pool of `shape` (its pads already widened for
    `ceil_mode`) over `x` into `out`, each output stored through `epilogue`; `l1d_bytes`
    bounds the rows staged per channel (`staged_rows`). `scan`: onnxruntime's scan of
    each window from its first element inside the input (kiln.ops.pool's
    `scans_from_first`: NaN skipped from -inf, but a leading NaN stays)."""
    sh, sw = shape.stride
    dh, dw = shape.dilation
    top, left, _, right = shape.pads
    lowest = te.lowest_value(x.dtype) if scan else max_floor(x.dtype)
    width = left + shape.w + right
    phase_w = -(-width // sw)
    tile_w = 4 * lanes
    short_phases = sw > 1 and dtype_bytes(x.dtype) == 1 and 2 * shape.out_w < lanes
    staged = staged_rows(shape, x.dtype, short_phases, l1d_bytes)
    # the buffer the horizontal step reads holds `staged` rows: `row` at stride 1,
    # `phases` at stride 2 (each row's vertical maxima are split right after them)
    row = Buffer("maxrow", (staged if sw == 1 else 1, phase_w * sw), x.dtype, "local")
    phases = Buffer("maxphase", (staged, sw, phase_w), x.dtype, "local") if sw > 1 else None

    def slot(oh: PrimExpr) -> PrimExpr:
        return oh if staged > 1 else _c(0)

    def row_slot(oh: PrimExpr) -> PrimExpr:
        return slot(oh) if sw == 1 else _c(0)

    def vertical(n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]) -> Stmt:
        def tile(w0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                taps = [x[n, c, oh * sh + (kh * dh - top), w0 + r] for kh in inside]
                lets, value = max_chain(lowest, taps, "colmax")
                return seq(*lets, Store(row, value, (row_slot(oh), w0 + r + left)))
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.w, tile_w, lanes, tile)

    def split(oh: PrimExpr) -> Stmt:
        # a plain loop LLVM's and the C compiler's vectorizers turn into
        # loads and shuffles (an interleaved access group)
        assert phases is not None
        return _loop("q", phase_w, lambda q: seq(*(
            Store(phases, row[_c(0), q * sw + p], (slot(oh), _c(p), q)) for p in range(sw))))

    def horizontal(n: PrimExpr, c: PrimExpr, oh: PrimExpr) -> Stmt:
        def tile(ow0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                columns = [phases[slot(oh), _c(col % sw), ow0 + r + col // sw]
                           if phases is not None else row[slot(oh), ow0 + r + col]
                           for col in range(0, shape.kw * dw, dw)]
                # the vertical maxima are never NaN: the first column starts the max
                lets, value = max_chain(columns[0], columns[1:], "rowmax")
                if scan:
                    first = x[n, c, first_tap(oh, sh, top, dh), first_tap(ow0 + r, sw, left, dw)]
                    value = nan_order.with_leading_nan(first, value)
                idx = (n, c, oh, ow0 + r)
                return seq(*lets, Store(out, epilogue(value, idx), idx))
            if short_phases:
                return _loop("r", wd, lane)
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.out_w, tile_w, lanes, tile)

    def output_row(n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]) -> Stmt:
        parts = [vertical(n, c, oh, inside)]
        if phases is not None:
            parts.append(split(oh))
        if staged == 1:
            parts.append(horizontal(n, c, oh))
        return seq(*parts)

    def channel(n: PrimExpr, c: PrimExpr) -> Stmt:
        # the padding columns (and the phase split's tail) never change: written once
        columns = (*range(left), *range(left + shape.w, phase_w * sw))

        def ends(r: PrimExpr) -> Stmt:
            return seq(*(Store(row, lowest, (r, _c(i))) for i in columns))
        rows = row.shape[0]
        parts: list[Stmt] = [Allocate(row), *([Allocate(phases)] if phases else [])]
        if columns:
            parts.append(ends(_c(0)) if rows == 1 else _loop("r", rows, ends))
        for start, count, inside in row_runs(shape):
            if count == 1:
                parts.append(output_row(n, c, _c(start), inside))
            else:
                def run(t: PrimExpr, s: int = start, i: tuple[int, ...] = inside) -> Stmt:
                    return output_row(n, c, t + s, i)

                parts.append(_loop("oh", count, run))
        if staged > 1:
            parts.append(_loop("oh", shape.out_h, lambda oh: horizontal(n, c, oh)))
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

    return parallel_when(build, work * MAX_ELEMENTS, "element", x.dtype, isa=isa)
