"""A channel shuffle folded into the convolution that computes the shuffled value.

ShuffleNet mixes its groups with `reshape [n, g, c/g, h, w] -> transpose(0, 2, 1, 3, 4)
-> reshape [n, c, h, w]` (one `reshape_transpose` after `merge-copies`): output
channel `co * g + grp` is input channel `grp * (c / g) + co`, a copy of the whole
tensor. Where the shuffled value is a convolution's output, seen through unary
elementwise ops only (its ReLU), the convolution can compute the shuffled tensor
directly and the copy disappears:

- an ungrouped convolution (`conv2d`, by `merge-copies`): the shuffle is a permutation
  of its output channels, its weight's rows and bias permuted once at compile time
  (ShuffleNet's first unit, its 24 -> 60 layer, which then feeds the depthwise layer
  with no copy between, inside one NCHW{b}c region: kiln.transform.nchwc_layout);
- a grouped 1x1 convolution on the bfloat16 nest (`conv2d_group_gemm`, by `fuse-ops`,
  after the kernels are picked): each group's output row `co` is stored at channel
  `co * g + grp` (attribute `shuffled`, kiln.ops.conv_direct; still one vector along
  the positions per store), its bias permuted.

Taken when the convolution's weight (ungrouped) and bias are constants, the shuffle's
groups are the grouped convolution's, and every value between the convolution and the
shuffle is read once and is no result of the function.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.types import TensorType
from kiln.kernels.conv.grouped_bf16 import takes_bf16
from kiln.ops import call
from kiln.ops import conv_direct as cd
from kiln.ops.conv_geometry import conv_shape
from kiln.ops.reshape_dims import reshape_target
from kiln.target.isa import ISA
from kiln.transform.concat_tails import unary_elementwise

SHUFFLE_PERM = (0, 2, 1, 3, 4)

#: A convolution call and a shuffle's groups -> the call computing the shuffled output.
Fold = Callable[[g.Call, int], "g.Call | None"]


def shuffle_groups(value: g.Expr) -> int | None:
    """The group count of a channel shuffle (module docstring) of an NCHW tensor of
    static channels, else None."""
    if not (isinstance(value, g.Call) and value.op == "reshape_transpose"):
        return None
    src = value.args[0].type
    if not (isinstance(src, TensorType) and len(src.shape) == 4 and value.ret_type == src
            and tuple(cast("Sequence[int]", value.attrs["perm"])) == SHUFFLE_PERM):
        return None
    n, c, h, w = src.shape
    inner = reshape_target(src.shape, cast("Sequence[int | str]", value.attrs["inner"]))
    if not isinstance(c, int) or len(inner) != 5 or not isinstance(inner[1], int):
        return None
    groups = inner[1]
    return groups if groups > 0 and tuple(inner) == (n, groups, c // groups, h, w) else None


def shuffled_rows(data: np.ndarray, groups: int) -> np.ndarray:
    """`data` (output channels first) with its rows in the order of the shuffle of
    `groups` groups: row `co * groups + grp` is row `grp * (rows / groups) + co`."""
    rows = data.shape[0]
    moved = data.reshape(groups, rows // groups, *data.shape[1:]).swapaxes(0, 1)
    return np.ascontiguousarray(moved.reshape(data.shape))


def _shuffled_constant(c: g.Constant, groups: int) -> g.Constant:
    """`c` with its rows shuffled, its replay record saying so (kiln.ir.weight_origin)."""
    shape = tuple(int(d) for d in c.data.shape)
    rest = tuple(range(2, len(shape) + 1))
    split = wo.step("reshape", wo.origin_of(c.data),
                    shape=(groups, shape[0] // groups, *shape[1:]))
    moved = wo.step("transpose", split, perm=(1, 0, *rest))
    shuffled = g.Constant(shuffled_rows(c.data, groups), c.name)
    wo.record(shuffled.data, wo.step("reshape", moved, shape=shape))  # the array it holds
    return shuffled


def shuffled_weights(conv: g.Call, groups: int) -> g.Call | None:
    """An ungrouped `conv2d` whose constant weight rows and bias are shuffled in
    `groups` groups (module docstring), or None."""
    params = conv.args[1:]
    if not (conv.op == "conv2d" and int(cast(int, conv.attrs.get("group", 1))) == 1
            and all(isinstance(p, g.Constant) and p.data.shape[0] % groups == 0
                    for p in params)):
        return None
    shuffled = [_shuffled_constant(cast(g.Constant, p), groups) for p in params]
    return call(conv.op, conv.args[0], *shuffled, **dict(conv.attrs))


def shuffled_stores(isa: ISA) -> Fold:
    """The fold of a shuffle into a grouped 1x1 convolution of as many groups that runs
    the bfloat16 nest on `isa` (module docstring)."""

    def fold(conv: g.Call, groups: int) -> g.Call | None:
        attrs: dict[str, Any] = dict(conv.attrs)
        x, w, *bias = conv.args
        if not (conv.op == cd.GROUP_GEMM and int(attrs["group"]) == groups
                and not attrs.get(cd.SHUFFLED) and isinstance(x.type, TensorType)
                and isinstance(w, g.Constant)
                and all(isinstance(b, g.Constant) for b in bias)):
            return None
        shape = conv_shape(x.type.shape, w.data.shape[0], w.data.shape[2:], attrs)
        if not takes_bf16(shape, isa):
            return None
        moved = [_shuffled_constant(cast(g.Constant, b), groups) for b in bias]
        return call(conv.op, *conv.args[:2], *moved, **attrs, **{cd.SHUFFLED: True})

    return fold


def fold_shuffles(fn: g.Function, fold: Fold = shuffled_weights) -> g.Function:
    """`fn` with every channel shuffle whose convolution `fold` computes shuffled
    (module docstring) folded into it."""
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    bound = {id(b.var): b for b in fn.bindings}

    def inner_value(x: g.Expr) -> g.Binding | None:
        if not (isinstance(x, g.Var) and uses[x] == 1 and id(x) not in returned):
            return None
        return bound.get(id(x))

    replaced: dict[int, g.Binding] = {}  # id(var) -> its new binding
    dropped: set[int] = set()            # id(var) of the value the shuffle copied
    for b in fn.bindings:
        groups = shuffle_groups(b.value)
        if groups is None:
            continue
        assert isinstance(b.value, g.Call)
        chain: list[g.Binding] = []      # from the shuffled value back to the convolution
        at = inner_value(b.value.args[0])
        while at is not None and unary_elementwise(at.value):
            chain.append(at)
            assert isinstance(at.value, g.Call)
            at = inner_value(at.value.args[0])
        if at is None or not isinstance(at.value, g.Call):
            continue
        shuffled = fold(at.value, groups)
        if shuffled is None:
            continue
        # the shuffle's variable now names the last value before it
        last = chain[0] if chain else at
        replaced[id(at.var)] = g.Binding(at.var, shuffled)
        replaced[id(b.var)] = g.Binding(b.var, replaced.get(id(last.var), last).value)
        dropped.add(id(last.var))
    if not replaced:
        return fn
    bindings = [replaced.get(id(b.var), b) for b in fn.bindings if id(b.var) not in dropped]
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))
