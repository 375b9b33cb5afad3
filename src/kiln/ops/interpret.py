"""`kiln.evaluate`: the reference interpreter with kiln's operators.

`kiln.ir` knows no operators (it is the bottom layer), so its interpreter takes an
op resolver for graph-level `Call`s; this supplies `get_op`.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.evaluate import Interpreter
from kiln.ir.module import IRModule
from kiln.ops.registry import get_op

_INTERPRETER = Interpreter(ops=get_op)


def evaluate(mod: IRModule, name: str, *args: Any, **kwargs: Any) -> Any:
    """Run function `name` of `mod` with the IR's reference semantics
    (`kiln.ir.evaluate`), operator `Call`s by their numpy references in kiln.ops."""
    return _INTERPRETER(mod, name, *args, **kwargs)
