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
kiln.kernels.parallel_work.

The row loops are vector loops of the ISA's lanes (32 bytes of an int8/uint8 pool with
AVX2: kiln.ir.analysis.vector_loops), except the horizontal step of a byte pool whose
output row is shorter than half a register: its pieces of 8, 4 and 1 bytes would read
the phase row one byte apart from registers LLVM spills, each reload waiting for the
spilled stores it spans, so that loop stays a plain loop for LLVM.

Max is exact, so the result equals the tensor-expression definition bit for bit. The
max is `window_max` from `max_floor` (NaN skipped, onnxruntime's rule for MaxPool): one
`maxps` per value on x86, the padding columns holding `max_floor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.ir.dtype import itemsize as dtype_bytes
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.kernels import conv as ck
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import lanes_loop, parallel_tiles, parallel_when
from kiln.kernels.tiles import loop as _loop
from kiln.ops import nan_order, te
from kiln.ops.pool import first_tap, max_floor, window_max
from kiln.target.isa import ISA

Epilogue = Callable[[PrimExpr, tuple[PrimExpr, ...]], PrimExpr]
#: Vector operations per window value read (the "element" unit of
#: kiln.kernels.parallel_work): its load and its max.
MAX_ELEMENTS = 2


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
    row staged first, the loads come long after the stores (docs/performance.md, "Max
    pooling"). A byte pool's short phase rows (`short_phases`) stay one row at a time:
    staging them does not pay."""
    _, sw = shape.stride
    width = shape.pads[1] + shape.w + shape.pads[3]
    row_bytes = -(-width // sw) * sw * dtype_bytes(dtype)
    fits = shape.out_h * row_bytes <= l1d_bytes // 2
    return shape.out_h if fits and not short_phases else 1


@dataclass(frozen=True)
class MaxPoolRows:
    """The loop nest of one max pool (`max_pool_body`): the choices made for its `shape`
    (its pads already widened for `ceil_mode`) and the steps of one channel over `x`
    into `out`, each output stored through `epilogue`. `scan`: onnxruntime's scan of
    each window from its first element inside the input (kiln.ops.pool's
    `scans_from_first`: NaN skipped from -inf, but a leading NaN stays)."""

    shape: ck.ConvShape
    x: Buffer
    out: Buffer
    lanes: int
    epilogue: Epilogue
    scan: bool
    #: Where each window starts and what the padding columns hold.
    lowest: PrimExpr
    #: A byte pool whose output row is shorter than half a register: its horizontal
    #: step is a plain loop (see the module docstring).
    short_phases: bool
    #: Output rows whose horizontal inputs a channel stages (`staged_rows`).
    staged: int
    #: The buffer the horizontal step reads at stride 1 (`staged` rows), and the
    #: vertical maxima of one row at stride 2 (split into `phases` right after them).
    row: Buffer
    phases: Buffer | None

    @classmethod
    def plan(cls, shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int,
             epilogue: Epilogue, l1d_bytes: int, scan: bool) -> MaxPoolRows:
        """The choices for `shape`; `l1d_bytes` bounds the rows staged per channel."""
        sw = shape.stride[1]
        lowest = te.lowest_value(x.dtype) if scan else max_floor(x.dtype)
        phase_w = _phase_width(shape)
        short_phases = sw > 1 and dtype_bytes(x.dtype) == 1 and 2 * shape.out_w < lanes
        staged = staged_rows(shape, x.dtype, short_phases, l1d_bytes)
        row = Buffer("maxrow", (staged if sw == 1 else 1, phase_w * sw), x.dtype, "local")
        phases = Buffer("maxphase", (staged, sw, phase_w), x.dtype, "local") if sw > 1 \
            else None
        return cls(shape, x, out, lanes, epilogue, scan, lowest, short_phases, staged, row,
                   phases)

    @property
    def phase_w(self) -> int:
        return _phase_width(self.shape)

    @property
    def tile_w(self) -> int:
        """The columns of one tile of a row step (four vectors)."""
        return 4 * self.lanes

    def slot(self, oh: PrimExpr) -> PrimExpr:
        """Output row `oh`'s row of the staged buffers."""
        return oh if self.staged > 1 else _c(0)

    def row_slot(self, oh: PrimExpr) -> PrimExpr:
        """Output row `oh`'s row of `row` (one row at stride 2: split right away)."""
        return self.slot(oh) if self.shape.stride[1] == 1 else _c(0)

    def vertical(self, n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]
                 ) -> Stmt:
        """The max of output row `oh`'s window rows `inside` the input, into `row`."""
        shape, x, row = self.shape, self.x, self.row
        sh, dh, top, left = shape.stride[0], shape.dilation[0], shape.pads[0], shape.pads[1]

        def tile(w0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                taps = [x[n, c, oh * sh + (kh * dh - top), w0 + r] for kh in inside]
                lets, value = max_chain(self.lowest, taps, "colmax")
                return seq(*lets, Store(row, value, (self.row_slot(oh), w0 + r + left)))
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.w, self.tile_w, self.lanes, tile)

    def split(self, oh: PrimExpr) -> Stmt:
        """`row` split by column phase into `phases` (stride 2)."""
        # a plain loop LLVM's and the C compiler's vectorizers turn into
        # loads and shuffles (an interleaved access group)
        phases, row, sw = self.phases, self.row, self.shape.stride[1]
        assert phases is not None
        return _loop("q", self.phase_w, lambda q: seq(*(
            Store(phases, row[_c(0), q * sw + p], (self.slot(oh), _c(p), q))
            for p in range(sw))))

    def horizontal(self, n: PrimExpr, c: PrimExpr, oh: PrimExpr) -> Stmt:
        """The max over the window's columns of the staged row: output row `oh`."""
        shape, phases, row = self.shape, self.phases, self.row
        (sh, sw), (dh, dw) = shape.stride, shape.dilation
        top, left = shape.pads[0], shape.pads[1]

        def tile(ow0: PrimExpr, wd: int) -> Stmt:
            def lane(r: PrimExpr) -> Stmt:
                columns = [phases[self.slot(oh), _c(col % sw), ow0 + r + col // sw]
                           if phases is not None else row[self.slot(oh), ow0 + r + col]
                           for col in range(0, shape.kw * dw, dw)]
                # the vertical maxima are never NaN: the first column starts the max
                lets, value = max_chain(columns[0], columns[1:], "rowmax")
                if self.scan:
                    first = self.x[n, c, first_tap(oh, sh, top, dh),
                                   first_tap(ow0 + r, sw, left, dw)]
                    value = nan_order.with_leading_nan(first, value)
                idx = (n, c, oh, ow0 + r)
                return seq(*lets, Store(self.out, self.epilogue(value, idx), idx))
            if self.short_phases:
                return _loop("r", wd, lane)
            return lanes_loop("r", wd, lane)
        return ck.tiled_row(shape.out_w, self.tile_w, self.lanes, tile)

    def output_row(self, n: PrimExpr, c: PrimExpr, oh: PrimExpr, inside: tuple[int, ...]
                   ) -> Stmt:
        """Output row `oh`'s vertical step (and its split), and its horizontal step unless
        the channel stages its rows."""
        parts = [self.vertical(n, c, oh, inside)]
        if self.phases is not None:
            parts.append(self.split(oh))
        if self.staged == 1:
            parts.append(self.horizontal(n, c, oh))
        return seq(*parts)

    def channel(self, n: PrimExpr, c: PrimExpr) -> Stmt:
        """Every output row of channel `c` of image `n`."""
        shape, row, phases = self.shape, self.row, self.phases
        left = shape.pads[1]
        # the padding columns (and the phase split's tail) never change: written once
        columns = (*range(left), *range(left + shape.w, self.phase_w * shape.stride[1]))

        def ends(r: PrimExpr) -> Stmt:
            return seq(*(Store(row, self.lowest, (r, _c(i))) for i in columns))
        rows = row.shape[0]
        parts: list[Stmt] = [Allocate(row), *([Allocate(phases)] if phases else [])]
        if columns:
            parts.append(ends(_c(0)) if rows == 1 else _loop("r", rows, ends))
        for start, count, inside in row_runs(shape):
            if count == 1:
                parts.append(self.output_row(n, c, _c(start), inside))
            else:
                def run(t: PrimExpr, s: int = start, i: tuple[int, ...] = inside) -> Stmt:
                    return self.output_row(n, c, t + s, i)

                parts.append(_loop("oh", count, run))
        if self.staged > 1:
            parts.append(_loop("oh", shape.out_h, lambda oh: self.horizontal(n, c, oh)))
        return seq(*parts)


def _phase_width(shape: ck.ConvShape) -> int:
    """The columns of one column phase of the padded input row."""
    return -(-(shape.pads[1] + shape.w + shape.pads[3]) // shape.stride[1])


def max_pool_body(shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int,
                  epilogue: Epilogue, l1d_bytes: int, scan: bool = False, *, isa: ISA) -> Stmt:
    """The loop nest of a max pool of `shape` (its pads already widened for
    `ceil_mode`) over `x` into `out`, each output stored through `epilogue`; `l1d_bytes`
    bounds the rows staged per channel (`staged_rows`). `scan`: onnxruntime's scan of
    each window from its first element inside the input (kiln.ops.pool's
    `scans_from_first`: NaN skipped from -inf, but a leading NaN stays)."""
    # Every channel writes its own output plane: one loop over (image, channel), parallel
    # when its work reaches the threshold of kiln.kernels.parallel_work, like every
    # kernel family's (`parallelize`'s estimate in expression nodes would split even the
    # smallest pools).
    work = shape.n * shape.c_in * shape.out_h * (shape.kh * shape.w + shape.kw * shape.out_w)

    def build() -> Stmt:  # planned per build: each copy allocates its own row buffers
        rows = MaxPoolRows.plan(shape, x, out, lanes, epilogue, l1d_bytes, scan)
        if shape.n == 1:  # the channel is the loop's index (no remainder to take)
            return parallel_tiles((shape.c_in,), lambda c: rows.channel(_c(0), c))
        return parallel_tiles((shape.n, shape.c_in), rows.channel)

    return parallel_when(build, work * MAX_ELEMENTS, "element", x.dtype, isa=isa)
