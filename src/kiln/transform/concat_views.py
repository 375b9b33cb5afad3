"""Concatenations as output views: the kernels producing a concat's inputs write
straight into their part of its output, and the concat's copy disappears.

A concatenation along an axis with only size-1 dimensions before it (a channel
concat at batch 1: SqueezeNet's fire modules, Inception's branches, a blocked NCHWc
concat) lays each input out as one contiguous run of the output, at a byte offset the
shapes fix. When every input is a tensor a kernel of the same block computes (not a
parameter, a constant, a function result or a control-flow value) and no input is
given twice, lowering (kiln.transform.lower_graph) declares each input's buffer as a
view of the concat's output at that offset and drops the concat's call. The output's
buffer is then live from its first input's kernel on, and as long as any input is
still read.

Views nest: an input that is itself the output of a dropped concat (a chain
`concat(concat(x0, f0), f1)`, DenseNet's growing feature map written as a chain) is
a view too, and its own inputs move with it, each a view of the outermost output at
the sum of the offsets; the whole chain is one buffer, every kernel writing its part
in place. So does a concat whose first inputs are all the inputs of a dropped concat,
in order (DenseNet's feature map as exported, each layer's input `concat(x0, f0, ...,
f_k)` of every earlier output): those inputs lie in its output exactly as in the
earlier one's, so the earlier output is its first piece, at offset 0, and each block is
one buffer, every layer writing its channels once. An input lives in one place only:
one given to two concats (but as such a shared prefix), or also a result of the
function, is a view of at most one of them, and the others copy it.

LegalizeOps builds a concat's kernel with the attribute `kiln.concat_axis`
(kiln.ir.attrs.ATTR_CONCAT_AXIS): that is how lowering knows a call copies its
inputs and does nothing else (a concat fused with other ops has its own kernel,
without the attribute, and stays a call).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_CONCAT_AXIS, ATTR_PRIVATE
from kiln.ir.dtype import itemsize
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.shape_expr import is_static
from kiln.ir.visitor import iter_stmts

if TYPE_CHECKING:
    from kiln.transform.lower_graph import GraphSlot, GraphStep


@dataclass
class ConcatViews:
    """The concats lowering drops: each input slot's (output slot, byte offset) and the
    dropped calls."""

    pieces: dict[GraphSlot, tuple[GraphSlot, int]] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)  # id() of the dropped GraphSteps
    # the pieces viewing each whole (the inverse of `pieces`, to move them when that
    # whole becomes a piece of another concat)
    members: dict[GraphSlot, list[GraphSlot]] = field(default_factory=dict)

    def join(self, step: GraphStep, inputs: Sequence[GraphSlot], offsets: Sequence[int]
             ) -> None:
        """Drop concat `step`: each of `inputs` (its inputs, or an earlier concat's output
        standing for their prefix) a view of its output at its offset, the views of an
        input that is itself a dropped concat's output moved into this output at the sum
        of the offsets (every piece viewing the outermost buffer)."""
        whole = step.outputs[0]
        self.dropped.add(id(step))
        into = self.members.setdefault(whole, [])
        for s, off in zip(inputs, offsets, strict=True):
            for inner in self.members.pop(s, []):
                self.pieces[inner] = (whole, off + self.pieces[inner][1])
                into.append(inner)
            self.pieces[s] = (whole, off)
            into.append(s)

    def widen(self, defs: dict[Hashable, int], uses: dict[Hashable, list[int]]) -> None:
        """Extend each concat output's live range (`defs`, `uses` of the memory plan) over
        its inputs': their bytes are its bytes."""
        for piece, (whole, _) in self.pieces.items():
            if whole in defs:
                defs[whole] = min(defs[whole], piece.def_step)
                uses[whole] = [*uses.get(whole, []), *piece.uses]

    def declarations(self) -> list[t.Stmt]:
        """A view of its concat's output for every input (each input's buffer made here,
        its output's already), declared after the outputs' own declarations."""
        out: list[t.Stmt] = []
        for piece, (whole, offset) in self.pieces.items():
            assert whole.buffer is not None
            piece.buffer = t.Buffer(piece.name, piece.type.shape, piece.type.dtype)
            out.append(t.DeclBuffer(piece.buffer, whole.buffer, offset))
        return out


def concat_views(items: Sequence[object], mod: IRModule,
                 results: Mapping[GraphSlot, int]) -> ConcatViews:
    """The concats of one block (`items`: its GraphSteps and control-flow regions, in
    order) that become views (see the module docstring); `results` are the slots written
    straight into the function's outputs."""
    from kiln.transform.lower_graph import (
        GraphStep,  # cycle: kiln.transform.lower_graph imports this module
    )

    views = ConcatViews()
    producer: dict[GraphSlot, GraphStep] = {}
    joined: dict[tuple[GraphSlot, ...], GraphSlot] = {}  # a dropped concat's inputs -> output
    for item in items:
        if not isinstance(item, GraphStep):
            continue
        offsets = _piece_offsets(item, mod)
        if offsets is not None:
            for inputs, offs in (_past_prefix(item.inputs, offsets, joined),
                                 (item.inputs, offsets)):
                if len(set(inputs)) == len(inputs) and all(
                        _may_alias(s, producer, views, results) for s in inputs):
                    views.join(item, inputs, offs)
                    joined[tuple(item.inputs)] = item.outputs[0]
                    break
        if not item.binds:
            producer.update((s, item) for s in item.outputs)
    return views


def _piece_offsets(step: GraphStep, mod: IRModule) -> list[int] | None:
    """The byte offset of each input in the output, if `step` is a concat whose inputs
    are contiguous runs of its output (static shapes), else None."""
    callee = mod.functions.get(step.func)
    axis = callee.attrs.get(ATTR_CONCAT_AXIS) if isinstance(callee, t.PrimFunc) else None
    if not isinstance(axis, int) or step.binds or len(step.outputs) != 1:
        return None
    out = step.outputs[0]
    shapes = [s.type.shape for s in (*step.inputs, out)]
    if (not all(is_static(sh) and len(sh) > axis for sh in shapes)
            or any(s.actual is not None for s in (*step.inputs, out))
            or len(set(step.inputs)) != len(step.inputs)
            or any(d != 1 for d in out.type.shape[:axis])):
        return None
    offsets, at = [], 0
    for s in step.inputs:
        offsets.append(at)
        at += s.type.numel() * itemsize(s.type.dtype)
    return offsets


def _past_prefix(inputs: Sequence[GraphSlot], offsets: Sequence[int],
                 joined: Mapping[tuple[GraphSlot, ...], GraphSlot]
                 ) -> tuple[Sequence[GraphSlot], Sequence[int]]:
    """`inputs` with their longest proper prefix that a dropped concat joined replaced by
    that concat's output (at offset 0: its bytes are those inputs' in order), and their
    `offsets` likewise; as they are when no dropped concat has such inputs. (That output
    may be among the rest too, `concat(x0, f0, concat(x0, f0))`: then it is no view.)"""
    for k in range(len(inputs) - 1, 0, -1):
        whole = joined.get(tuple(inputs[:k]))
        if whole is not None:
            return (whole, *inputs[k:]), (0, *offsets[k:])
    return inputs, offsets


def _may_alias(s: GraphSlot, producer: Mapping[GraphSlot, GraphStep], views: ConcatViews,
               results: Mapping[GraphSlot, int]) -> bool:
    """Whether input `s` of a concat may live in the concat's output: a kernel of this
    block computes it (or a concat dropped before, whose views then nest), it is no
    function result and in no other concat's output."""
    return (s.kind == "call" and s in producer and s not in results
            and s not in views.pieces)


def drop_uncalled_concats(funcs: dict[str, BaseFunc]) -> dict[str, BaseFunc]:
    """`funcs` without the private concat kernels no lowered function calls any more."""
    called = {s.func for f in funcs.values() if isinstance(f, t.PrimFunc)
              for s in iter_stmts(f.body) if isinstance(s, t.CallFunc)}
    return {n: f for n, f in funcs.items()
            if n in called or not (f.attrs.get(ATTR_PRIVATE) and ATTR_CONCAT_AXIS in f.attrs)}
