"""The per-channel window kernel over an image of symbolic height and width: depthwise
convolutions (kiln.kernels.conv.depthwise), max and average pools
(kiln.kernels.pool.window) whose image size is known at run time only.

The static kernels (kiln.kernels.conv.window.window_body, kiln.kernels.pool.max_rows) plan
their row tiles, padded copies and border runs from the image size at compile time.
Here each channel (one parallel tile) first copies its plane into a workspace plane
bordered by the window's pads, filled with `pad` (0 for a convolution, the lowest
value for a max: what the generic definition's padded input holds); the plane is
then in L1 or L2 for the windows, which read it without a check. An output row runs
in vectors of `lanes` columns (contiguous loads at stride 1), its last columns as one
vector ending at the row's end whose upper lanes are stored one by one (each output
stored once: an epilogue reading the output's own memory reads it once); a row
narrower than a vector column by column. Only the copy depends on where the image
ends: the copy costs about one more read of the input, where a border check per
tap would cost several times the static kernel's time.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    PrimExpr,
    Stmt,
    Store,
    Var,
    compare,
    seq,
)
from kiln.kernels.tiles import (
    Epilogue,
    bound,
    const,
    lanes_loop,
    loop,
    parallel_tiles,
    parallel_when,
)
from kiln.ops import conv_geometry as ck
from kiln.target.isa import ISA

#: (accumulator, input value, channel, kh, kw) -> accumulator: one tap of the window.
Tap = Callable[[PrimExpr, PrimExpr, PrimExpr, int, int], PrimExpr]


def symbolic_window_body(shape: ck.ConvShape, x: Buffer, out: Buffer, lanes: int, tap: Tap,
                         pad: PrimExpr, init: PrimExpr, epilogue: Epilogue,
                         work_per_tap: int = 1, *, isa: ISA) -> Stmt:
    """The loop nest of a per-channel window op of `shape` (`c_in == c_out` channels,
    `x` and `out` NCHW): each output is `init` combined by `tap` over its window, taps
    in the padding reading `pad`, then stored through `epilogue` (module docstring).
    `work_per_tap`: the operations a tap costs (the parallel threshold's unit)."""
    sh, sw = shape.stride
    dh, dw = shape.dilation
    top, left, bottom, right = shape.pads
    out_h, out_w = shape.out_h, shape.out_w
    planes = shape.n * shape.c_in
    # the padded plane split by column phase (column j at [j % sw][j // sw]), so that at
    # stride 2 a window column of consecutive outputs is again contiguous
    width = shape.w + left + right
    phase_w = (width + sw - 1) // sw
    # one plane per channel, allocated in the channel's parallel tile: a small block the
    # allocator reuses, in L1/L2 while the windows read it (not a workspace for every
    # channel at once, whose pages would fault in anew on every call)
    padded = Buffer("padded", (shape.h + top + bottom, sw, phase_w), x.dtype)

    def channel(n: PrimExpr, c: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        h, w = bound("height", shape.h, lets), bound("width", shape.w, lets)
        oh_n, ow_n = bound("out_h", out_h, lets), bound("out_w", out_w, lets)
        qn = bound("phase_w", phase_w, lets)
        # per phase, the columns holding the image: from a static first one to `ends[p]`
        starts = [-(-(left - p) // sw) for p in range(sw)]
        ends = [bound(f"inside{p}", (left + w - 1 - p) // sw + 1, lets) for p in range(sw)]

        def fill(r: PrimExpr) -> Stmt:
            # a padded row, phase by phase: the left pad's columns, the image's (read
            # every `sw`-th column), the right pad's (or padding only above and below)
            def pads(p: int, start: int | PrimExpr, count: int | PrimExpr) -> Stmt:
                return loop("q", count, lambda q: Store(padded, pad, (r, const(p), start + q)))

            def image(p: int) -> Stmt:
                q0 = starts[p]

                def copy(q: Var) -> Stmt:
                    return Store(padded, x[n, c, r - top, (q0 + q) * sw + (p - left)],
                                 (r, const(p), q0 + q))

                return seq(*([pads(p, 0, q0)] if q0 > 0 else []),
                           loop("q", ends[p] - q0, copy), pads(p, ends[p], qn - ends[p]))

            inside = seq(*(image(p) for p in range(sw)))
            if not top and not bottom:
                return inside
            all_pad = seq(*(pads(p, 0, qn) for p in range(sw)))
            return IfThenElse(compare("ge", r, top) & compare("lt", r, top + h), inside,
                              all_pad)

        def output_row(oh: PrimExpr) -> Stmt:
            def window(ow: PrimExpr) -> PrimExpr:
                acc = init
                for kh in range(shape.kh):
                    for kw in range(shape.kw):
                        col = kw * dw
                        v = padded[oh * sh + kh * dh, const(col % sw), ow + col // sw]
                        acc = tap(acc, v, c, kh, kw)
                return acc

            def store(value: PrimExpr, ow: PrimExpr) -> Stmt:
                idx = (n, c, oh, ow)
                return Store(out, epilogue(value, idx), idx)

            row_lets: list[Stmt] = []
            tiles = bound("tiles", ow_n // lanes, row_lets)
            tail = bound("tail", ow_n - tiles * lanes, row_lets)
            stage = Buffer("stage", (lanes,), out.dtype, "local")
            # the last columns: one vector ending at the row's end, its upper lanes stored
            shifted = seq(Allocate(stage),
                          lanes_loop("r", lanes, lambda r: Store(
                              stage, window(ow_n - lanes + r), (r,))),
                          loop("v", tail, lambda v: store(stage[v + (lanes - tail)],
                                                          tiles * lanes + v)))
            narrow = loop("ow", ow_n, lambda ow: store(window(ow), ow))
            return seq(*row_lets,
                       loop("owt", tiles, lambda t: lanes_loop(
                           "r", lanes, lambda r: store(window(t * lanes + r), t * lanes + r))),
                       IfThenElse(compare("gt", tiles, 0),
                                  IfThenElse(compare("gt", tail, 0), shifted), narrow))

        return seq(*lets, Allocate(padded), loop("r", h + top + bottom, fill),
                   loop("oh", oh_n, output_row))

    work = planes * out_h * out_w * shape.kh * shape.kw * work_per_tap
    return parallel_when(lambda: parallel_tiles((shape.n, shape.c_in), channel), work,
                         "element", x.dtype, isa=isa)
