"""VectorizeLoops: decide which `vectorized` loops the backends emit as vector code.

kiln's kernels mark the lanes of a register tile as `for v in T.vectorized(n)`. This
pass turns each such loop that is straight-line vector code with independent
iterations (kiln.ir.analysis.vector_loops) into `for v in T.vector(n)`, and records
the target's vector register width as the module attribute `kiln.vector_bits`
(`ATTR_VECTOR_BITS`). Both backends then emit what it decided: the llvm backend one
`<n x float>` operation per IR node (LLVM splits it into registers), the C backend
GCC/Clang vector-extension code in chunks of that register width. Loops it leaves
`vectorized` stay scalar loops with a vectorizer hint.

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
from kiln.ir.analysis.vector_loops import private_buffers, readonly_buffers, vector_loop_lanes
from kiln.ir.attrs import ATTR_VECTOR_BITS
from kiln.ir.module import IRModule
from kiln.ir.visitor import StmtMutator, substitute
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
            mutator = _Decide(private_buffers(fn, aliasing.noalias[name]), readonly_buffers(fn))
            new = mutator.visit_func(fn)
            if new is not fn:
                changed[name] = new
        if not changed:
            return mod
        return IRModule({**mod.functions, **changed}, {**mod.attrs, ATTR_VECTOR_BITS: bits})


def _target_vector_bits() -> int:
    from kiln.target.isa import isa_for

    return isa_for(None).vector_bits


class _Decide(StmtMutator):
    def __init__(self, private: set[t.Buffer], readonly: set[t.Buffer]) -> None:
        self.private = private
        self.readonly = readonly

    def visit_for(self, s: t.For) -> t.Stmt:
        if s.kind == "vectorized" and vector_loop_lanes(s, self.private, self.readonly):
            return power_of_two_pieces(s)
        return self.generic_visit(s)


def power_of_two_pieces(loop: t.For) -> t.Stmt:
    """`loop` (constant start and extent, independent iterations) as consecutive `vector`
    loops of power-of-two lanes: 48 lanes are one loop of 32 and one of 16. LLVM pads a
    `<48 x float>` to 64 lanes in memory and then keeps a register tile of them on the
    stack (a 3-vector conv tile ran 10x slower than a 2- or 4-vector one); the pieces
    stay in registers. Later pieces get a fresh loop variable."""
    start = loop.start.value if isinstance(loop.start, t.Const) else None
    extent = int(loop.extent.value)  # type: ignore[attr-defined]  # checked by the analysis
    if start is None or extent & (extent - 1) == 0:
        return t.For(loop.var, loop.start, loop.extent, "vector", loop.body)
    pieces: list[t.Stmt] = []
    offset = int(start)
    for bit in reversed(range(extent.bit_length())):
        lanes = 1 << bit
        if not extent & lanes:
            continue
        var = loop.var if not pieces else t.Var(loop.var.name, loop.var.dtype)
        body = loop.body if var is loop.var else substitute(loop.body, {loop.var: var})
        if lanes == 1:
            pieces.append(substitute(loop.body, {loop.var: t.Const(offset, loop.var.dtype)}))
        else:
            pieces.append(t.For(var, t.Const(offset, loop.var.dtype),
                                t.Const(lanes, loop.var.dtype), "vector", body))
        offset += lanes
    return t.seq(*pieces)
