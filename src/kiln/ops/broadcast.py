"""numpy-style broadcasting for operator definitions."""

from __future__ import annotations

from collections.abc import Sequence

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, Var
from kiln.ir.types import TensorType


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The numpy broadcast of `shapes`; IRError naming both shapes when they clash."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, d in enumerate(s):
            pos = rank - len(s) + k
            if out[pos] == 1:
                out[pos] = int(d)
            elif d not in (1, out[pos]):
                raise IRError(f"shapes {[tuple(x) for x in shapes]} do not broadcast "
                              f"(dimension {pos}: {out[pos]} vs {d})")
    return tuple(out)


def broadcast_types(types: Sequence[TensorType], dtype: str | None = None) -> TensorType:
    """The result type of a broadcasting op: broadcast shape, common dtype (or `dtype`)."""
    dtypes = {t.dtype for t in types}
    if dtype is None:
        if len(dtypes) != 1:
            raise IRError(f"operand dtypes differ: {sorted(dtypes)}; insert a Cast")
        dtype = dtypes.pop()
    return TensorType(broadcast_shapes(*[t.shape for t in types]), dtype)  # type: ignore[arg-type]


def broadcast_index(out_idx: Sequence[PrimExpr | Var], in_shape: Sequence[int]
                    ) -> tuple[PrimExpr | int, ...]:
    """The input index that output index `out_idx` reads under broadcasting."""
    offset = len(out_idx) - len(in_shape)
    return tuple(0 if d == 1 else out_idx[offset + k] for k, d in enumerate(in_shape))
