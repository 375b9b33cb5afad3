"""The ONNX-to-kiln mapping table: the converter registry, the `GraphContext` a
converter is given, and the helpers converters share.

A converter receives the graph builder of the importer, the node's inputs as
graph expressions (None for an omitted optional input), its attributes already
decoded into Python values, and returns one expression per node output. It
imports nothing from onnx: the importer decodes protobufs. The converters live in
the modules of this package, one beside each `kiln.ops` module whose operators they
map to (`converters/nn.py` for `ops/nn.py`'s); `converters()` loads them on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kiln._registry import Registry
from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.pin_hint import pin_hint_for
from kiln.ir.shape_expr import dim_text
from kiln.ops.registry import load_builtin_ops

if TYPE_CHECKING:
    from kiln.ir.types import Dim, TensorType


class GraphContext(Protocol):
    """What a converter may ask of the importer."""

    opset: int
    # The output names of the node being converted ("" for an omitted optional output).
    node_outputs: tuple[str, ...]

    def call(self, op: str, *args: g.Expr, **attrs: Any) -> g.Expr:
        """Emit (or constant-fold) an operator call."""
        ...

    def require_nonzero(self, size: Dim, what: str) -> None:
        """Make a call fail (CallError naming this node and `what`) when `size`, which the
        node divides by, is 0; a constant 0 fails the import."""
        ...

    def size_is(self, size: Dim, value: int, what: str) -> None:
        """The node's contract says `size` is `value`: a free symbolic input dimension
        standing for it is pinned to `value` (the import starts again); others are left
        to the operators that need the sizes equal."""
        ...

    def const(self, data: np.ndarray | float | int, dtype: str | None = None) -> g.Expr:
        ...

    def value(self, expr: g.Expr | None) -> np.ndarray | None:
        """The constant value of `expr`, or None when it is not known at compile time."""
        ...

    def tensor_type(self, expr: g.Expr) -> TensorType:
        ...

    def true_of_shape(self, shape: Sequence[Any]) -> g.Expr:
        """An all-true bool tensor of `shape` (dimensions; symbolic ones read at run time
        from the model's inputs): `where(it, x, x)` broadcasts `x` to `shape`."""
        ...

    def dims(self, expr: g.Expr | None) -> np.ndarray | None:
        """The value of `expr` as dimensions: its constant value, or for a shape computed
        from symbolic dimensions an object array of ints and PrimExprs (None: unknown)."""
        ...

    def item(self, expr: g.Expr, index: int) -> g.Expr:
        """Element `index` of a tuple-valued expression."""
        ...

    def why_unknown(self, expr: g.Expr | None) -> str:
        """Why `expr` has no compile-time value when the fold budget is the reason, else ""."""
        ...

    def check_materialize(self, nbytes: int, what: str) -> None:
        """IRError naming `what` if a constant of `nbytes` exceeds the fold budget."""
        ...

    def outer(self, expr: g.Expr) -> g.Expr:
        """In a body that `loop` builds, `expr` (a value of the graph around it) as the
        body reads it; elsewhere `expr` itself."""
        ...

    def loop(self, hint: str, trip: g.Expr, states: Sequence[g.Expr], length: Dim,
             step: LoopStep) -> list[g.Expr]:
        """A graph Loop of `trip` iterations (0-d int64) whose body function (named after
        `hint`) `step(body, iteration, states) -> (new states, scan values)` emits into
        `body`, a GraphContext that reads this graph's values through `body.outer`: the
        final states, then each scan value stacked along a new leading axis of `length`."""
        ...


# (the body's context, the iteration, the loop-carried values) -> (their new values, the
# iteration's scan values): a loop body a converter builds (GraphContext.loop)
LoopStep = Callable[[GraphContext, g.Expr, list[g.Expr]], tuple[list[g.Expr], list[g.Expr]]]


Converter = Callable[[GraphContext, Sequence["g.Expr | None"], dict[str, Any]], Sequence[g.Expr]]


@dataclass(frozen=True)
class OnnxConverter:
    op_type: str
    fn: Converter
    min_opset: int = 1


ONNX_CONVERTERS: Registry[OnnxConverter] = Registry("ONNX operator")


def onnx_op(*op_types: str, min_opset: int = 1) -> Callable[[Converter], Converter]:
    """Register `fn` as the converter of ONNX `op_types`."""
    def deco(fn: Converter) -> Converter:
        for t in op_types:
            ONNX_CONVERTERS.register(t, OnnxConverter(t, fn, min_opset))
        return fn
    return deco


def converters() -> Registry[OnnxConverter]:
    """The ONNX converter registry, with the built-in converters loaded (the modules
    kiln.frontend.onnx.converters.builtin lists, and the operators they map to)."""

    load_builtin_ops()
    import kiln.frontend.onnx.converters.builtin  # lazy: loaded on first use (registry)  # noqa: F401  (registers the converters)

    return ONNX_CONVERTERS


# ------------------------------------------------------------------ converter helpers
def first_input(inputs: Sequence[g.Expr | None]) -> g.Expr:
    """The node's first input, which must be present."""
    x = inputs[0]
    if x is None:
        raise IRError("the first input is missing")
    return x


def check_per_channel(ctx: GraphContext, v: g.Expr, x: g.Expr, what: str,
                      counts: Sequence[int] = ()) -> None:
    """`v` must be a 1-D vector of one value per channel (dimension 1) of `x`, or of
    one of `counts` values (a GroupNormalization scale per group): an IRError naming
    `what` otherwise. Broadcasting would make a vector of the wrong length a new
    channel dimension (4 scale values on a 1-channel input: 4 output channels)."""
    vt, xt = ctx.tensor_type(v), ctx.tensor_type(x)
    channels = xt.shape[1] if xt.ndim > 1 else None
    if vt.ndim != 1:
        raise IRError(f"{what} must be 1-D, one value per channel; got shape "
                      f"{list(vt.shape)}")
    if not isinstance(channels, int) or not isinstance(vt.shape[0], int):
        return  # a symbolic channel count: the broadcast checks it at run time
    if vt.shape[0] != channels and vt.shape[0] not in counts:
        raise IRError(f"{what} has {vt.shape[0]} values for an input of {channels} "
                      "channels: one per channel is required")


def onnx_dtype(code: int, what: str) -> str:
    """The kiln dtype of the ONNX element type number `code`, an attribute such as Cast's
    `to` (`what` names it in the error)."""
    from onnx import TensorProto, helper  # optional: onnx (the compiler extra)

    try:
        np_type = helper.tensor_dtype_to_np_dtype(code)
    except KeyError:  # no element type has this number
        raise IRError(f"{what} {code} is not an ONNX element type") from None
    try:
        return dt.from_numpy(np_type)
    except IRError:
        raise IRError(f"{what} is {TensorProto.DataType.Name(code)}, an element type kiln "
                      f"does not compute with; known: {', '.join(dt.DTYPES)}") from None


def need_constant(ctx: GraphContext, expr: g.Expr | None, what: str) -> np.ndarray:
    """The compile-time value of input `expr` (`what` names it in the error)."""
    value = ctx.value(expr)
    if value is None:
        reason = ctx.why_unknown(expr)
        raise IRError(f"{what} must be a compile-time constant (kiln needs static shapes)"
                      + (f"; {reason}" if reason else ""))
    return value


def need_dims(ctx: GraphContext, expr: g.Expr | None, what: str) -> np.ndarray:
    """The value of input `expr` as dimensions (ints and symbolic PrimExprs, see
    GraphContext.dims); `what` names it in the error."""
    value = ctx.dims(expr)
    if value is None:
        return need_constant(ctx, expr, what)
    return value


def need_static(ctx: GraphContext, expr: g.Expr | None, what: str) -> np.ndarray:
    """The compile-time value of input `expr` as a flat array, which must not depend on a
    symbolic dimension (`what` names it in the error)."""
    value = ctx.dims(expr)
    if value is not None and value.dtype == object:
        shown = ", ".join(dim_text(d) for d in value.reshape(-1))

        raise IRError(f"{what} is [{shown}]: it depends on a symbolic dimension, and kiln "
                      f"needs it at compile time; {pin_hint_for(value.reshape(-1))}")
    return need_constant(ctx, expr, what).reshape(-1) if value is None else value.reshape(-1)
