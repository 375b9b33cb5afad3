"""Fused epilogues of hand-written kernels: an elementwise chain applied as each output is stored.

FuseOps groups the elementwise ops after an anchor op (bias, activations, a
residual add) and offers the group to the op's `lower_fused` hook
(kiln.transform.fuse_ops). The convolution and GEMM kernels build their loop
nests themselves; `fused_store` gives them the kernel's buffers and the
function that turns an accumulator into the chain's final value at an output
index, so the anchor's result is never written and read back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, Load, PrimExpr, PrimFunc, as_expr
from kiln.ir.visitor import StmtExprMutator
from kiln.ops import te
from kiln.ops.conv_kernels import Epilogue
from kiln.ops.registry import OpDef


class _Substitute(StmtExprMutator):
    """Replaces every load of `buffer` by `value` (the accumulator being stored)."""

    def __init__(self, buffer: Buffer, value: PrimExpr) -> None:
        self.buffer = buffer
        self.value = value

    def visit_load(self, e: Load) -> PrimExpr:
        if e.buffer is self.buffer:
            return self.value
        return super().visit_load(e)


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
        return _Substitute(value_buf, v).visit_expr(expr)

    if result is not None:
        try:
            zero = (as_expr(0),) * len(anchor_shape)
            epilogue(value_buf[zero], zero)
        except IRError:
            return None
    return FusedStore(buffers, out, epilogue)


@dataclass(frozen=True)
class HandKernelOp(OpDef):
    """An anchor op whose kernel is built by hand: `lower_fused` builds it (with a fused
    epilogue or alone); `legalize` uses it for the op alone, falling back to the
    tensor-expression definition when it returns None."""

    def legalize(self, call: g.Call) -> tuple[PrimFunc, str]:
        types = [a.type for a in call.args]
        inputs = [te.placeholder(t.static_shape, t.dtype, f"x{k}")  # type: ignore[union-attr]
                  for k, t in enumerate(types)]
        prim = self.lower_fused(inputs, inputs, call.attrs, None, None, self.name)
        if prim is None:
            return super().legalize(call)
        return prim, self.name

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str) -> PrimFunc | None:
        """The kernel computing `result` (an elementwise chain over `anchor`, this op applied
        to `args`; None: the op alone) with buffer parameters `params` + the output, or
        None when the hand-written kernel does not apply (FuseOps then lowers the group
        through tensor expressions)."""
        return None
