"""A static int8 kernel run over a symbolic batch: `PerSample` wraps a lowering built for
static shapes (the convolutions of kiln.kernels.int8) so that calls whose only symbolic
dimension is the leading one of the input and output (the batch an exporter leaves
dynamic) keep the register tiles: the kernel is built for a static chunk of samples
(`CHUNKS`: 8, then 1), its shapes and tiles exactly those of a pinned batch of that
size, and run-time loops over the batch run it on each chunk's slice (views of the
input and output at the chunk's offset, kiln.ir.tensor.DeclBuffer): whole chunks of 8
first, then the samples left one by one.

Static calls go to the wrapped lowering untouched, so pinned builds do not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.graph import Call
from kiln.ir.shape_expr import dims_equal, is_static
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    DeclBuffer,
    PrimExpr,
    PrimFunc,
    SeqStmt,
    Stmt,
    as_expr,
    seq,
)
from kiln.kernels.lowering import Lowering
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import te
from kiln.target.isa import ISA


def batch_of(params: Sequence[te.Tensor]) -> Any | None:
    """The symbolic leading dimension every symbolic operand shares, or None when a
    symbolic size lies elsewhere (or the operands disagree)."""
    lead: Any = None
    for t in params:
        if is_static(t.shape):
            continue
        if t.ndim < 2 or not is_static(tuple(t.shape[1:])) or is_static(t.shape[0]):
            return None
        if lead is not None and dims_equal(lead, t.shape[0]) is not True:
            return None
        lead = t.shape[0]
    return lead


def chunk_loop(batch: Any, first: PrimExpr, chunk: int,
               views: Sequence[tuple[Buffer, Buffer, bool]], body: Stmt,
               kind: str = "serial") -> tuple[Stmt, PrimExpr]:
    """The loop running `body` (a kernel for `chunk` samples) on the whole chunks of the
    samples from `first` on (every remaining sample when `chunk` is 1), and the first
    sample it leaves. Each (outer, inner, sliced) of `views` declares `inner` as the
    view of `outer`: at the chunk where `sliced` (its first axis the batch), else whole.
    A "serial" loop makes the body's own allocations (its workspaces: static sizes)
    once, before the loop, not once per chunk (a large one is a fresh mapping, page
    faults and all); a "parallel" one (a `body` whose loops are serial) makes them in
    each chunk, so that every thread works on its own."""
    stmts = body.body if isinstance(body, SeqStmt) else (body,)
    hoist = kind == "serial"
    hoisted = tuple(s for s in stmts if hoist and isinstance(s, Allocate))
    rest = tuple(s for s in stmts if not (hoist and isinstance(s, Allocate)))
    left = as_expr(batch, INDEX_DTYPE) - first
    count = left if chunk == 1 else left // chunk

    def per_chunk(n: PrimExpr) -> Stmt:
        decls: list[Stmt] = []
        for outer, inner, sliced in views:
            size = int(np.prod(inner.shape[1:], dtype=np.int64)) * dt.itemsize(inner.dtype)
            at = (first + n * chunk) * as_expr(size, INDEX_DTYPE) if sliced else 0
            decls.append(DeclBuffer(inner, outer, at))
        return seq(*decls, *rest)

    return seq(*hoisted, tile_loop("n", count, per_chunk, kind)), first + count * chunk


#: The batch sizes of the kernels a symbolic batch runs, largest first: whole chunks of
#: 8 samples on the kernel a pinned batch of 8 has, the rest one by one on a pinned 1's.
CHUNKS = (8, 1)


@dataclass(frozen=True)
class PerSample:
    """`inner` (a Lowering for static shapes taking no fused tail) run chunk by chunk
    over a symbolic batch (the module docstring)."""

    inner: Lowering
    supports_symbolic = True
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """The wrapped lowering's answer."""
        return self.inner.builds(call)

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The wrapped kernel: as is for static shapes, else its static kernels (`CHUNKS`)
        in loops over the batch (None where a symbolic size is not the batch alone, or
        under a fused tail)."""
        if all(is_static(t.shape) for t in params):
            return self.inner.lower_fused(params, args, attrs, anchor, result, name, isa)
        batch = batch_of(params)
        if batch is None or result is not None or len(args) != len(params) \
                or any(a is not p for a, p in zip(args, params)):
            return None
        outer: list[Buffer] = []
        loops: list[Stmt] = []
        kernel_attrs: dict[str, Any] = {}
        first: PrimExpr = as_expr(0, INDEX_DTYPE)
        for chunk in CHUNKS:
            part = [te.placeholder((chunk, *t.shape[1:]) if not is_static(t.shape)
                                   else t.shape, t.dtype, t.name) for t in params]
            prim = self.inner.lower_fused(part, part, attrs, None, None, name, isa)
            if prim is None or len(prim.params) != len(params) + 1:
                return None
            inner = [p for p in prim.params if isinstance(p, Buffer)]
            if len(inner) != len(prim.params):
                return None
            if not outer:
                outer = [Buffer(b.name, (batch, *b.shape[1:]) if sliced else b.shape,
                                b.dtype, b.scope)
                         for b, sliced in zip(inner, _sliced(params))]
            if any(sliced and int(b.shape[0]) != chunk
                   for b, sliced in zip(inner, _sliced(params))):
                return None  # the output is not batched as the input is
            loop, first = chunk_loop(batch, first, chunk,
                                     list(zip(outer, inner, _sliced(params))), prim.body)
            loops.append(loop)
            kernel_attrs = dict(prim.attrs)
        return PrimFunc(tuple(outer), seq(*loops), kernel_attrs)


def _sliced(params: Sequence[te.Tensor]) -> list[bool]:
    """Which of a kernel's buffers (`params`, then the output) hold the batch."""
    return [not is_static(t.shape) for t in params] + [True]
