"""numpy-style broadcasting for operator definitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from kiln.errors import IRError
from kiln.ir.shape_expr import dim_text, dims_equal, shape_text, simplify_dim
from kiln.ir.tensor import PrimExpr, Var
from kiln.ir.types import Dim, TensorType
from kiln.ops.assumptions import unproven


@overload
def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]: ...


@overload
def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]: ...


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """The numpy broadcast of `shapes`; IRError naming both shapes when they clash.

    A symbolic dimension is taken to be other than 1 (it broadcasts against 1 and
    against itself); two symbolic dimensions must be provably equal.
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            pos = rank - len(s) + k
            d = simplify_dim(d)
            if isinstance(out[pos], int) and out[pos] == 1:
                out[pos] = d
            elif not (isinstance(d, int) and d == 1) and dims_equal(out[pos], d) is not True:
                text = (f"shapes {[shape_text(x) for x in shapes]} do not broadcast "
                        f"(dimension {pos}: {dim_text(out[pos])} vs {dim_text(d)})")
                if dims_equal(out[pos], d) is not None:
                    raise IRError(text)
                unproven(text, out[pos], d)
    return tuple(out)


def broadcast_types(types: Sequence[TensorType], dtype: str | None = None) -> TensorType:
    """The result type of a broadcasting op: broadcast shape, common dtype (or `dtype`)."""
    dtypes = {t.dtype for t in types}
    if dtype is None:
        if len(dtypes) != 1:
            raise IRError(f"operand dtypes differ: {sorted(dtypes)}; insert a Cast")
        dtype = dtypes.pop()
    return TensorType(broadcast_shapes(*[t.shape for t in types]), dtype)


def broadcast_index(out_idx: Sequence[PrimExpr | Var], in_shape: Sequence[Dim]
                    ) -> tuple[PrimExpr | int, ...]:
    """The input index that output index `out_idx` reads under broadcasting."""
    offset = len(out_idx) - len(in_shape)
    return tuple(0 if isinstance(d, int) and d == 1 else out_idx[offset + k]
                 for k, d in enumerate(in_shape))
