"""Fused epilogues of hand-written kernels: an elementwise chain applied as each output is stored.

FuseOps groups the elementwise ops after an anchor op (bias, activations, a
residual add) and offers the group to the op's `lower_fused` hook
(kiln.transform.fuse_ops). The convolution and GEMM kernels build their loop
nests themselves; `fused_store` gives them the kernel's buffers and the
function that turns an accumulator into the chain's final value at an output
index, so the anchor's result is never written and read back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.errors import IRError
from kiln.ir.tensor import Buffer, Load, PrimExpr, as_expr
from kiln.ir.visitor import StmtExprMutator
from kiln.kernels.tiles import Epilogue
from kiln.ops import te


class SubstituteLoad(StmtExprMutator):
    """Replaces every load of `buffer` by `value` (the accumulator being stored)."""

    def __init__(self, buffer: Buffer, value: PrimExpr) -> None:
        self.buffer = buffer
        self.value = value

    def visit_load(self, e: Load) -> PrimExpr:
        if e.buffer is self.buffer:
            return self.value
        return super().visit_load(e)


def float32_operands(operands: Sequence[te.Tensor], result: te.Tensor | None) -> bool:
    """Whether a float32 kernel takes a call: its `operands` (the anchor op's inputs) and
    the fused chain's `result` are float32. The chain's other inputs may have any dtype
    (a causal mask's bool in `Where(mask, scores, -inf)` after an attention product):
    the epilogue reads them as the elementwise ops would."""
    return all(t.dtype == "float32" for t in operands) and (
        result is None or result.dtype == "float32")


@dataclass(frozen=True)
class FusedStore:
    """A hand-written kernel's parameter buffers (by placeholder), its output buffer and
    the epilogue mapping (accumulator, output index) to the stored value."""

    buffers: dict[te.Tensor, Buffer]
    out: Buffer
    epilogue: Epilogue


def fused_store(params: Sequence[te.Tensor], anchor: te.Tensor | None,
                result: te.Tensor | None, anchor_shape: tuple[int, ...],
                bias: te.Tensor | None = None, bias_axis: int = 1) -> FusedStore | None:
    """The buffers and epilogue of a kernel computing `result` (an elementwise chain over
    `anchor`; None: the anchor op alone, whose result has `anchor_shape`) from buffer
    parameters `params`. A `bias` (one of `params`, 1-D) is added to the accumulator
    first, indexed by the output index's `bias_axis` (a convolution's channel). None when
    the chain cannot be inlined into a store (it needs statements: a reduction, a table)."""
    buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
    out = Buffer("out", result.shape if result is not None else anchor_shape,
                 result.dtype if result is not None else "float32")
    value_buf = Buffer("anchor_value", anchor_shape, "float32")
    bias_buf = buffers[bias] if bias is not None else None
    mapping = dict(buffers)
    if anchor is not None:
        mapping[anchor] = value_buf

    def epilogue(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        if bias_buf is not None:
            v = v + bias_buf[idx[bias_axis]]
        if result is None:
            return v
        expr = te.inline_expr(result, idx, mapping)
        return SubstituteLoad(value_buf, v).visit_expr(expr)

    if result is not None:
        try:
            zero = (as_expr(0),) * len(anchor_shape)
            epilogue(value_buf[zero], zero)
        except IRError:
            return None
    return FusedStore(buffers, out, epilogue)
