"""Grouped-query attention's head axes around the scores, as `block-attention` meets them.

`MergeCopies` reads a GQA layer's key/value heads in place (kiln.transform.grouped_heads):
each product runs over `[b, groups, rep, ...]`, the `rep` query heads of a group beside
its one key/value head (`[b, groups, 1, ...]`, broadcast), with reshapes to the layer's
`[b, heads, ...]` around it. The scores' chain then reads

    s5 = matmul(q5, k5)            [b, groups, rep, m, n]
    x = reshape(s5)                [b, heads, m, n]   (`merged_heads`)
    ... the scale, masks and softmax on x ...
    p5 = reshape(p)                [b, groups, rep, m, n]   (`split_heads`)
    out = matmul(p5, v5)           [b, groups, rep, m, dv]

and `attention_tiled` takes it over the 5-D operands as they are: the kernel reads the
group's keys and values for each of its `rep` query heads (their batch dim of 1
broadcast), never a copy per head. A bias over the 4-D scores (`[b, 1 or heads, m, n]`)
is viewed in the same axes (`grouped_bias`).
"""

from __future__ import annotations

from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.shape_expr import dims_equal
from kiln.ir.types import TensorType
from kiln.ops import call
from kiln.ops.reshape_dims import reshape_attr


def _split_axis(t4: Any, t5: Any) -> bool:
    """Whether `t5` is `t4` with its axis 1 split in two static axes (both tensors)."""
    if not (isinstance(t4, TensorType) and isinstance(t5, TensorType)
            and t4.ndim == 4 and t5.ndim == 5):
        return False
    groups, rep = t5.shape[1], t5.shape[2]
    if not (isinstance(groups, int) and isinstance(rep, int)):
        return False
    pairs = [(t5.shape[0], t4.shape[0]), (groups * rep, t4.shape[1]),
             (t5.shape[3], t4.shape[2]), (t5.shape[4], t4.shape[3])]
    return all(dims_equal(a, b) is True for a, b in pairs)


def _reshape_once(x: g.Expr, defs: dict[g.Var, Any], uses: Any) -> g.Expr | None:
    """The operand of `x` when `x` is a reshape read once."""
    value = defs.get(x) if isinstance(x, g.Var) else None
    if isinstance(value, g.Call) and value.op == "reshape" and uses[x] == 1:
        return value.args[0]
    return None


def split_heads(x: g.Expr, defs: dict[g.Var, Any], uses: Any) -> g.Expr | None:
    """The 4-D probabilities `p` when `x` is `reshape(p)` to `[b, groups, rep, m, n]`,
    read once."""
    p = _reshape_once(x, defs, uses)
    return p if p is not None and _split_axis(p.type, x.type) else None


def merged_heads(x: g.Expr, defs: dict[g.Var, Any], uses: Any) -> g.Expr | None:
    """The 5-D scores `s5` when `x` is `reshape(s5)` merging its groups and their heads,
    read once."""
    s5 = _reshape_once(x, defs, uses)
    return s5 if s5 is not None and _split_axis(x.type, s5.type) else None


def grouped_bias(bias: g.Expr, grouped: TensorType, name: str
                 ) -> tuple[g.Var, g.Binding] | None:
    """`bias` (`[b, 1 or heads, m, n]`, broadcast to the 4-D scores) viewed over the
    `grouped` scores' axes `[b, groups, rep, m, n]`: a new var and its binding."""
    bt = bias.type
    assert isinstance(bt, TensorType) and bt.ndim == 4
    heads = bt.shape[1]
    split = (1, 1) if heads == 1 else tuple(grouped.shape[1:3])
    target = (bt.shape[0], *split, bt.shape[2], bt.shape[3])
    try:
        value = call("reshape", bias, shape=reshape_attr(bt.shape, target))
    except IRError:
        return None  # a symbolic size with no spelling over the bias
    var = g.Var(name, value.ret_type)
    return var, g.Binding(var, value)
