"""The `T`, `G` and `I` namespaces of the DSL, as Python objects.

The parser reads DSL text by its syntax (`T.serial(4)` is a loop because of
how it is spelled), so these objects matter only where Python itself runs
DSL code: decorators (`@T.prim_func`), parameter annotations evaluated when
the `def` statement runs (`T.Buffer((4,), "float32")`, `n: T.int64`) and
`G.Tensor(...)` types. Everything else raises an error that says the name is
DSL syntax, so a misplaced call fails loudly instead of building nothing.

The attribute tables below are also what the parser checks names against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln._registry import suggest
from kiln.errors import IRError
from kiln.ir.dtype import DTYPES, check_dtype
from kiln.ir.tensor import BUFFER_SCOPES, INTRINSICS, Const
from kiln.ir.types import TensorType, TupleType, Type

# Loop iterators: DSL name -> For.kind.
LOOP_KINDS = {"serial": "serial", "parallel": "parallel", "vectorized": "vectorized",
              "vector": "vector",
              "unrolled": "unrolled", "scalar": "scalar", "block_x": "block_x",
              "thread_x": "thread_x"}

# T.<name>(a, b) that build a BinaryOp (Python operators cover the others).
BINARY_FUNCS = {"min": "min", "max": "max", "truncdiv": "div", "truncmod": "mod"}

# Every T attribute the parser understands, for "did you mean" suggestions.
T_NAMES = frozenset({
    *DTYPES, *LOOP_KINDS, *BINARY_FUNCS, *INTRINSICS,
    "prim_func", "Buffer", "func_attr", "select", "cast", "reinterpret", "call_extern",
    "extern_dependency", "let", "allocate", "alloc_const", "decl_buffer", "evaluate",
    "call_func",
})
G_NAMES = frozenset({"function", "Tensor", "Tuple", "func_attr", "op", "call_tensor", "const",
                     "if_then_else", "loop"})
I_NAMES = frozenset({"ir_module", "module_attrs"})


@dataclass(frozen=True, slots=True)
class BufferAnnotation:
    """What `T.Buffer(shape, dtype)` evaluates to in a parameter annotation."""

    shape: tuple[Any, ...]
    dtype: str
    scope: str = "global"

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.scope not in BUFFER_SCOPES:
            raise IRError(f"unknown buffer scope {self.scope!r}; known: {BUFFER_SCOPES}")


def _dsl_only(ns: str, name: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise IRError(
            f"{ns}.{name} is kiln DSL syntax: it has meaning only inside a function "
            f"decorated with @T.prim_func / @G.function (which is parsed, not run)"
        )

    stub.__name__ = name
    stub.__qualname__ = f"{ns}.{name}"
    return stub


def _typed_literal(dtype: str) -> Callable[[int | float | bool | str], Const]:
    def make(value: int | float | bool | str) -> Const:
        if isinstance(value, str):
            value = float(value)
        return Const(value, dtype)

    make.__name__ = dtype
    make.__qualname__ = f"T.{dtype}"
    make.__doc__ = f"A {dtype} literal; as an annotation (`n: T.{dtype}`) a scalar parameter."
    return make


class _Namespace:
    """Attribute access with a suggestion for misspelled names."""

    _ns = ""
    _names: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._names:
            return _dsl_only(self._ns, name)
        raise AttributeError(
            f"{self._ns} has no attribute {name!r}.{suggest(name, sorted(self._names))}"
        )

    def __repr__(self) -> str:
        return f"<kiln.script namespace {self._ns}>"


class TensorNamespace(_Namespace):
    """`T`: tensor-level functions (loops over buffers)."""

    _ns = "T"
    _names = T_NAMES

    def __init__(self) -> None:
        for name in DTYPES:
            object.__setattr__(self, name, _typed_literal(name))

    @staticmethod
    def prim_func(fn: Any = None, *, name: str | None = None,
                  metadata: Any = None) -> Any:
        """Decorator: parse a tensor-level function (see kiln.script.decorators)."""
        from kiln.script.decorators import (
            decorate_function,  # cycle: kiln.script.parser imports this module
        )

        return decorate_function(fn, "T", name=name, metadata=metadata)

    @staticmethod
    def Buffer(shape: Sequence[Any], dtype: str, scope: str = "global") -> BufferAnnotation:
        """A buffer parameter's annotation: `X: T.Buffer((4,), "float32")`."""
        return BufferAnnotation(tuple(shape), dtype, scope)


class GraphNamespace(_Namespace):
    """`G`: graph-level functions (dataflow over whole tensors)."""

    _ns = "G"
    _names = G_NAMES

    @staticmethod
    def function(fn: Any = None, *, name: str | None = None, metadata: Any = None) -> Any:
        """Decorator: parse a graph-level function (see kiln.script.decorators)."""
        from kiln.script.decorators import (
            decorate_function,  # cycle: kiln.script.parser imports this module
        )

        return decorate_function(fn, "G", name=name, metadata=metadata)

    @staticmethod
    def Tensor(shape: Sequence[Any], dtype: str) -> TensorType:
        """The type of a tensor value: `x: G.Tensor((4,), "float32")`."""
        return TensorType(tuple(shape), dtype)

    @staticmethod
    def Tuple(*fields: Type) -> TupleType:
        """The type of a tuple value: `G.Tuple(G.Tensor(...), G.Tensor(...))`."""
        return TupleType(tuple(fields))


class ModuleNamespace(_Namespace):
    """`I`: the module level (`I.ir_module`, `I.module_attrs`)."""

    _ns = "I"
    _names = I_NAMES

    @staticmethod
    def ir_module(cls: Any = None, *, metadata: Any = None) -> Any:
        """Decorator: parse a class of DSL functions into an IRModule."""
        from kiln.script.decorators import (
            ir_module_at,  # cycle: kiln.script.parser imports this module
        )

        return ir_module_at(cls, metadata=metadata, depth=3)

    @staticmethod
    def module_attrs(attrs: Mapping[str, Any]) -> None:
        """Module attributes, in an `@ir_module` class body (read by the parser).

        Python runs the class body before the decorator parses it, so this
        call must work at run time too; it only checks its argument.
        """
        if not isinstance(attrs, Mapping):
            raise IRError(f"I.module_attrs takes a dict, not {type(attrs).__name__}")


T = TensorNamespace()
G = GraphNamespace()
I = ModuleNamespace()
