"""kiln.ir: one IRModule holding graph-level and tensor-level functions.

Tensor-level nodes live in `kiln.ir.tensor`, graph-level nodes in
`kiln.ir.graph`; `IRBuilder` builds both. Verification, structural equality and
the reference interpreter are re-exported here.
"""

# The analyses are imported eagerly: kiln/ir/verify.py defines `verify` and
# kiln/ir/evaluate.py `evaluate`, and importing such a submodule lazily would
# replace the package attribute `kiln.ir.verify` (the function) with the module
# object. They depend only on the IR core, so the cost is small.
from kiln.ir import dtype, graph, tensor
from kiln.ir.builder import IRBuilder
from kiln.ir.evaluate import Interpreter, evaluate
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.structural import assert_structural_equal, structural_equal
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ir.verify import verify

__all__ = [
    "BaseFunc", "IRBuilder", "IRModule", "Interpreter", "TensorType", "TupleType", "Type",
    "assert_structural_equal", "dtype", "evaluate", "graph", "structural_equal", "tensor",
    "verify",
]
