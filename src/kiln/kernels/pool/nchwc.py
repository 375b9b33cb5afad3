"""The kernel of `pool2d_nchwc` (kiln.ops.pool_nchwc): a 2-D max or average pool of an
NCHW{b}c tensor, one vector of the block's `b` channel lanes per output position.

Each parallel task takes one output row of one channel block; a position's window
folds `kh x kw` vector loads into one vector accumulator (max, or a sum then divided
by the window's count, a compile-time table as for the NCHW kernel,
kiln.kernels.pool.window). No padded copy: the taps outside the input are left out (the
kernel rows by bounds computed once per output row, the kernel columns by bounds
computed per position in the row's border runs only; its interior positions run every
tap). A max over the taps left is the max over a window padded with the lowest value,
so both agree with the tensor-expression definition, whose sum order (row-major over
the window) the average keeps too. The max is MaxPool's rule (kiln.ops.pool:
`window_max` from `max_floor`, NaN skipped), one `maxps` per tap on x86: one vector
accumulator, no second one carrying a NaN tap to the store, no NaN-propagating max.
The generic lowering this replaces ran the window one element at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    Buffer,
    Const,
    LetStmt,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    reinterpret,
    seq,
)
from kiln.kernels.conv.bf16_words import zero_border
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.pool.window import PoolGeometry
from kiln.kernels.tiles import Epilogue, lanes_loop, loop, parallel_tiles, parallel_when
from kiln.ops import nan_order, te
from kiln.ops.pool import max_floor, window_max
from kiln.target.isa import ISA

#: The layout of the `bf16_words` a pool stores (kiln.ops.conv_bf16): the pads (top, left,
#: bottom, right) and whether the positions are one row (`flat`).
WordsLayout = tuple[tuple[int, int, int, int], bool]


def interior(out: int, stride: int, pad: int, k: int, dilation: int, size: int
             ) -> tuple[int, int]:
    """`(first, end)`: the output positions along one axis whose windows lie inside the
    input (every tap reads an input value); empty (`first == end`) when none do."""
    first = min(-(-pad // stride), out)
    last = (size - 1 + pad - (k - 1) * dilation) // stride  # may be below `first`
    return first, max(first, min(out, last + 1))


def _taps(start: PrimExpr, k: int, dilation: int, size: int) -> tuple[PrimExpr, PrimExpr]:
    """`(lo, hi)`: the taps `t` of a window starting at input index `start` (may be
    negative) with `0 <= start + t * dilation < size`."""
    lo = max_(as_expr(0, INDEX_DTYPE), (dilation - 1 - start) // dilation)
    hi = min_(as_expr(k, INDEX_DTYPE), (size - start + dilation - 1) // dilation)
    return lo, hi


def _load(x: Buffer, w: int, n: PrimExpr, k: int, c: PrimExpr, r: PrimExpr, q: PrimExpr,
          v: PrimExpr) -> PrimExpr:
    """Lane `v` of block `c` (its task's `k`-th) at `(r, q)` of the blocks `x`, or of
    their words of pairs (int32 `x`, `w` columns: block `2p` the low halves)."""
    if x.dtype != "int32":
        return x[n, c, r, q, v]
    word = x[n, c // 2, r * w + q, v]
    return reinterpret(word & Const(-0x10000, "int32") if k else word << Const(16, "int32"),
                       "float32")


def _sizes(geometry: PoolGeometry, x: Buffer, block: int) -> tuple[bool, tuple[Any, ...]]:
    """Whether the kernel of `x` is over run-time sizes (kiln.kernels.pool.lowering.
    run_time_pool: its input's shape holds them), and its (channel blocks, height, width,
    output height, output width): the input's (the output as large), else `geometry`'s."""
    if len(x.shape) == 5 and not isinstance(x.shape[2], int):
        blocks, h, w = x.shape[1:4]
        return True, (blocks, h, w, h, w)
    return False, (geometry.shape[1] // block, *geometry.shape[2:], *geometry.out)


def _column_runs(geometry: PoolGeometry, out_w: Any, w: Any, run_time: bool,
                 border: Callable[[PrimExpr], Stmt], inside: Callable[[PrimExpr], Stmt]
                 ) -> list[Stmt]:
    """The loops over one output row of `out_w` positions (an input row of `w`): the left
    border's positions (`border`: their kernel columns bounded), the interior's
    (`inside`: every column), the right border's. Over a run-time width (`run_time`: an
    output as wide as the input) the interior ends the right pad's columns before the
    row's end."""
    left, right = geometry.begins[1], geometry.ends[1]
    if run_time:
        first, end = left, w - right
        inner = w - left - right
    else:
        first, end = interior(out_w, geometry.strides[1], left, geometry.kernel[1],
                              geometry.dilations[1], w)
        right, inner = out_w - end, end - first
    runs: list[Stmt] = []
    if first:
        runs.append(loop("ow", first, border))
    if run_time or inner > 0:
        runs.append(loop("ow", inner, inside, start=first))
    if right:
        runs.append(loop("ow", right, border, start=end))
    return runs


def pool_nchwc_body(kind: str, geometry: PoolGeometry, include_pad: bool, x: Buffer,
                    out: Buffer, epilogue: Epilogue, scan: bool = False, *, isa: ISA,
                    words: WordsLayout | None = None) -> Stmt:
    """The loop nest of a `kind` ("max" or "avg") pool of the NCHW{b}c `x` into `out`,
    `epilogue(value, index)` applied as each output lane is stored. `geometry` is the
    window on the channel-merged NCHW input (kiln.ops.pool_nchwc). `scan`: a max scanned
    from each window's first element inside the input (kiln.ops.pool's
    `scans_from_first`: from -inf, a leading NaN kept). With `words` (the readers'
    `bf16_words` layout, kiln.transform.bf16_words) `out` is those words: a task takes a
    pair of blocks, and lane `v` of both blocks' results is rounded into one word. An
    int32 `x` is words of pairs of blocks `[N][C/2b][H * W][b]` (`_load`): a task then
    takes a pair of blocks (kiln.transform.bf16_pool_words). A float32 `x` over run-time
    channel blocks, height and width (kiln.kernels.pool.lowering.run_time_pool: a max
    pool at stride 1 whose output is as large as its input) takes them from its shape:
    `out` is over the same, `geometry` is one call's (its window, pads and scan)."""
    # the batch may be symbolic: the outer loop's extent, the rest planned as pinned
    batch = x.shape[0] if not isinstance(x.shape[0], int) else int(x.shape[0])
    block = int(x.shape[-1])
    run_time, (blocks, h, w, out_h, out_w) = _sizes(geometry, x, block)
    (kh, kw), (sh, sw), (dh, dw) = geometry.kernel, geometry.strides, geometry.dilations
    top, left = geometry.begins
    dtype = "float32" if x.dtype == "int32" else x.dtype
    start: PrimExpr = as_expr(0.0, dtype) if kind != "max" else \
        te.lowest_value(dtype) if scan else max_floor(dtype)
    counts = Buffer("window_count", (out_h, out_w), "float32")

    def fold(acc: PrimExpr, value: PrimExpr) -> PrimExpr:
        return window_max(acc, value) if kind == "max" else acc + value

    # each task's channel blocks: one, or a pair of them when storing or reading words
    group = 1 if words is None and x.dtype != "int32" else 2

    def row(n: PrimExpr, pair: PrimExpr, oh: PrimExpr) -> Stmt:
        r0 = Var("r0", INDEX_DTYPE)
        kh_lo, kh_hi = Var("kh_lo", INDEX_DTYPE), Var("kh_hi", INDEX_DTYPE)
        lo, hi = _taps(r0, kh, dh, h)

        def channel(k: int) -> PrimExpr:  # the k-th block of the task
            return pair if group == 1 else pair * group + k

        def position(ow: PrimExpr, cols: tuple[PrimExpr, PrimExpr] | None) -> Stmt:
            q0 = ow * sw - left
            accs = [Buffer("acc", (block,), dtype, "local") for _ in range(group)]

            def taps(i: PrimExpr) -> Stmt:
                def lane(j: PrimExpr, v: PrimExpr) -> Stmt:
                    return seq(*(Store(acc, fold(acc[v], _load(
                        x, w, n, k, channel(k), r0 + i * dh, q0 + j * dw, v)), (v,))
                        for k, acc in enumerate(accs)))

                def tap(j: PrimExpr) -> Stmt:
                    return lanes_loop("v", block, lambda v: lane(j, v))

                if cols is None:  # an interior position: every kernel column
                    return loop("kw", kw, tap)
                return loop("kw", cols[1] - cols[0], tap, start=cols[0])

            def result(k: int, v: PrimExpr) -> PrimExpr:
                c, acc = channel(k), accs[k]
                idx = (n, c, oh, ow, v)
                value = acc[v] if kind == "max" else acc[v] / counts[oh, ow]
                if scan:  # the window's first tap: kh_lo, and its first column
                    q = q0 + (cols[0] if cols else 0) * dw
                    first = _load(x, w, n, k, c, r0 + kh_lo * dh, q, v)
                    value = nan_order.with_leading_nan(first, value)
                return epilogue(value, idx)

            def store(v: PrimExpr) -> Stmt:
                if words is None:
                    return seq(*(Store(out, result(k, v), (n, channel(k), oh, ow, v))
                                 for k in range(group)))
                pads, flat = words
                at = (n, pair, oh * out_w + ow) if flat else (n, pair, oh + pads[0],
                                                              ow + pads[1])
                return Store(out, bf16_word(result(0, v), result(1, v)), (*at, v))

            def init(acc: Buffer) -> Stmt:
                return lanes_loop("v", block, lambda v: Store(acc, start, (v,)))

            return seq(*map(Allocate, accs), *map(init, accs),
                       loop("kh", kh_hi - kh_lo, taps, start=kh_lo),
                       lanes_loop("v", block, store))

        def border(ow: PrimExpr) -> Stmt:
            return position(ow, _taps(ow * sw - left, kw, dw, w))

        runs = _column_runs(geometry, out_w, w, run_time, border,
                            lambda ow: position(ow, None))
        return seq(LetStmt(r0, oh * sh - top), LetStmt(kh_lo, lo), LetStmt(kh_hi, hi), *runs)

    if run_time:  # a kernel for layers of every size: its tiles split over the threads
        nest = parallel_tiles((batch, blocks, out_h), row)
    else:
        nest = parallel_when(lambda: parallel_tiles((batch, blocks // group, out_h), row),
                             batch * blocks * out_h * out_w * block * kh * kw, "element",
                             isa=isa)
    border = [] if words is None else zero_border(out, words[0])
    if kind == "max":
        return seq(*border, nest)
    return seq(*border, AllocConst(counts, geometry.counts(include_pad)), nest)
