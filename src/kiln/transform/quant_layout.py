"""QuantLayout: keep int8 activations between dot-form convolutions in words of 4 channels.

A dot-form int8 convolution (`qlinear_conv_dot`, kiln.ops.quant_conv_words) multiplies
words of 4 input channels of one tap: from an NCHW input it first gathers every word
from 4 channel planes (the im2col of a 1x1 convolution, the padded words of a 3x3 one).
This pass gives the activations that only such convolutions produce and read the
layout of those words, `NCHW4c` (`[N][C / 4][H][W][4]` bytes, kiln.ops.layout), so a
convolution writes the words its consumers read in place:

- a `qlinear_conv_dot` whose output channels are a multiple of 4 writes `NCHW4c`
  (`out_layout`) when every reader of its output takes it, and its tile stores a word
  per position without narrowing (kiln.kernels.int8.conv_tile.stores_words);
- a `qlinear_conv_dot` whose words are 4 channels of one tap (`quant_conv_words.
  reads_words`: k = (tap, c), or a 1x1 kernel) reads `NCHW4c` (`in_layout`);
- a `qlinear_add` of two operands of its output's shape (a residual add) with scalar
  scales and zero points is element-wise, so it runs on the 5-D tensors as they are
  when both operands and its result are `NCHW4c`;
- a `qlinear_global_average_pool` over the image of a 4-D input reads `NCHW4c`
  (`in_layout`; its output stays NCHW): the last stage of a ResNet, whose residual
  stream ends in the pool, keeps its words up to it.

A value takes the layout only when its producer and every reader handle it (and it is
not the function's result), decided by removing values from the candidates until none
breaks the rule: no reorders are added, and a chain's first convolution reads NCHW
(ResNet's after the stem's max pool) and its last writes NCHW where a max pool or another
op reads it.

Runs after quantize-ops (which packs the weights for the target's tile, so the pass
sees each convolution's tile) on shapes static but for the batch; a no-op on targets without a dot
product (the convolutions are then not dot-form).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln import ops
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import graph_vars_used
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.kernels.int8.conv_tile import stores_words
from kiln.ops import quant_conv_words as qc
from kiln.ops.quant_conv_words import CONV_DOT, WORDS_LAYOUT
from kiln.ops.quant_pool import GLOBAL_AVERAGE
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass

_ADD = "qlinear_add"
#: qlinear_add's data operands; its other operands are scales and zero points
_ADD_DATA = (0, 3)


@dataclass(frozen=True)
class QuantLayout(FunctionPass):
    """Give values between dot-form int8 convolutions (and residual `qlinear_add`s) the
    words-of-4-channels layout `NCHW4c` the convolutions read in place."""

    name = "quant-layout"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        if not any(isinstance(b.value, g.Call) and b.value.op == CONV_DOT
                   for b in func.bindings):
            return func
        words = _words_values(func)
        if not words:
            return func
        return _rewrite(func, words)


def _static_4d(t: Any) -> bool:
    """A 4-D tensor type static but for its batch: the int8 kernels run a symbolic batch
    chunk by chunk on a static batch's kernels (kiln.kernels.int8.per_sample), the
    layout's words included."""
    return isinstance(t, TensorType) and t.ndim == 4 and all(
        isinstance(d, int) for d in t.shape[1:])


def _scalar_constant(e: g.Expr) -> bool:
    return isinstance(e, g.Constant) and np.asarray(e.data).size == 1


def _residual_add(c: g.Call) -> bool:
    """Whether `c` is a qlinear_add of two operands of its output's 4-D shape with
    scalar parameters: element-wise, whatever the layout."""
    return (c.op == _ADD and _static_4d(c.ret_type)
            and all(isinstance(c.args[i], g.Var) and c.args[i].type == c.ret_type
                    for i in _ADD_DATA)
            and all(_scalar_constant(a) for i, a in enumerate(c.args) if i not in _ADD_DATA))


def _words_values(func: g.Function) -> set[g.Var]:
    """The bound values that take NCHW4c (see the module docstring)."""

    isa = kernel_isa()  # the target the pipeline runs under
    producers: dict[g.Var, g.Call] = {}
    readers: dict[g.Var, list[tuple[g.Var, g.Call, int]]] = {}
    fixed: set[g.Var] = set(graph_vars_used(func.result))  # NCHW: the result's
    for b in func.bindings:
        if not isinstance(b.value, g.Call):
            fixed.update(graph_vars_used(b.value))
            continue
        c = b.value
        for i, a in enumerate(c.args):
            if isinstance(a, g.Var):
                readers.setdefault(a, []).append((b.var, c, i))
            else:
                fixed.update(graph_vars_used(a))
        if (c.op == qc.CONV_DOT and _static_4d(c.ret_type) and stores_words(c, isa)) \
                or _residual_add(c):
            producers[b.var] = c

    def reader_takes(reader: g.Var, call: g.Call, index: int, words: set[g.Var]) -> bool:
        if call.op == qc.CONV_DOT:
            arg = call.args[0].type
            return index == 0 and isinstance(arg, TensorType) and _static_4d(arg) \
                and qc.reads_words(call.attrs, arg)
        if call.op == GLOBAL_AVERAGE:
            arg = call.args[0].type
            return index == 0 and _static_4d(arg) and not call.attrs.get("channels_last")
        # a residual add reads words only where it writes them
        return call.op == _ADD and index in _ADD_DATA and reader in words

    words = {v for v in producers if v not in fixed and v in readers}
    while True:
        keep = set()
        for v in words:
            c = producers[v]
            if c.op == _ADD and not all(c.args[i] in words for i in _ADD_DATA):
                continue
            if all(reader_takes(r, call, i, words) for r, call, i in readers[v]):
                keep.add(v)
        if keep == words:
            return words
        words = keep


def _rewrite(func: g.Function, words: set[g.Var]) -> g.Function:
    """`func` with the values of `words` in NCHW4c: their producers and readers given the
    layout attributes (residual adds their 5-D operands)."""
    renamed: dict[g.Var, g.Var] = {}
    bindings: list[g.Binding] = []
    for b in func.bindings:
        c = b.value
        touched = b.var in words or (isinstance(c, g.Call) and any(
            isinstance(a, g.Var) and a in words for a in c.args))
        if not touched:
            bindings.append(b)
            continue
        assert isinstance(c, g.Call)
        args = tuple(renamed.get(a, a) if isinstance(a, g.Var) else a for a in c.args)
        attrs = dict(c.attrs)
        if c.op in (CONV_DOT, GLOBAL_AVERAGE):
            if args[0] is not c.args[0]:
                attrs["in_layout"] = WORDS_LAYOUT
            if b.var in words:
                attrs["out_layout"] = WORDS_LAYOUT
        new = ops.call(c.op, *args, **attrs)
        if b.var in words:
            var = g.Var(b.var.name + "_w", new.ret_type)
            renamed[b.var] = var
            bindings.append(g.Binding(var, new))
        else:
            bindings.append(g.Binding(b.var, new))
    return g.Function(func.params, tuple(bindings), func.result, dict(func.attrs))
