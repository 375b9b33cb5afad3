"""onnxruntime's option enums, by the same names and values (docs/session.md).

kiln compiles every session with all of its passes and runs one op at a time, so
these values are accepted and kept, and change nothing in how a model runs: a
script that sets them runs as it does on onnxruntime, with kiln's optimizations.
"""

from __future__ import annotations

from enum import IntEnum


class _OrtEnum(IntEnum):
    """An IntEnum printed as onnxruntime prints its enums: "ExecutionMode.ORT_PARALLEL"."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class GraphOptimizationLevel(_OrtEnum):
    """`SessionOptions.graph_optimization_level`: onnxruntime's levels. kiln always
    optimizes fully (its compile is the optimization), whatever the level."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(_OrtEnum):
    """`SessionOptions.execution_mode`: kiln runs the ops of a graph one after the
    other (each op parallel inside), as onnxruntime's ORT_SEQUENTIAL."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(_OrtEnum):
    """`SessionOptions.execution_order`: kiln's order is its compiled schedule."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


__all__ = ["ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel"]
