"""The kernel of `qlinear_global_average_pool` (kiln.ops.quant_pool) on an input in words
of 4 channels (`in_layout` NCHW4c, `[N][C / 4][H][W][4]`).

A word's 4 bytes are 4 channels at one position, so the tensor-expression nest, which
sums one channel at a time, reads every fourth byte, one at a time (8x the NCHW pool's
time on ResNet-50's last stage). This kernel sums each word row, the 4 channels
together: per `(n, c4)` a 4-lane int32 accumulator adds the row's words position by
position (one widening load and add per position), then requantizes the 4 lanes with
the op's formula (`requantize_value`, the tensor-expression definition's) into the 4
channels' outputs, which are contiguous in the NCHW output `[N][C][1][1]`. The rows
split over the threads where the work pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir.graph import Call
from kiln.ir.tensor import Allocate, Buffer, Cast, DeclBuffer, PrimExpr, PrimFunc, Stmt, Store, seq
from kiln.kernels.int8.per_sample import PerSample
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import lanes_loop, loop
from kiln.ops import te
from kiln.ops.quant import qrange, requantize_value
from kiln.ops.quant_pool import words_input
from kiln.ops.quant_words import GROUP
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]


def words_average_body(x: Buffer, x_scale: Buffer, x_zp: Buffer, y_scale: Buffer,
                       y_zp: Buffer, out: Buffer, isa: ISA) -> Stmt:
    """The pool of `x` (`[N][C / 4][H][W][4]`) into `out` (`[N][C][1][1]`): the module
    docstring's loops."""
    n, c4, h, w, _ = (int(d) for d in x.shape)
    size = h * w
    rows = n * c4
    flat = Buffer("word_rows", (rows, size * GROUP), x.dtype)
    flat_out = Buffer("pooled_rows", (rows, GROUP), out.dtype)
    lo, hi = qrange(y_zp.dtype)
    multiplier = x_scale[()] / (y_scale[()] * float(size))

    def row(r: PrimExpr) -> Stmt:
        acc = Buffer("acc", (GROUP,), "int32", "local")
        start = lanes_loop("b", GROUP, lambda b: Store(
            acc, Cast("int32", x_zp[()]) * -size, (b,)))
        sums = loop("p", size, lambda p: lanes_loop("b", GROUP, lambda b: Store(
            acc, acc[b] + Cast("int32", flat[r, p * GROUP + b]), (b,))))
        stores = lanes_loop("b", GROUP, lambda b: Store(flat_out, requantize_value(
            acc[b], multiplier, y_zp[()], lo, hi, y_zp.dtype), (r, b)))
        return seq(Allocate(acc), start, sums, stores)

    kind = "parallel" if rows > 1 and worth_parallel(rows * size * GROUP, "element", isa=isa) \
        else "serial"
    return seq(DeclBuffer(flat, x, 0), DeclBuffer(flat_out, out, 0), loop("r", rows, row, kind))


@dataclass(frozen=True)
class WordsAverage:
    """qlinear_global_average_pool on words of 4 channels: the kernel of the module
    docstring for static shapes (the te definition for an NCHW input)."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """False: nothing is fused into the pool (it ends its group)."""
        return False

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The kernel of the pool alone, where its input is in words."""
        if not words_input(attrs) or result is not None or len(args) != len(params) \
                or any(a is not p for a, p in zip(args, params)):
            return None
        x, x_scale, x_zp, y_scale, y_zp = (Buffer(t.name, t.shape, t.dtype) for t in params)
        out = Buffer("out", (int(x.shape[0]), int(x.shape[1]) * GROUP, 1, 1), y_zp.dtype)
        return PrimFunc((x, x_scale, x_zp, y_scale, y_zp, out),
                        words_average_body(x, x_scale, x_zp, y_scale, y_zp, out, isa))


#: The lowering of `qlinear_global_average_pool` (kiln.kernels.lowering); over a
#: symbolic batch, chunk by chunk (kiln.kernels.int8.per_sample).
WORDS_AVERAGE = PerSample(WordsAverage())
