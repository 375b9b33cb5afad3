"""Which node of the source model (an ONNX node) a graph value was imported from.

Messages about a value the user never named (a kernel a symbolic size left on its
generic loops, kiln.kernels.specialisation) name the model's node instead: its name
and op type, as `kiln.frontend.onnx` records them while importing. The record is a
side table keyed by the binding's `Var` object (held weakly), not a field or an
attribute of the IR: it changes no printed text, fingerprint or generated code, a pass
that keeps a binding's variable keeps its source, and a value a pass made anew has
none (messages then fall back to the value's name hint).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from kiln.ir import graph as g


@dataclass(frozen=True)
class SourceNode:
    """A node of the source model: its name ("" when it has none), its op type and the
    first value it outputs (what names an unnamed node)."""

    name: str
    op_type: str
    output: str = ""

    def label(self) -> str:
        """How a message names it: `node 'conv1' (Conv)`, or by its output when the
        node has no name: `node with output 'y' (Conv)`."""
        who = repr(self.name) if self.name else f"with output {self.output!r}"
        return f"node {who} ({self.op_type})"


_SOURCES: weakref.WeakKeyDictionary[g.Var, SourceNode] = weakref.WeakKeyDictionary()


def set_source(var: g.Var, node: SourceNode) -> None:
    """Record that the binding of `var` was imported from `node` (the first record of a
    variable stays: a node's later helper values do not move it)."""
    _SOURCES.setdefault(var, node)


def source_of(var: g.Var) -> SourceNode | None:
    """The source node recorded for `var`, or None."""
    return _SOURCES.get(var)


__all__ = ["SourceNode", "set_source", "source_of"]
