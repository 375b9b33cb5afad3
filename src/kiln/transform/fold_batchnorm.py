"""FoldBatchNorm: merge per-channel scales and shifts into the convolution before them.

Inference-mode BatchNormalization reaches the graph as `multiply` / `add` by
per-channel constants (the ONNX converter folds the statistics into a scale
`a` and a shift `b`), and exporters often emit a convolution's bias as a
separate `add`. When a convolution (`conv1d`/`conv2d`/`conv3d`) with a
constant weight is followed by such a chain, and each intermediate value has
no other use, the chain is folded into the convolution:

    y = conv(x, W, c) * a + b   ==>   y = conv(x, W * a[:, None, ...], c * a + b)

`subtract` of a constant counts as `add` of its negation. A constant is
per-channel when it broadcasts against the (N, C, spatial...) output along the
channel dim only: shapes (C, 1, ..., 1), (1, C, 1, ..., 1), (1,) or ().
The folding is done in float64 and rounded once to the weight dtype.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.transform.pass_base import FunctionPass

CONV_OPS = ("conv1d", "conv2d", "conv3d")


def _per_channel(c: g.Constant, out: TensorType) -> np.ndarray | None:
    """`c` as a (C,) float64 vector when it scales/shifts channels only, else None."""
    shape = out.shape  # the batch and spatial dims may be symbolic
    channels = shape[1] if len(shape) > 1 else None
    if not isinstance(channels, int):
        return None
    data = c.data
    if data.ndim > len(shape) or c.type.dtype != out.dtype:
        return None
    full = (1,) * (len(shape) - data.ndim) + tuple(data.shape)
    if any(d != 1 for k, d in enumerate(full) if k != 1) or full[1] not in (1, channels):
        return None
    vec = data.astype(np.float64).reshape(-1)
    return np.broadcast_to(vec, (channels,)).copy()


@dataclass
class _Conv:
    """A convolution being extended: y = conv(x, W) * scale + shift (per channel)."""

    call: g.Call
    scale: np.ndarray
    shift: np.ndarray


@dataclass(frozen=True)
class FoldBatchNorm(FunctionPass):
    """Fold per-channel multiply/add chains after constant-weight convolutions."""

    name = "fold-batchnorm"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        uses = var_use_counts(func)
        pending: dict[g.Var, _Conv] = {}     # var -> the convolution chain it holds
        absorbed: set[g.Var] = set()         # bindings folded into a later one
        for b in func.bindings:
            value = b.value
            if isinstance(value, g.Call) and value.op in CONV_OPS and \
                    isinstance(value.args[1], g.Constant) and all(
                        isinstance(a, g.Constant) for a in value.args[2:]):
                channels = value.args[1].data.shape[0]
                pending[b.var] = _Conv(value, np.ones(channels), np.zeros(channels))
                continue
            step = self._absorb(value, pending, uses)
            if step is not None:
                src, conv = step
                del pending[src]
                pending[b.var] = conv
                absorbed.add(src)
        if not absorbed:
            return func
        # a chain ends at a var still pending: its binding becomes the folded
        # convolution; the chain's intermediate bindings disappear
        out: list[g.Binding] = []
        for b in func.bindings:
            if b.var in absorbed:
                continue
            chain = pending.get(b.var)
            if chain is not None and b.value is not chain.call:
                out.append(g.Binding(b.var, _folded_call(chain)))
            else:
                out.append(b)
        return g.Function(func.params, tuple(out), func.result, dict(func.attrs))

    @staticmethod
    def _absorb(value: g.Expr, pending: dict[g.Var, _Conv], uses: Counter[g.Var]
                ) -> tuple[g.Var, _Conv] | None:
        """(conv var, extended chain) if `value` scales or shifts a single-use pending conv."""
        if not isinstance(value, g.Call) or value.op not in ("multiply", "add", "subtract"):
            return None
        a, c = value.args
        if value.op != "subtract" and isinstance(a, g.Constant) and isinstance(c, g.Var):
            a, c = c, a          # multiply/add commute
        if not (isinstance(a, g.Var) and a in pending and isinstance(c, g.Constant)):
            return None
        if uses[a] != 1:
            return None
        out_type = a.type
        assert isinstance(out_type, TensorType)
        if value.type != out_type:
            return None           # the constant broadcasts the shape up: not per channel
        vec = _per_channel(c, out_type)
        if vec is None:
            return None
        conv = pending[a]
        if value.op == "multiply":
            return a, _Conv(conv.call, conv.scale * vec, conv.shift * vec)
        sign = -1.0 if value.op == "subtract" else 1.0
        return a, _Conv(conv.call, conv.scale, conv.shift + sign * vec)


def _folded_call(conv: _Conv) -> g.Call:
    call = conv.call
    w = call.args[1]
    assert isinstance(w, g.Constant)
    weight = w.data.astype(np.float64) * conv.scale.reshape((-1,) + (1,) * (w.data.ndim - 1))
    bias = conv.shift.copy()
    if len(call.args) > 2:
        b = call.args[2]
        assert isinstance(b, g.Constant)
        bias += b.data.astype(np.float64) * conv.scale
    dtype = w.data.dtype
    args = (call.args[0], g.Constant(weight.astype(dtype), w.name),
            g.Constant(bias.astype(dtype)))
    return g.Call(call.op, args, call.attrs, call.ret_type)
