"""Software prefetches of a kernel's packed weights, one unit of work ahead.

A blocked convolution's tiles of one output-channel block all read that block's
packed weights: the first tile brings them from memory, the others find them in
cache. In a model the weights of a large layer are never in cache when it starts
(ResNet-50's 512 > 2048 1x1 layer at 7x7 packs 4 MB), so each block's first tile
runs at the speed of memory, in a burst, while the other tiles leave the memory
idle. `WeightPrefetch` has every step of a tile's sums also prefetch the weights
the next unit of work (the next channel block, or the next segment of input
channels) reads at the same step, so they stream in while the current block is
computed and the next block's first tile finds them in cache.

The prefetched element is `ahead` elements further along the flat packed weight; a
tile whose unit is the last one prefetches its own weights instead, so every address
is in bounds (docs/ir.md, "Prefetches").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir.dtype import INDEX_DTYPE, itemsize
from kiln.ir.tensor import (
    Buffer,
    DeclBuffer,
    Evaluate,
    Intrin,
    LetStmt,
    PrimExpr,
    Select,
    Stmt,
    Var,
    as_expr,
)

#: The cache line the prefetches step by: x86-64's and most Arm cores' (a core with
#: longer lines only gets some prefetches twice).
LINE_BYTES = 64


def flat_index(shape: tuple[int | PrimExpr, ...], indices: tuple[PrimExpr, ...]) -> PrimExpr:
    """The row-major flat offset of `indices` in a buffer of `shape`."""
    flat: PrimExpr = indices[0]
    for extent, index in zip(shape[1:], indices[1:]):
        flat = flat * extent + index
    return flat


@dataclass
class WeightPrefetch:
    """Prefetches of `weights` `ahead` elements on from what a tile reads (a size of the
    weights and `ahead` may be run-time ones: kiln.kernels.conv.run_time_width).

    `start(origin, span)` binds, at the head of a tile whose reads begin at element
    index `origin` and cover `span` elements, the base of its prefetches; `at(offset,
    width)` prefetches the lines of `width` elements that lie `offset` elements after
    the tile's own `origin` in the next unit. `decls` declare the flat view, once per
    kernel, outside the parallel loop."""

    weights: Buffer
    ahead: int | PrimExpr
    view: Buffer = field(init=False)
    decls: list[Stmt] = field(init=False)
    base: Var = field(init=False)

    def __post_init__(self) -> None:
        self.view = Buffer(f"{self.weights.name}_pf", (self._size(),), self.weights.dtype)
        self.decls = [DeclBuffer(self.view, self.weights, 0)]
        self.base = Var("pf_base", INDEX_DTYPE)

    def _size(self) -> int | PrimExpr:
        size: int | PrimExpr = 1
        for d in self.weights.shape:
            size = size * d
        return size

    def start(self, origin: tuple[PrimExpr, ...], span: int | PrimExpr) -> Stmt:
        first = flat_index(tuple(self.weights.shape), origin)
        # the last unit's tiles prefetch their own weights: every address in bounds
        fits = first + (self.ahead + span) <= as_expr(self._size(), INDEX_DTYPE)
        return LetStmt(self.base, Select(fits, first + self.ahead, first))

    def at(self, offset: PrimExpr, width: int) -> list[Stmt]:
        line = max(1, LINE_BYTES // itemsize(self.weights.dtype))
        return [Evaluate(Intrin("prefetch", (self.view[self.base + offset + off],)))
                for off in range(0, width, line)]
