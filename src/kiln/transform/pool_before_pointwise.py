"""PoolBeforePointwise: an average pool of a 1x1 convolution's output pools its input instead.

A 1x1 convolution at stride 1 without padding maps each position's channels on their
own, by one affine map `y = W x + b`. The mean of such outputs over a window is the map
of the inputs' mean over that window (a mean's coefficients sum to one: `b` stays), so

    avg_pool(conv(x, W, b))   ==   conv(avg_pool(x), W, b)

when the pool counts only positions inside the image (no padding; `ceil_mode`'s
clipped windows still average what they cover). DenseNet's transitions (BatchNorm,
ReLU, 1x1 convolution, 2x2/2 average pool) then run the convolution over a quarter of
the positions: the pool moves before the layer with the most multiply-adds of its
block.

Taken when the convolution's output is read only by the pool and is not a result,
both are of one spatial rank, and the value is floating point (an integer mean
rounds). Sums run in another order, so results differ from the unrewritten graph's
by rounding only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops import spatial
from kiln.ops.registry import call
from kiln.transform.pass_base import FunctionPass
from kiln.transform.splice import splice

# pool op -> (the convolution of the same spatial rank, that rank)
CONV_OF_POOL = {f"avg_pool{r}d": (f"conv{r}d", r) for r in (1, 2, 3)}


def _pointwise(conv: g.Call) -> bool:
    """Whether `conv` is a 1x1 convolution at stride 1 without padding."""
    w = conv.args[1].type
    assert isinstance(w, TensorType)
    rank = len(w.shape) - 2
    return (all(k == 1 for k in w.shape[2:])
            and spatial.ints(conv.attrs, "strides", rank, 1) == (1,) * rank
            and _unpadded(conv, rank))


def _unpadded(call: g.Call, rank: int) -> bool:
    begins, ends = spatial.pads(call.attrs, rank)
    return not any(begins + ends)


def pool_before_pointwise(fn: g.Function) -> g.Function:
    """`fn` with every average pool of a qualifying 1x1 convolution (module docstring)
    computed on the convolution's input, the convolution on the pool's output."""
    uses = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    bound = {id(b.var): b.value for b in fn.bindings}
    swapped: dict[int, tuple[g.Binding, g.Binding]] = {}  # id(pool var) -> its two bindings
    dropped: set[int] = set()                              # id(conv var)
    for b in fn.bindings:
        pool = b.value
        if not (isinstance(pool, g.Call) and pool.op in CONV_OF_POOL
                and _unpadded(pool, CONV_OF_POOL[pool.op][1])):
            continue
        y = pool.args[0]
        conv = bound.get(id(y))
        if not (isinstance(y, g.Var) and isinstance(conv, g.Call)
                and conv.op == CONV_OF_POOL[pool.op][0] and uses[y] == 1
                and id(y) not in returned and _pointwise(conv)):
            continue
        x = conv.args[0]
        x_type = x.type
        if not (isinstance(x_type, TensorType) and dt.is_float(x_type.dtype)):
            continue
        pooled = call(pool.op, x, **dict(pool.attrs))
        var = g.Var(f"{y.name}_pooled_input", pooled.type)
        moved = call(conv.op, var, *conv.args[1:], **dict(conv.attrs))
        swapped[id(b.var)] = (g.Binding(var, pooled), g.Binding(b.var, moved))
        dropped.add(id(y))
    if not swapped:
        return fn
    bindings = splice(fn.bindings, dropped, swapped)
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))


@dataclass(frozen=True)
class PoolBeforePointwise(FunctionPass):
    """Average pools of 1x1 convolutions' outputs moved onto their inputs."""

    name = "pool-before-pointwise"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        return pool_before_pointwise(func)
