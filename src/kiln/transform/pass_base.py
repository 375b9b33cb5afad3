"""Passes: `IRModule -> IRModule` rewrites with a name and options.

A pass is a small class: a `name`, its options as dataclass fields, and
`run(mod)`. Calling a pass (`p(mod)`) runs it inside the current
`PassContext`, which applies the instruments (timing, IR dumps) and the
disabled-pass list. `Sequential` chains passes into a pipeline.

    @dataclass(frozen=True)
    class DropAttr(FunctionPass):
        name = "drop-attr"
        key: str = "note"

        def run_on_function(self, func, name, mod):
            return func.with_attrs(**{self.key: None})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from kiln.errors import CompileError
from kiln.ir.graph import Function
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.tensor import PrimFunc
from kiln.transform.context import PassContext

FUNCTION_LEVELS = ("tensor", "graph", "all")


class Pass:
    """Base of every pass. Subclasses set `name` and implement `run`.

    Options are dataclass fields of the subclass (declare it
    `@dataclass(frozen=True)`), so a pass prints, compares and hashes by value.
    """

    name: str = ""

    def run(self, mod: IRModule) -> IRModule:
        """Transform `mod` and return the new module (never mutate the input)."""
        raise NotImplementedError(f"pass {type(self).__name__} does not implement run()")

    def __call__(self, mod: IRModule) -> IRModule:
        """Run the pass under the current PassContext (instruments, disabled passes)."""

        return PassContext.current().run_pass(self, mod)

    @property
    def is_container(self) -> bool:
        """True for passes that only run other passes (instruments may skip them)."""
        return False

    def options(self) -> dict[str, Any]:
        """The pass's options, by field name."""
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


class FunctionPass(Pass):
    """A pass that rewrites functions one at a time.

    `level` selects which functions it sees: "tensor" (PrimFuncs), "graph"
    (graph Functions) or "all". `run_on_function` returns the new function
    (or the same object when nothing changed).
    """

    level: str = "tensor"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> BaseFunc:
        raise NotImplementedError(
            f"function pass {type(self).__name__} does not implement run_on_function()")

    def run(self, mod: IRModule) -> IRModule:
        if self.level not in FUNCTION_LEVELS:
            raise CompileError(
                f"pass '{self.name}': level must be one of {FUNCTION_LEVELS}, got {self.level!r}")
        changed: dict[str, BaseFunc] = {}
        for fname, func in mod.items():
            if not _at_level(func, self.level):
                continue
            new = self.run_on_function(func, fname, mod)
            if not isinstance(new, (Function, PrimFunc)):
                raise CompileError(
                    f"pass '{self.name}' returned {type(new).__name__} for function "
                    f"'{fname}'; expected a function")
            if new is not func:
                changed[fname] = new
        if not changed:
            return mod
        return IRModule({**mod.functions, **changed}, mod.attrs)


def _at_level(func: BaseFunc, level: str) -> bool:
    if level == "all":
        return True
    return isinstance(func, PrimFunc) if level == "tensor" else isinstance(func, Function)


class _FunctionPassFromCallable(FunctionPass):
    def __init__(self, fn: Callable[..., BaseFunc], name: str, level: str) -> None:
        self._fn = fn
        self.name = name
        self.level = level

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> BaseFunc:
        return self._fn(func, name, mod)

    def __repr__(self) -> str:
        return f"function_pass({self.name!r}, level={self.level!r})"


def function_pass(
    name: str, level: str = "tensor",
) -> Callable[[Callable[..., BaseFunc]], FunctionPass]:
    """Decorator: turn `fn(func, name, mod) -> func` into a FunctionPass instance."""

    def deco(fn: Callable[..., BaseFunc]) -> FunctionPass:
        return _FunctionPassFromCallable(fn, name, level)

    return deco


class ModulePassFromCallable(Pass):
    """Wraps any callable `IRModule -> IRModule` as a pass (custom pipelines)."""

    def __init__(self, fn: Callable[[IRModule], IRModule], name: str | None = None) -> None:
        self._fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def run(self, mod: IRModule) -> IRModule:
        return self._fn(mod)

    def __repr__(self) -> str:
        return f"ModulePassFromCallable({self.name!r})"


class Sequential(Pass):
    """Run passes in order; itself a pass, so pipelines nest.

    `Sequential([])` is the empty pipeline (the module passes through unchanged).
    """

    def __init__(self, passes: Iterable[Pass | Callable[[IRModule], IRModule]],
                 name: str = "sequential") -> None:
        self.passes: tuple[Pass, ...] = tuple(as_pass(p) for p in passes)
        self.name = name

    @property
    def is_container(self) -> bool:
        return True

    def run(self, mod: IRModule) -> IRModule:
        for p in self.passes:
            mod = p(mod)
        return mod

    def options(self) -> dict[str, Any]:
        return {"passes": list(self.passes)}

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.passes)
        return f"Sequential([{inner}], name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequential):
            return NotImplemented
        return self.name == other.name and self.passes == other.passes

    def __hash__(self) -> int:
        return hash((self.name, self.passes))


def as_pass(p: Pass | Callable[[IRModule], IRModule]) -> Pass:
    """`p` itself if it is a Pass, a callable wrapped as one, else CompileError."""
    if isinstance(p, Pass):
        return p
    if callable(p):
        return ModulePassFromCallable(p)
    raise CompileError(f"expected a Pass or a callable IRModule -> IRModule, got {p!r}")
