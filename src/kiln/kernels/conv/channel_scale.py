"""The channel-scale kernels: a float32 activation multiplied by one value per (batch,
channel), the scale of a squeeze-and-excitation block.

- `multiply` (`CHANNEL_SCALE`), NCHW: a scale of shape `[N or 1, C, 1, 1]` or
  `[C, 1, 1]` (either operand order). The tensor-expression loop nest of that broadcast
  is scalar code (a serial loop per dimension). The hand-built kernel is the same nest
  with each row one vector loop (`T.vectorized`, which the vectorize-loops pass makes
  vector code): the channel's scale is loaded once per row and broadcast. Other
  shapes and dtypes keep the tensor-expression definition.
- `channel_scale_nchwc` (`CHANNEL_SCALE_NCHWC`, kiln.ops.channel_scale_nchwc): each
  position of the NCHW{b}c activation one vector operation along the channel lanes.
  Where its value is read only as bfloat16 convolutions' words (`bf16_words` ends the
  group, kiln.transform.bf16_words) it stores those words: lane `v` of blocks `2p` and
  `2p + 1`, after the tail, rounded into one int32 word (`bf16_pair`), as the
  convolutions' own conversion would, so the float32 tensor and that pass are gone.

An elementwise tail FuseOps groups after either is applied as each value is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.analysis.vector_loops import MAX_LANES
from kiln.ir.attrs import ATTR_CHANNEL_SCALE, ATTR_PARALLEL_DECIDED
from kiln.ir.tensor import PrimExpr, PrimFunc, Stmt, Store, seq
from kiln.ir.visitor import iter_nodes
from kiln.kernels.conv.bf16_words import words_output, zero_border
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.bf16 import bf16_word
from kiln.kernels.tiles import const, lanes_loop, loop, nest, parallel_tiles, parallel_when
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index
from kiln.target.isa import ISA


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, int) for d in shape)


def scaled_operand(shapes: Sequence[Sequence[Any]], dtypes: Sequence[str]) -> int | None:
    """Which operand (0 or 1) of a two-operand multiply is the `[N or 1, C, 1, 1]` (or
    `[C, 1, 1]`) channel scale of the other, a float32 static NCHW tensor; None when
    the call is no channel scale."""
    if len(shapes) != 2 or any(d != "float32" for d in dtypes):
        return None
    for k in (0, 1):
        x, s = tuple(shapes[1 - k]), tuple(shapes[k])
        # the channels may be a run-time count (kiln.transform.run_time_channels): the
        # scale's is then the same variable
        if len(x) != 4 or not _static((x[0], *x[2:])) or 0 in x or x[2] * x[3] < 2:
            continue
        if s in ((x[0], x[1], 1, 1), (1, x[1], 1, 1), (x[1], 1, 1)):
            return k
    return None


@dataclass(frozen=True)
class ChannelScale:
    """The lowering of `multiply` where it is an NCHW channel scale (module docstring)."""

    supports_symbolic = False
    fuses_producers = False

    run_time_channels = True  # its channel loop may be over a run-time count

    def builds(self, call: g.Call) -> bool:
        """Whether `call` multiplies by a channel scale (`scaled_operand`) of static
        shapes."""
        shapes = [getattr(a.type, "shape", ()) for a in call.args]
        return all(_static(s) for s in shapes) and scaled_operand(
            shapes, [getattr(a.type, "dtype", "") for a in call.args]) is not None

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The channel-scale kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        k = scaled_operand([a.shape for a in args], [a.dtype for a in args])
        final = result if result is not None else anchor
        if k is None or any(a not in params for a in args) or (
                final is not None and final.dtype != "float32"):
            return None
        return channel_scale_kernel(params, args[1 - k], args[k], anchor, result, isa)


def channel_scale_kernel(params: Sequence[te.Tensor], x: te.Tensor, scale: te.Tensor,
                         anchor: te.Tensor | None, result: te.Tensor | None, isa: ISA
                         ) -> PrimFunc | None:
    """`x * scale` (`scale` one value per channel) then the fused tail `result` over
    `anchor`, as a kernel over the parameters `params`; None when the tail cannot be
    applied as a store. Over a run-time channel count (kiln.transform.run_time_channels)
    the channels are split over the threads where the count at run time gives the work
    the parallelize pass asks of a static nest (`parallel_when` in its unit, expression
    nodes), each channel's rows on one thread, as that pass splits the static nest (left
    to itself it would merge the rows into the split and find each row's channel by a
    division)."""
    n, c, h, w = int(x.shape[0]), x.shape[1], int(x.shape[2]), int(x.shape[3])
    store = fused_store(params, anchor, result, (n, c, h, w))
    if store is None:
        return None
    xb, sb = store.buffers[x], store.buffers[scale]

    def row(ni: PrimExpr, ci: PrimExpr, hi: PrimExpr) -> Stmt:
        value = sb[broadcast_index((ni, ci, const(0), const(0)), scale.shape)]
        parts = []
        for start in range(0, w, MAX_LANES):
            def lane(v: PrimExpr, start: int = start) -> Stmt:
                idx = (ni, ci, hi, v + start)
                return Store(store.out, store.epilogue(xb[idx] * value, idx), idx)

            parts.append(lanes_loop("v", min(MAX_LANES, w - start), lane))
        return seq(*parts)

    attrs: dict[str, Any] = {ATTR_CHANNEL_SCALE: True}
    if isinstance(c, int):
        body = nest(("n", "c", "h"), (n, c, h), row)
    else:
        zero = (const(0),) * 4  # one element's nodes: the pass's measure of work
        nodes = 1 + sum(1 for _ in iter_nodes(Store(
            store.out, store.epilogue(xb[zero] * sb[broadcast_index(zero, scale.shape)],
                                      zero), zero)))

        def image(ni: PrimExpr) -> Stmt:
            return parallel_when(lambda: parallel_tiles((c,), lambda ci: loop(
                "h", h, lambda hi: row(ni, ci, hi))), c * (h * w * nodes), "node", isa=isa)

        body = image(const(0)) if n == 1 else loop("n", n, image)
        attrs[ATTR_PARALLEL_DECIDED] = True
    return PrimFunc((*(store.buffers[t] for t in params), store.out), body, attrs)


CHANNEL_SCALE = ChannelScale()


@dataclass(frozen=True)
class ChannelScaleNchwc:
    """The lowering of `channel_scale_nchwc` (float32, static channels and image sizes;
    the batch may be symbolic)."""

    supports_symbolic = True
    fuses_producers = False

    def builds(self, call: g.Call) -> bool:
        """Every call: `lower_fused` declines the ones it does not take."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The vector kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        x, s = args
        if x.dtype != "float32" or not all(isinstance(d, int) for d in x.shape[1:]):
            return None
        n, cb, h, w, b = x.shape
        output = words_output(params, anchor, result, tuple(x.shape))
        if output is None:
            return None
        store, out, source = output.store, output.out, output.source
        xb, sb = store.buffers[x], store.buffers[s]
        # a constant scale (a blocked per-channel constant, kiln.transform.nchwc_layout)
        # is one image's, whatever the batch
        shared = s.shape[0] == 1 and n != 1

        def scaled(idx: tuple[PrimExpr, ...]) -> PrimExpr:
            scale = sb[const(0) if shared else idx[0], idx[1], const(0), const(0), idx[4]]
            return store.epilogue(xb[idx] * scale, idx)

        if source is None:
            def row(i: PrimExpr, c: PrimExpr, r: PrimExpr) -> Stmt:
                return loop("q", w, lambda q: lanes_loop(
                    "v", b, lambda v: Store(out, scaled((i, c, r, q, v)), (i, c, r, q, v))))

            blocks, border = cb, []
        else:
            top, left = source.pads[:2]

            def row(i: PrimExpr, c: PrimExpr, r: PrimExpr) -> Stmt:  # c: a pair of blocks
                def word(q: PrimExpr, v: PrimExpr) -> Stmt:
                    at = (i, c, r * w + q) if source.flat else (i, c, r + top, q + left)
                    return Store(out, bf16_word(scaled((i, 2 * c, r, q, v)),
                                                scaled((i, 2 * c + 1, r, q, v))), (*at, v))

                return loop("q", w, lambda q: lanes_loop("v", b, lambda v: word(q, v)))

            blocks, border = cb // 2, zero_border(out, source.pads)
        # storing words, the work is the conversion's: float32 values streamed once each
        stmt = parallel_when(lambda: parallel_tiles((n, blocks, h), row), n * cb * h * w * b,
                             "element" if source is None else "stream", isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), out), seq(*border, stmt), {})


CHANNEL_SCALE_NCHWC = ChannelScaleNchwc()
