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
The folding is done in float64 and rounded once to the weight dtype. Each step is
recorded as the replay `Module.swap_weights` runs (kiln.ir.weight_origin): the same
numpy on the new weights.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops import pack_memory
from kiln.transform.pass_base import FunctionPass

CONV_OPS = ("conv1d", "conv2d", "conv3d")


def _vector_origin(c: g.Constant, channels: int) -> wo.Origin | None:
    """The replay of `_per_channel(c, ...)`."""
    f64 = wo.step("astype", wo.operand(c.data), dtype="float64")
    flat = wo.step("reshape", f64, shape=(int(c.data.size),))
    return wo.step("broadcast_to", flat, shape=(channels,))


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
    scale_origin: wo.Origin | None  # their replays (kiln.ir.weight_origin)
    shift_origin: wo.Origin | None


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
                pending[b.var] = _Conv(value, np.ones(channels), np.zeros(channels),
                                       wo.Full(1.0, "float64", (channels,)),
                                       wo.Full(0.0, "float64", (channels,)))
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
        vo = _vector_origin(c, len(vec))
        if value.op == "multiply":
            return a, _Conv(conv.call, conv.scale * vec, conv.shift * vec,
                            wo.apply("multiply", [conv.scale_origin, vo], "float64"),
                            wo.apply("multiply", [conv.shift_origin, vo], "float64"))
        sign = -1.0 if value.op == "subtract" else 1.0
        signed = wo.apply("multiply", [wo.value(np.float64(sign)), vo], "float64")
        return a, _Conv(conv.call, conv.scale, conv.shift + sign * vec, conv.scale_origin,
                        wo.apply("add", [conv.shift_origin, signed], "float64"))


def _folded_call(conv: _Conv) -> g.Call:
    call = conv.call
    w = call.args[1]
    assert isinstance(w, g.Constant)
    bias = conv.shift.copy()
    if len(call.args) > 2:
        b = call.args[2]
        assert isinstance(b, g.Constant)
        bias += b.data.astype(np.float64) * conv.scale
    dtype = w.data.dtype
    new_w, new_b = g.Constant(_scaled(w.data, conv.scale), w.name), g.Constant(bias.astype(dtype))
    _record_folded(conv, w, call.args[2] if len(call.args) > 2 else None, new_w, new_b)
    return g.Call(call.op, (call.args[0], new_w, new_b), call.attrs, call.ret_type)


def _scaled(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`(w.astype(float64) * scale[:, None, ...]).astype(w.dtype)`, the same bits: for a
    float weight the ufunc multiplies in float64 block by block and rounds each product
    once into the result, with no float64 temporaries of the weight's size. The result
    is fresh (on small pages from 4 MiB, kiln.ops.pack_memory: it is written once in
    order) and read-only: a graph constant takes it without a copy."""
    column = scale.reshape((-1,) + (1,) * (w.ndim - 1))
    if w.dtype not in (np.float16, np.float32, np.float64):
        out = (w.astype(np.float64) * column).astype(w.dtype)
    else:
        out = pack_memory.empty(w.shape, w.dtype)
        np.multiply(w, column, out=out, dtype=np.float64, casting="same_kind")
    out.flags.writeable = False
    return out


def _record_folded(conv: _Conv, w: g.Constant, b: g.Expr | None, new_w: g.Constant,
                   new_b: g.Constant) -> None:
    """Record the replays of the folded weight and bias (`_folded_call`'s arithmetic)."""
    ndim = w.data.ndim
    scale = conv.scale_origin
    column = wo.step("reshape", scale, shape=(-1,) + (1,) * (ndim - 1)) if scale else None
    f64 = wo.step("astype", wo.operand(w.data), dtype="float64")
    weight = wo.apply("multiply", [f64, column], "float64")
    bias = conv.shift_origin
    if isinstance(b, g.Constant):
        b64 = wo.step("astype", wo.operand(b.data), dtype="float64")
        bias = wo.apply("add", [bias, wo.apply("multiply", [b64, scale], "float64")],
                        "float64")
    dtype = w.data.dtype.name
    for const, origin in ((new_w, weight), (new_b, bias)):
        if origin is not None:
            wo.record(const.data, wo.step("astype", origin, dtype=dtype))
