"""The zero-padded input of the float32 convolution kernels.

Padding is applied once, outside the inner loops: the input is copied into a
zero-bordered workspace (`padded_input`; split by column phase for a strided kernel,
`plane_fill` one channel at a time; NCHW{b}c: `padded_blocked_input`) and the inner
loops read it without bounds checks. A tile's sums leave out the kernel rows that only
read the border (`image_rows`, `kernel_taps`).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

from kiln.errors import IRError
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import lanes_loop
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops.conv_geometry import ConvShape

#: A reader of the padded input: `(n, c, padded row, column phase, column within the
#: phase) -> value` (`padded_input`).
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
    # a run-time count (kiln.kernels.conv.run_time_width) is the input's blocks
    cblocks = -(-shape.c_in // block) if isinstance(shape.c_in, int) else x.shape[1]
    xp = Buffer("xpad", (shape.n, cblocks, hp, wp, block), x.dtype)
    zero = as_expr(0.0, x.dtype)

    h, w = shape.h, shape.w  # run-time values where the kernel takes them (RunTimeTiles)

    def fill(n: PrimExpr, cb: PrimExpr) -> Stmt:
        def rect(rows: tuple[Any, Any], cols: tuple[Any, Any],
                 value: Callable[[PrimExpr, PrimExpr, PrimExpr], PrimExpr]) -> list[Stmt]:
            """The statements writing `value` over rows and columns (first, count)."""
            if any(isinstance(c, int) and c <= 0 for c in (rows[1], cols[1])):
                return []
            return [_loop("i", rows[1], lambda i: _loop(
                "q", cols[1], lambda q: lanes_loop("v", block, lambda v: Store(
                    xp, value(i, q, v), (n, cb, i, q, v))), start=cols[0]), start=rows[0])]

        def zeros(i: PrimExpr, q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return zero

        def image(i: PrimExpr, q: PrimExpr, v: PrimExpr) -> PrimExpr:
            return x[n, cb, i - top, q - left, v]

        return seq(*rect((0, top), (0, wp), zeros), *rect((top + h, bottom), (0, wp), zeros),
                   *rect((top, h), (0, left), zeros), *rect((top, h), (left + w, right), zeros),
                   *rect((top, h), (left, w), image))

    return xp, [Allocate(xp), _nest(("n", "c"), (shape.n, cblocks), fill)]
