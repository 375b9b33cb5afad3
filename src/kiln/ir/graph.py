"""Graph-level IR: dataflow over whole tensors.

A graph `Function` is in A-normal form: parameters, a flat list of bindings
`var = expr`, and a result. Expressions are operator calls (`Call`, with
attributes), destination-passing calls into tensor-level functions of the same
module (`CallTensor`), constants (weights), tuples and tuple projections.
Nodes compare by identity; `kiln.ir.structural_equal` compares structure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.dtype import from_numpy
from kiln.ir.tensor import readonly_array
from kiln.ir.types import TensorType, TupleType, Type

# Attribute values of operator calls and functions: JSON-like scalars and tuples.
AttrValue = int | float | str | bool | None | tuple[Any, ...]


class Expr:
    """Base of graph-level expressions; every expression has a `type`."""

    __slots__ = ()
    __hash__ = object.__hash__

    @property
    def type(self) -> Type:
        raise NotImplementedError


# weakref_slot: kiln.ir.source_nodes keys its side table by the variable, weakly.
@dataclass(frozen=True, eq=False, slots=True, weakref_slot=True)
class Var(Expr):
    """A function parameter or a binding's name. `name` is a hint."""

    name: str
    var_type: Type

    @property
    def type(self) -> Type:
        return self.var_type


@dataclass(frozen=True, eq=False, slots=True)
class Constant(Expr):
    """A constant tensor (a weight). The array is stored read-only."""

    data: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", readonly_array(self.data))

    @property
    def type(self) -> TensorType:
        return TensorType(tuple(int(d) for d in self.data.shape), from_numpy(self.data.dtype))


def freeze_attrs(attrs: Mapping[str, Any]) -> Mapping[str, AttrValue]:
    """Canonical read-only attributes: lists become tuples, numpy scalars Python scalars."""

    def norm(v: Any) -> AttrValue:
        if isinstance(v, (list, tuple)):
            return tuple(norm(x) for x in v)
        if isinstance(v, np.generic):
            return v.item()
        if v is None or isinstance(v, (int, float, str, bool)):
            return v
        raise IRError(f"attribute value {v!r} ({type(v).__name__}) is not int/float/str/bool/tuple")

    return MappingProxyType({k: norm(attrs[k]) for k in sorted(attrs)})


class _Returns(Expr):
    """An expression whose type is its `ret_type` field (calls and control flow)."""

    __slots__ = ()
    ret_type: Type

    @property
    def type(self) -> Type:
        return self.ret_type


@dataclass(frozen=True, eq=False, slots=True)
class Call(_Returns):
    """Operator call `op(*args, **attrs)` whose result has type `ret_type`."""

    op: str
    args: tuple[Expr, ...]
    attrs: Mapping[str, AttrValue]
    ret_type: Type

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "attrs", freeze_attrs(self.attrs))


@dataclass(frozen=True, eq=False, slots=True)
class CallTensor(_Returns):
    """Call tensor-level function `func` in destination-passing style.

    The caller allocates outputs of `ret_type` (a tensor, or a tuple for several
    outputs) and calls `func(*args, *outputs)`.
    """

    func: str
    args: tuple[Expr, ...]
    ret_type: Type

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        t = self.ret_type
        fields = t.fields if isinstance(t, TupleType) else (t,)
        for f in fields:
            if not isinstance(f, TensorType):
                raise IRError(f"call_tensor output {f} is not a tensor")
        return tuple(f for f in fields if isinstance(f, TensorType))


@dataclass(frozen=True, eq=False, slots=True)
class If(_Returns):
    """`then_branch(*args)` when the 0-d bool tensor `cond` is true, else `else_branch(*args)`.

    Both branches are graph functions of the same module taking `args` and
    returning `ret_type` (the ONNX importer passes each branch every outer value
    either branch reads, so both take the same parameters).
    """

    cond: Expr
    args: tuple[Expr, ...]
    then_branch: str
    else_branch: str
    ret_type: Type

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))


@dataclass(frozen=True, eq=False, slots=True)
class Loop(Expr):
    """A loop running graph function `body` while `iteration < trip_count` and `cond`.

    `trip_count` (a 0-d int64 tensor) and `cond` (0-d bool) may each be None: no
    bound, or no initial condition (true). `body(iteration, cond, *states,
    *captures)` takes the iteration number (0-d int64), the current condition (0-d
    bool), the loop-carried values and the loop-invariant values it reads, and
    returns `(cond, *new_states, *scan_values)`. The loop's value is the tuple
    `(*final_states, *scan_outputs)` (`ret_type`): each scan output stacks the
    per-iteration `scan_values` along a new leading axis, whose size the type gives
    (the loop must run exactly that many iterations). This is ONNX's Loop; ONNX
    Scan imports as a Loop over slices (kiln/frontend/onnx/control_flow.py).
    """

    body: str
    trip_count: Expr | None
    cond: Expr | None
    states: tuple[Expr, ...]
    captures: tuple[Expr, ...]
    ret_type: TupleType

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", tuple(self.states))
        object.__setattr__(self, "captures", tuple(self.captures))

    @property
    def type(self) -> TupleType:
        return self.ret_type

    @property
    def num_scan_outputs(self) -> int:
        return len(self.ret_type.fields) - len(self.states)


@dataclass(frozen=True, eq=False, slots=True)
class Tuple(Expr):
    """A tuple of values (several results, or a tuple-typed argument)."""

    fields: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    @property
    def type(self) -> TupleType:
        return TupleType(tuple(f.type for f in self.fields))


@dataclass(frozen=True, eq=False, slots=True)
class TupleGetItem(Expr):
    """Field `index` of a tuple-typed value."""

    tuple_value: Expr
    index: int

    @property
    def type(self) -> Type:
        t = self.tuple_value.type
        if not isinstance(t, TupleType) or not 0 <= self.index < len(t.fields):
            raise IRError(f"TupleGetItem index {self.index} does not fit type {t}")
        return t.fields[self.index]


@dataclass(frozen=True, eq=False, slots=True)
class Binding:
    """`var = value` inside a graph function."""

    var: Var
    value: Expr


@dataclass(frozen=True, eq=False, slots=True)
class Function:
    """A graph-level function: params, bindings in order, and a result expression."""

    params: tuple[Var, ...]
    bindings: tuple[Binding, ...]
    result: Expr
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "bindings", tuple(self.bindings))
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    @property
    def ret_type(self) -> Type:
        return self.result.type

    def with_attrs(self, **attrs: Any) -> Function:
        """This function with `attrs` added to (or replacing) its attributes."""
        return Function(self.params, self.bindings, self.result, {**self.attrs, **attrs})
