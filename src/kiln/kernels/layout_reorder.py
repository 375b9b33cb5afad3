"""The kernel of `layout_transform` (kiln.ops.layout) between NCHW and NCHW{b}c.

The tensor-expression nest walks the output in order and reads the input `b` values
apart (leaving the blocked layout) or a channel plane apart (entering it), and LLVM's
loop vectorizer makes gathers of those reads. This kernel walks both tensors together:
for each row `(n, block, h)` and column `w`, the block's `b` contiguous values and the
`b` channel planes' values at `w`, one scalar copy per lane in a `scalar` column loop
(kept out of the vectorizer: vectorized over the columns, each lane's copy is a
gather again). Reads and writes stream through `b` rows at once. Lanes past the real
channel count are not stored (leaving) or stored as zeros (entering).

float32 with a static image and channel count (the batch may be symbolic); other calls
keep the tensor-expression definition, as do
images of one position (a pooled `[N][C][1][1]`), whose two layouts hold the channels
in the same order: a contiguous copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import IfThenElse, PrimExpr, PrimFunc, Stmt, Store, as_expr, seq
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import fused_store
from kiln.kernels.tiles import const, loop, parallel_tiles, parallel_when
from kiln.ops import te
from kiln.ops.layout import layout_block
from kiln.target.isa import ISA


@dataclass(frozen=True)
class LayoutReorder:
    """The lowering of `layout_transform` (see the module docstring): a static image and
    channel count (the batch may be symbolic), and an elementwise tail applied as each
    value is stored."""

    fuses_producers = False
    supports_symbolic = True

    def builds(self, call: g.Call) -> bool:
        """float32 calls (the tensor-expression nest keeps the integer ones)."""
        x = call.args[0].type
        return isinstance(x, TensorType) and x.dtype == "float32"

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        (x,) = args
        if x.dtype != "float32" or not all(isinstance(d, int) for d in x.shape[1:]):
            return None
        leaving = layout_block(str(attrs["src"]))
        block = leaving or layout_block(str(attrs["dst"]))
        if leaving:
            n, blocks, h, w, _ = x.shape
            channels = int(attrs["channels"])
            out_shape: tuple[int, ...] = (n, channels, h, w)
        else:
            n, channels, h, w = x.shape
            blocks = -(-channels // block)
            out_shape = (n, blocks, h, w, block)
        store = fused_store(params, anchor, result, out_shape)
        if store is None or h * w == 1:  # one position: the channels in order either way
            return None
        xb, out = store.buffers[x], store.out

        def columns(i: PrimExpr, c: PrimExpr, r: PrimExpr, real: int) -> Stmt:
            """Row `(i, c, r)`, the first `real` lanes of its block real channels."""
            def column(q: PrimExpr) -> Stmt:
                copies = []
                for v in range(real if leaving else block):
                    if leaving:
                        idx: tuple[PrimExpr, ...] = (i, c * block + v, r, q)
                        value: PrimExpr = xb[i, c, r, q, const(v)]
                    else:
                        idx = (i, c, r, q, const(v))
                        value = xb[i, c * block + v, r, q] if v < real else as_expr(0.0)
                    copies.append(Store(out, store.epilogue(value, idx), idx))
                return seq(*copies)
            return loop("q", w, column, kind="scalar")

        def row(i: PrimExpr, c: PrimExpr, r: PrimExpr) -> Stmt:
            tail = channels % block
            if not tail:
                return columns(i, c, r, block)
            return IfThenElse(c < blocks - 1, columns(i, c, r, block),
                              columns(i, c, r, tail))

        # a copy that streams each value once
        stmt = parallel_when(lambda: parallel_tiles((n, blocks, h), row),
                             n * blocks * h * w * block, "stream", isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), out), stmt, {})


LAYOUT_REORDER = LayoutReorder()
