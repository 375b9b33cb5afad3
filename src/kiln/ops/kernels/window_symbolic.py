"""The per-channel window kernel over an image of symbolic height and width: depthwise
convolutions (kiln.ops.kernels.conv_depthwise) and max pools (kiln.ops.pool_kernels)
whose image size is known at run time only.

The static kernels (kiln.ops.conv_kernels.window_body, kiln.ops.max_pool_kernel) plan
their row tiles, padded copies and border runs from the image size at compile time.
Here the split is computed at run time instead, from the size's expressions: each
channel's output rows fall into the rows whose window lies inside the image (the
interior: no checks) and the border rows before and after them, and each row's columns
likewise. Interior columns run in tiles of one vector (`lanes`) read straight from
the input (contiguous at stride 1); border columns and the interior's remainder one by
one, in one loop (the code holds the window four times: checked or not, rows and
columns, to keep a kernel's compile time near the static one's). A tap outside the image
reads its row and column clamped into it and takes `pad` instead of the value read (0
for a convolution, the lowest value for a max: what the padded input of the generic
definition holds), so every read stays inside the input.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    compare,
    max_,
    min_,
    select,
    seq,
)
from kiln.ops import conv_kernels as ck
from kiln.ops.kernels.tiles import (
    Epilogue,
    bound,
    lanes_loop,
    loop,
    parallel_tiles,
    parallel_when,
)

#: (accumulator, input value, channel, kh, kw) -> accumulator: one tap of the window.
Tap = Callable[[PrimExpr, PrimExpr, PrimExpr, int, int], PrimExpr]


def _inside_from(pad: int, stride: int) -> int:
    """The first output whose window starts inside the image (`o * stride >= pad`)."""
    return -(-pad // stride)


def symbolic_window_body(shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int, tap: Tap,
                         pad: PrimExpr, init: PrimExpr, epilogue: Epilogue,
                         work_per_tap: int = 1) -> Stmt:
    """The loop nest of a per-channel window op of `shape` (`c_in == c_out` channels,
    `x` and `out` NCHW): each output is `init` combined by `tap` over its window, taps
    in the padding reading `pad`, then stored through `epilogue` (module docstring).
    `work_per_tap`: the operations a tap costs (the parallel threshold's unit)."""
    sh, sw = shape.stride
    dh, dw = shape.dilation
    top, left = shape.pads[0], shape.pads[1]
    out_h, out_w = shape.out_h, shape.out_w
    # one vector per tile: a row's interior is any width at run time (a 56-wide row
    # left to the checked loop by 64-wide tiles ran 20x slower than the static kernel)
    tile_w = lanes

    def inside(first: int, pad_lo: int, stride: int, dil: int, k: int, size: int,
               count: int) -> tuple[PrimExpr, PrimExpr]:
        """[lo, hi): the outputs whose whole window lies inside `size`."""
        lo = min_(first, count)
        last = (size - 1 + pad_lo - dil * (k - 1)) // stride  # floor: may be negative
        return lo, max_(lo, min_(count, last + 1))

    def output_row(n: PrimExpr, c: PrimExpr, oh: PrimExpr, rows_checked: bool,
                   col_lo: int, col_hi: int, h: int, w: int, out_w: int) -> Stmt:
        lets: list[Stmt] = []
        rows: list[tuple[PrimExpr, PrimExpr | None]] = []
        for kh in range(shape.kh):
            ih = oh * sh + (kh * dh - top)
            r = Var(f"ih{kh}", INDEX_DTYPE)
            if rows_checked:
                raw = Var(f"row{kh}", INDEX_DTYPE)
                lets += [LetStmt(raw, ih), LetStmt(r, min_(max_(raw, 0), h - 1))]
                rows.append((r, (raw >= 0) & (raw < h)))
            else:
                lets.append(LetStmt(r, ih))
                rows.append((r, None))

        def window(ow: PrimExpr, cols_checked: bool) -> PrimExpr:
            acc = init
            for kh, (r, row_ok) in enumerate(rows):
                for kw in range(shape.kw):
                    iw = ow * sw + (kw * dw - left)
                    ok = row_ok
                    if cols_checked:
                        col_ok = (iw >= 0) & (iw < w)
                        ok = col_ok if ok is None else ok & col_ok
                        iw = min_(max_(iw, 0), w - 1)
                    v = x[n, c, r, iw]
                    acc = tap(acc, v if ok is None else select(ok, v, pad), c, kh, kw)
            return acc

        def store(value: PrimExpr, ow: PrimExpr) -> Stmt:
            idx = (n, c, oh, ow)
            return Store(out, epilogue(value, idx), idx)

        tiles = bound("tiles", (col_hi - col_lo) // tile_w, lets)
        rest = bound("rest", col_lo + tiles * tile_w, lets)
        # the interior's last columns (fewer than a vector): one vector computed over the
        # vector's worth of columns ending at `col_hi` into `stage`, its upper lanes stored
        # one by one (each output stored, and its epilogue's operands read, once)
        stage = Buffer("stage", (tile_w,), out.dtype, "local")
        tail = col_hi - rest
        shifted = seq(Allocate(stage),
                      lanes_loop("r", tile_w, lambda r: Store(
                          stage, window(col_hi - tile_w + r, False), (r,))),
                      loop("v", tail, lambda v: store(stage[v + (tile_w - tail)], rest + v)))
        # the border columns (and, with no whole vector inside, the interior): one
        # checked loop over both ends, so the code holds the window three times a row
        after = bound("after", select(compare("gt", tiles, 0), col_hi, col_lo), lets)

        def checked(j: PrimExpr) -> Stmt:
            ow = Var("ow", INDEX_DTYPE)
            return seq(LetStmt(ow, select(j < col_lo, j, j + (after - col_lo))),
                       store(window(ow, True), ow))

        return seq(*lets,
                   loop("owt", tiles, lambda t: lanes_loop(
                       "r", tile_w, lambda r: store(window(col_lo + t * tile_w + r, False),
                                                    col_lo + t * tile_w + r))),
                   IfThenElse(compare("gt", tiles, 0) & compare("gt", tail, 0), shifted),
                   loop("j", col_lo + out_w - after, checked))

    def channel(n: PrimExpr, c: PrimExpr) -> Stmt:
        # the run-time split, each bound once per channel (lets, not rebuilt expressions)
        lets: list[Stmt] = []
        sizes = [bound(name, d, lets) for name, d in
                 (("height", shape.h), ("width", shape.w), ("out_h", out_h),
                  ("out_w", out_w))]
        hb, wb, ohb, owb = sizes
        row_lo, row_hi = (bound(name, d, lets) for name, d in zip(
            ("row_lo", "row_hi"), inside(_inside_from(top, sh), top, sh, dh, shape.kh, hb,
                                         ohb)))
        col_lo, col_hi = (bound(name, d, lets) for name, d in zip(
            ("col_lo", "col_hi"), inside(_inside_from(left, sw), left, sw, dw, shape.kw, wb,
                                         owb)))

        def row(checked: bool) -> Callable[[PrimExpr], Stmt]:
            return lambda oh: output_row(n, c, oh, checked, col_lo, col_hi, hb, wb, owb)

        return seq(*lets, loop("oh", ohb, lambda oh: IfThenElse(
            (oh >= row_lo) & (oh < row_hi), row(False)(oh), row(True)(oh))))

    work = shape.n * shape.c_in * out_h * out_w * shape.kh * shape.kw * work_per_tap
    return parallel_when(lambda: parallel_tiles((shape.n, shape.c_in), channel), work,
                         "element", x.dtype)
