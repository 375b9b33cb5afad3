"""Value types of graph-level expressions: tensors and tuples (frozen, compared by value)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from kiln.errors import IRError
from kiln.ir.dtype import check_dtype

if TYPE_CHECKING:
    from kiln.ir.tensor import PrimExpr

# A dimension is a static int, or an int64 PrimExpr over dimension variables (a symbolic
# size, kiln.ir.shape_expr).
Dim = Union[int, "PrimExpr"]


@dataclass(frozen=True, slots=True)
class TensorType:
    """A dense, row-major tensor of `dtype` with `shape`."""

    shape: tuple[Dim, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        check_dtype(self.dtype)
        for d in self.shape:
            if isinstance(d, bool) or (isinstance(d, int) and d < 0):
                raise IRError(f"bad dimension {d!r} in shape {self.shape}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; IRError if a dimension is symbolic."""
        out: list[int] = []
        for d in self.shape:
            if not isinstance(d, int):
                from kiln.ir.shape_expr import (
                    shape_text,  # cycle: kiln.ir.shape_expr imports this module
                )

                raise IRError(f"shape {shape_text(self.shape)} is not static")
            out.append(d)
        return tuple(out)

    def numel(self) -> int:
        n = 1
        for d in self.static_shape:
            n *= d
        return n

    def __str__(self) -> str:
        return f"Tensor({tuple(self.shape)}, {self.dtype!r})"

    def __eq__(self, other: object) -> bool:
        """Same dtype and shape; symbolic dimensions are equal when they are for every
        value of their variables (two ops' separately built expressions of one size, not
        the same objects: compared by identity, every pass would see them differ)."""
        if not isinstance(other, TensorType):
            return NotImplemented
        if self.dtype != other.dtype or len(self.shape) != len(other.shape):
            return False
        if self.shape == other.shape:
            return True
        from kiln.ir.shape_expr import shapes_equal  # cycle: kiln.ir.shape_expr imports this module

        return shapes_equal(self.shape, other.shape)

    def __hash__(self) -> int:
        # symbolic dims hash alike: equal types must hash equal
        return hash((self.dtype, tuple(d if isinstance(d, int) else None for d in self.shape)))


@dataclass(frozen=True, slots=True)
class TupleType:
    """A tuple of values, e.g. the results of a function with several outputs."""

    fields: tuple[Type, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    def __str__(self) -> str:
        return f"Tuple({', '.join(str(f) for f in self.fields)})"


Type = TensorType | TupleType
