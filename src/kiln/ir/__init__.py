"""kiln.ir: one IRModule holding graph-level and tensor-level functions.

Tensor-level nodes live in `kiln.ir.tensor`, graph-level nodes in
`kiln.ir.graph`; `IRBuilder` builds both. Verification, structural equality and
the reference interpreter are re-exported here.
"""

from kiln.ir import dtype, graph, tensor
from kiln.ir.builder import IRBuilder
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.types import TensorType, TupleType, Type

__all__ = [
    "BaseFunc", "IRBuilder", "IRModule", "TensorType", "TupleType", "Type",
    "assert_structural_equal", "dtype", "evaluate", "graph", "structural_equal", "tensor",
    "verify",
]


def __getattr__(name: str) -> object:
    # Analyses live in their own modules and load on first use.
    if name in ("structural_equal", "assert_structural_equal"):
        from kiln.ir import structural
        return getattr(structural, name)
    if name == "verify":
        from kiln.ir.verify import verify
        return verify
    if name == "evaluate":
        from kiln.ir.evaluate import evaluate
        return evaluate
    raise AttributeError(f"module 'kiln.ir' has no attribute {name!r}")
