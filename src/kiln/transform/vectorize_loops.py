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
from kiln.ir.visitor import StmtMutator
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
            return t.For(s.var, s.start, s.extent, "vector", s.body)
        return self.generic_visit(s)
