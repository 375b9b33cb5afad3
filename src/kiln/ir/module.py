"""IRModule: one module holding graph-level and tensor-level functions by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from kiln._registry import suggest
from kiln.errors import IRError
from kiln.ir.graph import Function
from kiln.ir.tensor import PrimFunc

BaseFunc = Function | PrimFunc


class IRModule:
    """An immutable mapping name -> function, plus module attributes.

    Names are C identifiers that do not start with an underscore: each public
    function becomes a symbol of the compiled library under that name.
    """

    __slots__ = ("_attrs", "_functions")

    def __init__(
        self, functions: Mapping[str, BaseFunc] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        funcs = dict(functions or {})
        for name, fn in funcs.items():
            check_function_name(name)
            if not isinstance(fn, (Function, PrimFunc)):
                raise IRError(f"IRModule entry {name!r} is a {type(fn).__name__}, not a function")
        self._functions: Mapping[str, BaseFunc] = MappingProxyType(funcs)
        self._attrs: Mapping[str, Any] = MappingProxyType(dict(attrs or {}))

    @property
    def functions(self) -> Mapping[str, BaseFunc]:
        return self._functions

    @property
    def attrs(self) -> Mapping[str, Any]:
        return self._attrs

    def __getitem__(self, name: str) -> BaseFunc:
        try:
            return self._functions[name]
        except KeyError:
            names = list(self._functions)
            raise IRError(
                f"IRModule has no function {name!r}.{suggest(name, names)} "
                f"Functions: {', '.join(names) or '(none)'}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    def items(self) -> Iterator[tuple[str, BaseFunc]]:
        """(name, function) pairs in module order."""
        return iter(self._functions.items())

    def prim_funcs(self) -> dict[str, PrimFunc]:
        """The tensor-level functions by name."""
        return {k: f for k, f in self._functions.items() if isinstance(f, PrimFunc)}

    def graph_funcs(self) -> dict[str, Function]:
        """The graph-level functions by name."""
        return {k: f for k, f in self._functions.items() if isinstance(f, Function)}

    def with_function(self, name: str, fn: BaseFunc) -> IRModule:
        """A new module with `fn` added under `name` (replacing any function of that name)."""
        return IRModule({**self._functions, name: fn}, self._attrs)

    def without(self, *names: str) -> IRModule:
        """A new module without the functions `names`."""
        return IRModule({k: f for k, f in self._functions.items() if k not in names}, self._attrs)

    def with_attrs(self, **attrs: Any) -> IRModule:
        """A new module with `attrs` added to (or replacing) its attributes."""
        return IRModule(self._functions, {**self._attrs, **attrs})

    def script(self, **kwargs: Any) -> str:
        """The module as kiln.script Python DSL text (see kiln.script.print_module)."""
        from kiln.ir.printer import print_module  # cycle: kiln.ir.printer imports this module

        return print_module(self, **kwargs)

    def __repr__(self) -> str:
        return f"IRModule({', '.join(self._functions)})"


def check_function_name(name: str) -> str:
    """Return `name` if it can name a module function, else raise IRError saying why."""
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise IRError(
            f"function name {name!r} must be a C identifier not starting with '_' "
            "(it becomes a symbol of the compiled library)"
        )
    return name
