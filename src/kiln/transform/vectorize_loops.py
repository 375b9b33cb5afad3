"""VectorizeLoops: decide which `vectorized` loops the backends emit as vector code.

kiln's kernels mark the lanes of a register tile as `for v in T.vectorized(n)`. This
pass turns each such loop that is straight-line vector code with independent
iterations (kiln.ir.analysis.vector_loops) into `for v in T.vector(n)`, and records
the target's vector register width as the module attribute `kiln.vector_bits`
(`ATTR_VECTOR_BITS`). Both backends then emit what it decided: the llvm backend one
`<n x float>` operation per IR node (LLVM splits it into registers), the C backend
GCC/Clang vector-extension code in chunks of that register width. A longer loop (above
MAX_LANES, e.g. the copy of a padded image row) that is vector code becomes a serial
loop over vector pieces of a few registers, and its rest (`strip_mined`). Loops it
leaves `vectorized` stay scalar loops with a vectorizer hint.

The decision comes from the target's ISA object (kiln.target.isa.isa_for): a CPU
without vector registers (`vector_bits` 0, e.g. a Cortex-M without MVE) keeps every
loop scalar. The pass belongs at the end of the tensor pipeline: later rewrites would
have to keep the loops' independence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import tensor as t
from kiln.ir.aliasing import analyze
from kiln.ir.analysis.vector_loops import (
    element_bytes,
    long_loop_vectorizable,
    private_buffers,
    readonly_buffers,
    vector_loop_lanes,
    walks_as,
)
from kiln.ir.attrs import ATTR_VECTOR_BITS
from kiln.ir.module import IRModule
from kiln.ir.visitor import StmtMutator, iter_stmts, substitute
from kiln.target.isa import isa_for
from kiln.transform.pass_base import Pass


@dataclass
class VectorizeLoops(Pass):
    """Mark straight-line `vectorized` loops `vector` (see the module docstring).
    `vector_bits`: the register width to decide for; 0 (default) asks the current
    target's ISA."""

    name = "vectorize-loops"
    vector_bits: int = 0

    def run(self, mod: IRModule) -> IRModule:
        bits = self.vector_bits or _target_vector_bits()
        funcs = mod.prim_funcs()
        if bits <= 0 or not funcs:
            return mod
        aliasing = analyze(dict(funcs))
        changed: dict[str, Any] = {}
        for name, fn in funcs.items():
            mutator = _Decide(private_buffers(fn, aliasing.noalias[name]), readonly_buffers(fn),
                              bits)
            new = mutator.visit_func(fn)
            if new is not fn:
                changed[name] = new
        if not changed:
            return mod
        return IRModule({**mod.functions, **changed}, {**mod.attrs, ATTR_VECTOR_BITS: bits})


def _target_vector_bits() -> int:
    return isa_for(None).vector_bits


class _Decide(StmtMutator):
    def __init__(self, private: set[t.Buffer], readonly: set[t.Buffer],
                 bits: int) -> None:
        self.private = private
        self.readonly = readonly
        self.bits = bits

    def visit_for(self, s: t.For) -> t.Stmt:
        if s.kind == "vectorized" and vector_loop_lanes(s, self.private, self.readonly):
            # a register's lanes: of the loop's elements, 32-bit ones for wider elements
            size = element_bytes(s)
            return register_pieces(s, self.bits // (8 * min(size, 4)), split_rest=size < 4)
        if s.kind == "vectorized" and long_loop_vectorizable(s, self.private, self.readonly):
            size = element_bytes(s)
            lanes = self.bits // (8 * min(size, 4))
            return strip_mined(s, lanes * STRIP_REGISTERS, lanes, size < 4) or s
        return self.generic_visit(s)


#: The registers one piece of a strip-mined loop covers (four independent operations
#: per statement, as LLVM's loop vectorizer interleaves its own).
STRIP_REGISTERS = 4


def strip_mined(loop: t.For, piece: int, register_lanes: int, split_rest: bool
                ) -> t.Stmt | None:
    """`loop` (a constant extent above MAX_LANES, independent iterations) as a serial loop
    over `vector` pieces of `piece` lanes, then its rest as `register_pieces`; None when
    its body cannot be copied (`_rebound`). Under `noimplicitfloat` (kiln.ir.attrs.
    ATTR_NO_SLP) LLVM vectorizes no loop itself: the padded row copy of Whisper's
    3000-sample conv1d ran a float at a time."""
    start = loop.start
    extent = int(loop.extent.value)  # type: ignore[attr-defined]  # checked by the caller
    if not isinstance(start, t.Const):
        return None
    count, rest = divmod(extent, piece)
    dtype = loop.var.dtype
    outer = t.Var(loop.var.name + "_o", dtype)
    lane = t.Var(loop.var.name, dtype)
    body = _rebound(loop.body, {loop.var: start + outer * piece + lane})
    if body is None:
        return None
    parts: list[t.Stmt] = [t.For(outer, t.Const(0, dtype), t.Const(count, dtype), "serial",
                                 t.For(lane, t.Const(0, dtype), t.Const(piece, dtype),
                                       "vector", body))]
    if rest:
        tail = t.Var(loop.var.name, dtype)
        tail_body = _rebound(loop.body, {loop.var: tail})
        if tail_body is None:
            return None
        last = t.For(tail, t.Const(int(start.value) + count * piece, dtype),
                     t.Const(rest, dtype), "vectorized", tail_body)
        parts.append(register_pieces(last, register_lanes, split_rest) if rest > 1 else
                     t.For(tail, last.start, last.extent, "serial", tail_body))
    return t.seq(*parts)


def register_pieces(loop: t.For, register_lanes: int, split_rest: bool = False) -> t.Stmt:
    """`loop` (constant start and extent, independent iterations) as consecutive `vector`
    loops: power-of-two pieces of at least a register (`register_lanes` lanes),
    then the rest, less than a register, as one piece. With 16 lanes 48 are one loop of
    32 and one of 16, 37 are 32 and 5. LLVM pads a `<48 x float>` to 64 lanes in memory
    and then keeps a register tile of them on the stack, many times slower than a 2- or
    4-vector tile; the pieces stay in registers. `split_rest` (byte
    and word loops) splits the rest into power-of-two pieces too, the last of one lane
    scalar code: 27 bytes are 16, 8, 2 and 1 (LLVM legalizes some odd byte widths, as
    `<27 x i8>`, into code slower than its own loop vectorizer's). Later pieces bind fresh
    variables (loop and lets)."""
    whole = walks_as(t.For(loop.var, loop.start, loop.extent, "vector", loop.body), loop)
    start = loop.start.value if isinstance(loop.start, t.Const) else None
    extent = int(loop.extent.value)  # type: ignore[attr-defined]  # checked by the analysis
    if start is None or extent & (extent - 1) == 0 or (extent <= register_lanes
                                                        and not split_rest):
        return whole
    sizes = []
    rest = extent
    while rest >= (1 if split_rest else max(register_lanes, 1)):
        sizes.append(1 << (rest.bit_length() - 1))
        rest -= sizes[-1]
    sizes += [rest] if rest else []
    pieces: list[t.Stmt] = []
    offset = int(start)
    for lanes in sizes:
        if not pieces:
            pieces.append(walks_as(t.For(loop.var, t.Const(offset, loop.var.dtype),
                                         t.Const(lanes, loop.var.dtype), "vector",
                                         loop.body), loop))
        else:
            var = t.Var(loop.var.name, loop.var.dtype)
            index: t.PrimExpr = var if lanes > 1 else t.Const(offset, loop.var.dtype)
            body = _rebound(loop.body, {loop.var: index})
            if body is None:
                return whole
            pieces.append(body if lanes == 1 else t.For(
                var, t.Const(offset, loop.var.dtype), t.Const(lanes, loop.var.dtype),
                "vector", body))
        offset += lanes
    return t.seq(*pieces)


_DEFINES = (t.LetStmt, t.For, t.Allocate, t.AllocConst, t.DeclBuffer)


def _rebound(body: t.Stmt, vmap: dict[t.Var, t.PrimExpr]) -> t.Stmt | None:
    """A copy of the straight-line `body` with `vmap` applied and each let bound to a
    fresh variable (a variable is defined once per function); None if a statement
    nests a definition."""
    out: list[t.Stmt] = []
    for s in body.body if isinstance(body, t.SeqStmt) else (body,):
        if isinstance(s, t.LetStmt):
            var = t.Var(s.var.name, s.var.dtype)
            out.append(t.LetStmt(var, substitute(s.value, vmap)))
            vmap[s.var] = var
        elif any(isinstance(d, _DEFINES) for d in iter_stmts(s)):
            return None
        else:
            out.append(substitute(s, vmap))
    return t.seq(*out)
