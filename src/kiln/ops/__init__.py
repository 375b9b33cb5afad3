"""kiln.ops: graph-level operators — type rules, tensor-expression lowering, references."""

from kiln.ops.interpret import evaluate
from kiln.ops.registry import OpDef, call, evaluate_call, get_op, list_ops, register_op

__all__ = ["OpDef", "call", "evaluate", "evaluate_call", "get_op", "list_ops", "register_op"]
