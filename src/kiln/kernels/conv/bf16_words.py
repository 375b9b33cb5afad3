"""The stores of a bfloat16 NCHWc convolution whose output is its consumers' words
(`bf16_words`, kiln.ops.conv_bf16; chosen by kiln.transform.bf16_words).

A tile's outputs go through the fused epilogue in float32 as the float32 stores'
(kiln.kernels.conv.blocked.blocked_tile_stores), then lane `v` of output blocks `2p` and
`2p + 1` is rounded into one int32 word (`bf16_pair`: `vcvtne2ps2bf16` on AVX512-BF16,
round to nearest, ties to even, as the consumer's own conversion would) stored at
`[n][p][row + top][col + left][v]` of the consumer's padded workspace. The border's
words of zeros are written before the tiles, a few rows and columns per pair of blocks.
Words of half blocks (`half_words`: a reader of an odd count of blocks, kiln.ops.conv_bf16)
pair lanes `v` and `v + b / 2` of each output block instead, rows of `b / 2` words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kiln.ir.tensor import Allocate, Buffer, IfThenElse, PrimExpr, Stmt, Store, as_expr, seq
from kiln.kernels.epilogue import FusedStore, fused_store
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.tiles import Epilogue, lanes_loop
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops import te
from kiln.ops.conv_bf16 import WordsSource, words_shape, words_source
from kiln.ops.conv_geometry import ConvShape


@dataclass(frozen=True)
class WordsOutput:
    """Where a kernel fused up to `result` stores: `store` its buffers and epilogue, `out`
    its output buffer, `source` what the words round when the output is its consumers'
    bfloat16 words (`out` then int32 words of `words_shape`), else None."""

    store: FusedStore
    out: Buffer
    source: WordsSource | None


def words_output(params: Sequence[te.Tensor], anchor: te.Tensor | None,
                 result: te.Tensor | None, shape: tuple[int, ...]) -> WordsOutput | None:
    """The store of a kernel over `params` computing `result` from `anchor` (of float32
    NCHW{b}c `shape`): where `result` is a `bf16_words` compute (kiln.transform.bf16_words)
    the epilogue ends at the tensor it rounds and the output is the words. None where the
    epilogue cannot be inlined (`fused_store`)."""
    source = words_source(result) if result is not None else None
    if source is not None:
        result = None if source.tensor is anchor else source.tensor
    store = fused_store(params, anchor, result, shape)
    if store is None:
        return None
    out = store.out if source is None else Buffer(
        "out", words_shape(shape, source.pads, source.flat, source.half), "int32")
    return WordsOutput(store, out, source)


def stored_words(x: Buffer, shape: ConvShape) -> tuple[Buffer, ConvShape]:
    """The words `x` a layer of `shape` reads as its workspace (its producer stored them
    under its pads), and the geometry its sums read them with: unpadded."""
    top, left, bottom, right = shape.pads
    return x, replace(shape, h=shape.h + top + bottom, w=shape.w + left + right,
                      pads=(0, 0, 0, 0))


def word_tile_stores(out: Buffer, stage: Buffer, epilogue: Epilogue, n: PrimExpr,
                     ob: PrimExpr, rows: list[PrimExpr], cols: list[PrimExpr],
                     real: list[PrimExpr | None], block: int,
                     pads: tuple[int, int, int, int], width: int) -> list[Stmt]:
    """The stores of a tile of `len(rows)` positions x `cb` output channels (channel tile
    `ob`; `cb` a multiple of two blocks), staged in `stage`, as words into `out`
    (`[n][P][rows][cols][block]`, the border `pads` wide, or `[n][P][positions][block]`
    over rows of `width` positions): one vector of `block` words
    per position and pair of blocks (of `block // 2` words per block where `out`'s rows
    are half blocks: `cb` then any multiple of `block`); a pair past `out`'s is not
    stored, nor a slot whose `real` condition (None: always real) is false."""
    lanes = int(out.shape[-1])
    half = lanes < block
    subs = int(stage.shape[1]) // (block if half else 2 * block)
    pairs = int(out.shape[1])
    top, left = pads[:2]

    def store(r: int, sub: int) -> Stmt:
        oh, ow, pair = rows[r], cols[r], ob * subs + sub
        at = ((n, pair, oh * width + ow) if out.ndim == 4
              else (n, pair, oh + top, ow + left))
        if half:  # lanes `v` and `v + lanes` of block `pair`
            # the epilogue on the whole block's vector first (on each half: twice the
            # operations), then its halves paired
            first, done = _c(sub * block), Buffer("done", (block,), "float32", "local")
            st: Stmt = seq(Allocate(done), lanes_loop("v", block, lambda v: Store(
                done, epilogue(stage[_c(r), first + v], (n, pair, oh, ow, v)), (v,))),
                lanes_loop("v", lanes, lambda v: Store(out, bf16_word(
                    done[v], done[v + lanes]), (*at, v))))
        else:
            lo, hi = (_c((2 * sub + k) * block) for k in (0, 1))
            st = lanes_loop("v", block, lambda v: Store(out, bf16_word(
                epilogue(stage[_c(r), lo + v], (n, 2 * pair, oh, ow, v)),
                epilogue(stage[_c(r), hi + v], (n, 2 * pair + 1, oh, ow, v))), (*at, v)))
        if pairs % subs:  # the last channel tile's pairs past the output
            st = IfThenElse(pair < pairs, st)
        cond = real[r]
        return st if cond is None else IfThenElse(cond, st)

    return [store(r, sub) for r in range(len(rows)) for sub in range(subs)]


def zero_border(out: Buffer, pads: tuple[int, int, int, int]) -> list[Stmt]:
    """The words of zeros of `out`'s border (`pads`: top, left, bottom, right): whole rows
    above and below, the columns left and right of the others."""
    top, left, bottom, right = pads
    if not any(pads) or out.ndim != 5:
        return []
    batch, pairs, rows, cols, block = out.shape
    rows, cols, block = int(rows), int(cols), int(block)

    def span(n: PrimExpr, p: PrimExpr, i: PrimExpr, start: int, count: int) -> Stmt:
        return _loop("q", count, lambda q: lanes_loop("v", block, lambda v: Store(
            out, as_expr(0, "int32"), (n, p, i, q + start, v))))

    def row(n: PrimExpr, p: PrimExpr, i: PrimExpr) -> Stmt:
        sides = seq(*(span(n, p, i, s, c) for s, c in ((0, left), (cols - right, right))
                      if c))
        if not (top or bottom):
            return sides
        return IfThenElse((i < top) | (i >= rows - bottom), span(n, p, i, 0, cols), sides)

    return [_nest(("n", "p", "i"), (batch, pairs, rows), row)]
