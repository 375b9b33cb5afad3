"""QuantResidual: fuse a residual `qlinear_add` into the dot-form convolution before it.

A ResNet block ends in a residual add of two int8 tensors of one shape, one of them the
output of the block's last convolution, which nothing else reads. As a kernel of its own
the add reads both tensors again and hands the pool one more loop; fused, the
convolution's tiles add the residual element to each requantized value before they
store it (kiln.kernels.int8.conv_residual), with the add's own arithmetic
(kiln.ops.quant_elementwise: the convolution's rounded value first, so the output is
the two ops' exactly).

The fused op is the convolution with the add's other operand and scalars after its own
(kiln.ops.quant_conv_words, `residual_operand`). A convolution fuses when the add is its
output's only reader and a residual add (`residual_add`: operands of the output's
type, constant scalar parameters), and its output is in words of 4 channels
(`out_layout` NCHW4c, after quant-layout: the residual stream of VNNI and of AVX2 with
`int8-pairs=saturate`). Convolutions storing NCHW bytes (the int16 pairs of AVX2 and
AVX-512 without VNNI) keep the add's kernel unless `words_only` is off: on AVX2 the
fusion measured level there (docs/quantization.md, "AVX2 round four").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln import ops
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops.quant_conv_words import CONV_DOT, WORDS_LAYOUT, fused_residual
from kiln.transform.pass_base import FunctionPass

ADD = "qlinear_add"
#: qlinear_add's data operands; its other operands are scalar scales and zero points
ADD_DATA = (0, 3)


@dataclass(frozen=True)
class QuantResidual(FunctionPass):
    """Fuse each residual `qlinear_add` into the `qlinear_conv_dot` producing one of its
    operands (the module docstring); `words_only`: only convolutions writing NCHW4c;
    `channels_tiles`: also convolutions on the channels tile."""

    name = "quant-residual"
    level = "graph"
    words_only: bool = True
    channels_tiles: bool = False

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        reads = var_use_counts(func)  # the result counts as a reader
        convs = {b.var: b.value for b in func.bindings if isinstance(b.value, g.Call)
                 and b.value.op == CONV_DOT and self._fuses(b.value)
                 and reads[b.var] == 1}
        fused: dict[g.Var, g.Call] = {}  # add's var -> the fused call
        taken: set[g.Var] = set()
        for b in func.bindings:
            c = b.value
            if not (isinstance(c, g.Call) and residual_add(c)):
                continue
            a, other = (c.args[i] for i in ADD_DATA)
            for operand, (conv_var, residual) in enumerate(((a, other), (other, a))):
                if conv_var in convs and conv_var not in taken and residual is not conv_var:
                    fused[b.var] = _fused(convs[conv_var], c, operand)
                    taken.add(conv_var)
                    break
        if not fused:
            return func
        bindings = tuple(g.Binding(b.var, fused.get(b.var, b.value)) for b in func.bindings
                         if b.var not in taken)
        return g.Function(func.params, bindings, func.result, dict(func.attrs))

    def _fuses(self, conv: g.Call) -> bool:
        # weight panels `[ceil(OC / nr)][groups][nr]`: the channels tile
        weight = conv.args[1].type
        panels = isinstance(weight, TensorType) and weight.ndim == 3
        return not fused_residual(conv.attrs) and (self.channels_tiles or not panels) and (
            not self.words_only or conv.attrs.get("out_layout") == WORDS_LAYOUT)


def residual_add(c: g.Call) -> bool:
    """Whether `c` is a residual add: a qlinear_add of two values of its output's type
    (NCHW or NCHW4c) with constant scalar parameters and no attribute but `as_uint8`."""
    return (c.op == ADD and isinstance(c.ret_type, TensorType) and c.ret_type.ndim in (4, 5)
            and set(c.attrs) <= {"as_uint8"}
            and all(isinstance(c.args[i], g.Var) and c.args[i].type == c.ret_type
                    for i in ADD_DATA)
            and all(isinstance(a, g.Constant) and np.asarray(a.data).size == 1
                    for i, a in enumerate(c.args) if i not in ADD_DATA))


def _fused(conv: g.Call, add: g.Call, operand: int) -> g.Call:
    """`conv` with `add` fused: the convolution's output is the add's operand `operand`
    (0: a, 1: b); the other data operand is the residual."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = add.args
    residual = b if operand == 0 else a
    return ops.call(CONV_DOT, *conv.args, residual, a_scale, a_zp, b_scale, b_zp, y_scale,
                    y_zp, **conv.attrs, residual_operand=operand,
                    residual_as_uint8=bool(add.attrs.get("as_uint8", False)))
