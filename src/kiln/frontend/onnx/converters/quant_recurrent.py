"""onnxruntime's com.microsoft DynamicQuantizeLSTM: the LSTM `quantize_dynamic` writes.

`onnxruntime.quantization.quantize_dynamic` replaces every LSTM whose weights are
constants by this node (its default operator types include LSTM): `W` and `R` stored as
int8 or uint8 in the `[num_directions, in, 4 * hidden]` layout (transposed from ONNX's),
with a scale and zero point per direction or per column, and the gates computed as
onnxruntime's LSTM does with its two products on integers:

- x @ W for every step at once: `X` (all steps, all batch entries) quantized to uint8
  with one dynamic scale and zero point (DynamicQuantizeLinear's formula), the u8 x W
  product in int32, times `x_scale * W_scale[column]`;
- h @ R at each step: that step's `h` quantized the same way (its own range), the
  product in int32 times `h_scale * R_scale[column]`, added to the x @ W term;
- then the bias `Wb + Rb`, `clip`, the activations and the state update as ONNX's LSTM.

The unrolled node is converters.recurrent's with `QuantizedCell` answering for the
products; a weight zero point is one value per direction, as onnxruntime reads it.

Which rows share a range changes the results, so the unrolled steps keep onnxruntime's
order of rows (`Cell.rows_together`): with `sequence_lens`, X quantized up to the
longest row, a reversed direction run over each row's own reversed steps, and a
finished row's h read as 0 when Y is an output. onnxruntime splits a batch of 2 or more
rows between its threads and quantizes each part of h on its own range, so its results
depend on its thread count; kiln's are those of one thread (every row on one range).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.quant import MS
from kiln.frontend.onnx.converters.recurrent import Cell, take_range, unroll
from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.ir import graph as g

#: DynamicQuantizeLSTM's inputs after ONNX LSTM's eight: W_scale, W_zero_point,
#: R_scale, R_zero_point.
QUANT_INPUTS = 4


def _per_direction(ctx: GraphContext, v: g.Expr, d: int, what: str) -> g.Expr:
    """Direction `d`'s scale or zero point: a scalar (`[dirs]`) or one per column
    (`[dirs, 4 * hidden]` -> `[4 * hidden]`)."""
    shape = tuple(ctx.tensor_type(v).shape)
    if len(shape) not in (1, 2):
        raise IRError(f"DynamicQuantizeLSTM: {what} has shape {shape}: one value per "
                      "direction, or one per direction and column")
    part = take_range(ctx, v, 0, d, d + 1)
    return ctx.call("reshape", part, shape=shape[1:])


def _weight_zero_point(ctx: GraphContext, zp: g.Expr, d: int, what: str) -> g.Expr:
    """Direction `d`'s weight zero point as the integer product takes it, a scalar:
    onnxruntime reads one value per direction (and refuses per-column zero points that
    differ, or that are not 0 for int8 weights)."""
    value = ctx.value(zp)
    if value is None:
        raise IRError(f"DynamicQuantizeLSTM: the {what} zero point must be a constant")
    flat = value[d].reshape(-1) if value.ndim else value.reshape(-1)
    if flat.size and np.any(flat != flat[0]):
        raise IRError(f"DynamicQuantizeLSTM: the {what} zero points of a direction differ "
                      f"({flat.min()}..{flat.max()}): onnxruntime takes one per direction")
    return ctx.const(np.asarray(flat[0] if flat.size else 0, dtype=value.dtype))


class QuantizedCell(Cell):
    """A direction of DynamicQuantizeLSTM: its products on integers (module docstring).
    `quantized_x` is `X` quantized once for the whole node (data, scale, zero point)."""

    #: h is quantized on the range of all the rows a product takes (`Cell.rows_together`)
    rows_together = True

    def __init__(self, ctx: GraphContext, inputs: Sequence[g.Expr | None], d: int,
                 gates: int, hidden: int, x: g.Expr,
                 quantized_x: tuple[g.Expr, g.Expr, g.Expr]) -> None:
        w, r, b = inputs[1], inputs[2], inputs[3]
        w_scale, w_zp, r_scale, r_zp = inputs[8:12]
        assert w is not None and r is not None and w_scale is not None and r_scale is not None
        assert w_zp is not None and r_zp is not None
        self.ctx, self.h, self.x, self.gates = ctx, hidden, x, gates
        self.xq, self.x_scale, self.x_zp = quantized_x
        self.w, self.r = self._columns(w, d), self._columns(r, d)
        self.w_scale = _per_direction(ctx, w_scale, d, "W_scale")
        self.r_scale = _per_direction(ctx, r_scale, d, "R_scale")
        self.w_zp = _weight_zero_point(ctx, w_zp, d, "W")
        self.r_zp = _weight_zero_point(ctx, r_zp, d, "R")
        self.bias: g.Expr | None = None
        self.wb: g.Expr | None = None  # as Cell's: whether the node has a bias B
        if b is not None:  # onnxruntime adds Wb + Rb once, after both products
            bd = take_range(ctx, b, 0, d, d + 1)
            self.wb = take_range(ctx, bd, 1, 0, gates * hidden)
            self.bias = ctx.call("add", self.wb,
                                 take_range(ctx, bd, 1, gates * hidden, 2 * gates * hidden))
        self._inputs: g.Expr | None = None
        self._hr: tuple[g.Expr, g.Expr] | None = None

    def _columns(self, m: g.Expr, d: int) -> g.Expr:
        # [dirs, in, 4H] -> direction d: [in, 4H] (already laid out for x @ W; a 2-D
        # constant, which the integer product packs at compile time)
        part = take_range(self.ctx, m, 0, d, d + 1)
        return self.ctx.call("reshape", part, shape=tuple(self.ctx.tensor_type(part).shape[1:]))

    def _integer_product(self, q: g.Expr, zp: g.Expr, scale: g.Expr, m: g.Expr,
                         m_zp: g.Expr, m_scale: g.Expr) -> g.Expr:
        acc = self.ctx.call("matmul_integer", q, m, zp, m_zp)
        factor = self.ctx.call("multiply", scale, m_scale)
        return self.ctx.call("multiply", self.ctx.call("cast", acc, dtype="float32"), factor)

    @property
    def sequence(self) -> g.Expr:
        """What the x products read: the quantized `X`."""
        return self.xq

    def step_inputs(self) -> g.Expr:
        """x @ W of every step and gate on integers (the bias comes after h @ R)."""
        if self._inputs is None:
            self._inputs = self._integer_product(self.sequence, self.x_zp, self.x_scale,
                                                 self.w, self.w_zp, self.w_scale)
        return self._inputs

    def reverse_rows(self, lens: g.Expr) -> None:
        self.xq = self.ctx.call("reverse_sequence", self.xq, lens, batch_axis=1, time_axis=0)
        self._inputs = None

    def _every_hr(self, h: g.Expr) -> g.Expr:
        """h quantized on its own range, times R for every gate."""
        t = self.ctx.call("dynamic_quantize_linear", h)
        return self._integer_product(self.ctx.item(t, 0), self.ctx.item(t, 2),
                                     self.ctx.item(t, 1), self.r, self.r_zp, self.r_scale)

    def pre(self, xt: g.Expr, h: g.Expr, k: int) -> g.Expr:
        """(x @ W_k + h @ R_k) + (Wb_k + Rb_k), onnxruntime's order."""
        z = self.ctx.call("add", self.xw(xt, k), self.hr(h, k))
        return z if self.bias is None else self.ctx.call("add", z, self.gate(self.bias, k))


@onnx_op(MS + "DynamicQuantizeLSTM")
def _dynamic_quantize_lstm(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    """com.microsoft DynamicQuantizeLSTM (module docstring), unrolled like LSTM."""
    padded = list(inputs) + [None] * (8 + QUANT_INPUTS - len(inputs))
    if any(v is None for v in padded[8:]) or padded[0] is None:
        raise IRError("DynamicQuantizeLSTM: X, W_scale, W_zero_point, R_scale and "
                      "R_zero_point are required")
    if int(attrs.get("layout", 0)):
        raise IRError("DynamicQuantizeLSTM: layout 1 is not an attribute of this node")
    if "hidden_size" not in attrs:  # R is [dirs, hidden, 4 * hidden] here
        attrs = {**attrs, "hidden_size": ctx.tensor_type(padded[2]).shape[1]} \
            if padded[2] is not None else attrs
    x, lens = padded[0], padded[4]
    steps = ctx.tensor_type(x).shape[0]
    if lens is not None and isinstance(steps, int):  # (a symbolic one is refused by unroll)
        # onnxruntime quantizes the steps up to the longest row only: the others as 0,
        # which every range holds anyway
        index = ctx.const(np.arange(steps, dtype=ctx.tensor_type(lens).dtype).reshape(-1, 1))
        longest = ctx.call("reduce_max", lens, axes=(0,), keepdims=True)
        inside = ctx.call("reshape", ctx.call("less", index, longest), shape=(steps, 1, 1))
        x = ctx.call("where", inside, x, ctx.const(np.zeros((), np.float32)))
    t = ctx.call("dynamic_quantize_linear", x)
    quantized = (ctx.item(t, 0), ctx.item(t, 1), ctx.item(t, 2))

    def cell(ctx: GraphContext, lstm_inputs: Sequence[g.Expr | None], d: int, gates: int,
             hidden: int, x: g.Expr) -> Cell:
        # in a loop's body (a symbolic sequence length) the weights are outer values; the
        # quantized X is not read there (its products are made before the loop)
        return QuantizedCell(ctx, [None if v is None else ctx.outer(v) for v in padded], d,
                             gates, hidden, x, quantized)

    return unroll("LSTM", ctx, padded[:8], attrs, cell, transposed=True)
