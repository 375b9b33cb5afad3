"""The kernel of `cblas_matmul` (kiln.ops.cblas): one `cblas_sgemm` call.

A's leading dimensions are the rows of one row-major call writing `out` (any ISA: the
library has its own kernels); FuseOps' elementwise tail then runs over `out` in place.
The call's buffers are read by the library, not by kiln's code (`ATTR_EXTERN_READS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_EXTERN_READS
from kiln.ir.tensor import (
    Buffer,
    CallExtern,
    Const,
    Evaluate,
    For,
    PrimFunc,
    SeqStmt,
    Stmt,
    Store,
    Var,
)
from kiln.ir.types import TensorType
from kiln.ops import te
from kiln.ops.cblas import CBLAS, NAME, NO_TRANS, ROW_MAJOR, TRANS
from kiln.ops.registry import get_op
from kiln.target.isa import ISA


def _i32(v: int) -> Const:
    return Const(v, "int32")


@dataclass(frozen=True)
class CBLASLowering:
    """`cblas_matmul`'s kernel (a kiln.kernels.lowering.Lowering), on static shapes."""

    supports_symbolic: bool = False
    fuses_producers: bool = False

    def builds(self, call: g.Call) -> bool:
        """Every call (of static shapes: the `use-cblas` pass makes no other)."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The sgemm call writing `out`, then FuseOps' elementwise tail (`result` over
        `anchor`) applied to `out` in place; None when an operand is computed inside the
        group (FuseOps then lowers it through tensor expressions)."""
        if any(a not in params for a in args[:2]):
            return None
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        a, b = buffers[args[0]], buffers[args[1]]
        out_t = get_op(NAME).infer_type(
            [TensorType(a.shape, a.dtype), TensorType(b.shape, b.dtype)], attrs)
        assert isinstance(out_t, TensorType)
        shape = out_t.static_shape
        final = result if result is not None and result is not anchor else None
        out = Buffer("out", shape, final.dtype if final is not None else "float32")
        trans_b = bool(attrs.get("transpose_b"))
        k = a.shape[-1]
        m = int(np.prod(a.shape[:-1]))
        n = shape[-1]
        call_args = (_i32(ROW_MAJOR), _i32(NO_TRANS), _i32(TRANS if trans_b else NO_TRANS),
                     _i32(m), _i32(n), _i32(k), Const(1.0, "float32"), a, _i32(k), b,
                     _i32(k if trans_b else n), Const(0.0, "float32"), out, _i32(n))
        body: Stmt = Evaluate(CallExtern("cblas_sgemm", call_args, "int32", CBLAS))
        if final is not None:
            if out.dtype != "float32" or anchor is None:
                return None
            idx = tuple(Var(f"i{d}", "int64") for d in range(len(shape)))
            try:
                value = te.inline_expr(final, idx, {**buffers, anchor: out})
            except IRError:  # an epilogue needing statements: not fused here
                return None
            loop: Stmt = Store(out, value, idx)
            for d in reversed(range(len(shape))):
                loop = For(idx[d], Const(0, "int64"), Const(shape[d], "int64"), "serial", loop)
            body = SeqStmt((body, loop))
        return PrimFunc((*(buffers[t] for t in params), out), body,
                        {ATTR_EXTERN_READS: (a.name, b.name)})


CBLAS_MATMUL = CBLASLowering()
