"""`@ir_module`, `@T.prim_func` and `@G.function`: write IR as Python.

The decorators never run the decorated body. They read its source with
`inspect`, and hand it to the same parser `from_source` uses. Names from the
surrounding Python scope (module globals and the locals of the enclosing
function) may appear in the DSL as constants: ints and floats in shapes and
expressions, strings as dtypes, numpy arrays as constant data, and a dict
named `meta` as the metadata table for `meta["name"]` references.

- `@ir_module` on a class returns an `IRModule` with one function per
  decorated method (the class itself is discarded).
- `@T.prim_func` / `@G.function` on a top-level (or nested) function return a
  one-function `IRModule` named after the function, so it can be compiled or
  evaluated directly; `mod["name"]` is the function. Inside an `@ir_module`
  class they only mark the method for the class decorator.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from kiln.errors import IRError
from kiln.ir.metadata import MetadataLike, resolve_metadata
from kiln.ir.module import IRModule
from kiln.script.diagnostics import Source
from kiln.script.parser import default_env, parse_source


class DeferredFunction:
    """A DSL method inside an `@ir_module` class, parsed with the class."""

    def __init__(self, fn: Callable[..., Any], level: str) -> None:
        self.fn = fn
        self.level = level

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise IRError(
            f"{self.fn.__qualname__} is a kiln DSL function inside a class; decorate the "
            "class with @ir_module and use the resulting IRModule"
        )

    def __repr__(self) -> str:
        kind = "prim_func" if self.level == "T" else "function"
        return f"<kiln.script {kind} {self.fn.__qualname__} (awaiting @ir_module)>"


def ir_module(cls: type | None = None, *, metadata: MetadataLike = None) -> Any:
    """Class decorator: parse the class's DSL methods into an IRModule.

    `@ir_module` or `@ir_module(metadata=...)` (a dict of arrays or a .npz
    path for `meta["name"]` references).
    """
    return ir_module_at(cls, metadata=metadata, depth=3)


def ir_module_at(cls: type | None, *, metadata: MetadataLike, depth: int) -> Any:
    """`ir_module`, reading names from the frame `depth` levels above this one."""
    env = _caller_env(depth)

    def apply(c: type) -> IRModule:
        if not inspect.isclass(c):
            raise IRError(f"@ir_module decorates a class, not {type(c).__name__}")
        return _parse_object(c, env, metadata)

    return apply(cls) if cls is not None else apply


def decorate_function(
    fn: Callable[..., Any] | None, level: str, *, name: str | None = None,
    metadata: MetadataLike = None,
) -> Any:
    """Implementation of `@T.prim_func` and `@G.function` (bare or called)."""
    del name  # read from the source text, where the decorator spells it
    env = _caller_env(3)

    def apply(f: Callable[..., Any]) -> Any:
        if not inspect.isfunction(f):
            raise IRError(f"@{'T.prim_func' if level == 'T' else 'G.function'} decorates a "
                          f"function, not {type(f).__name__}")
        if _defined_in_class(f):
            return DeferredFunction(f, level)
        return _parse_object(f, env, metadata)

    return apply(fn) if fn is not None else apply


def _defined_in_class(fn: Callable[..., Any]) -> bool:
    parts = fn.__qualname__.split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


def _caller_env(depth: int) -> dict[str, Any]:
    """Globals and locals of the frame `depth` levels above the caller."""
    frame = sys._getframe(depth)
    try:
        return {**frame.f_globals, **frame.f_locals}
    finally:
        del frame


def _parse_object(obj: Any, env: Mapping[str, Any], metadata: MetadataLike) -> IRModule:
    try:
        lines, first = inspect.getsourcelines(obj)
        filename = inspect.getsourcefile(obj) or ""
    except (OSError, TypeError) as exc:
        raise IRError(
            f"cannot read the source of {getattr(obj, '__qualname__', obj)!r} ({exc}); "
            "DSL decorators need a source file; use kiln.script.from_source(text) instead"
        ) from None
    source = Source.from_file_lines(lines, filename, first)
    table = metadata
    if table is None and isinstance(env.get("meta"), Mapping):
        table = env["meta"]
    full_env = {**default_env(), **env}
    return parse_source(source, env=full_env, metadata=resolve_metadata(table))
