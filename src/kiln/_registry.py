"""The one registry shape kiln uses everywhere: name -> lazily loaded entry.

Target kinds, tags, codegens, loaders, inspectors and passes all live in a
`Registry`. An entry is either the object itself or a zero-argument loader
("module:attr" string or callable) resolved on first use, so importing kiln
does not import every backend.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from kiln.errors import KilnError

T = TypeVar("T")


class RegistryError(KilnError, KeyError):
    """A name is unknown to a registry, or registered twice."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text.
        return str(self.args[0]) if self.args else ""


def suggest(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """Return ' did you mean 'x'?' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" did you mean '{close[0]}'?" if close else ""


class Registry(Generic[T]):
    """Name -> entry, with lazy loaders and errors that list the valid names."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str | Callable[[], T]] = {}
        self._origin: dict[str, str] = {}

    def register(
        self, name: str, entry: T | None = None, *, lazy: str | Callable[[], T] | None = None,
        override: bool = False,
    ) -> Callable[[T], T] | T:
        """Register `entry` (or a lazy loader) under `name`; usable as a decorator."""
        if entry is None and lazy is None:
            def deco(obj: T) -> T:
                self.register(name, obj, override=override)
                return obj
            return deco
        if not override and name in self:
            raise RegistryError(
                f"{self.what} '{name}' is already registered (by {self._origin[name]}); "
                "pass override=True to replace it"
            )
        self._entries.pop(name, None)
        self._lazy.pop(name, None)
        if lazy is not None:
            self._lazy[name] = lazy
            self._origin[name] = lazy if isinstance(lazy, str) else _describe(lazy)
        else:
            assert entry is not None
            self._entries[name] = entry
            self._origin[name] = _describe(entry)
        return entry if entry is not None else lazy  # type: ignore[return-value]

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._lazy.pop(name, None)
        self._origin.pop(name, None)

    def get(self, name: str) -> T:
        """The entry for `name`; an unknown name raises RegistryError listing the choices."""
        if name in self._entries:
            return self._entries[name]
        if name in self._lazy:
            # a loader that fails (a missing package) stays, to fail the same way again
            entry: T = _resolve(self._lazy[name])
            self._entries[name] = entry
            del self._lazy[name]
            return entry
        names = self.names()
        raise RegistryError(
            f"unknown {self.what} '{name}'.{suggest(name, names)} "
            f"Known: {', '.join(names) if names else '(none)'}"
        )

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries) + len(self._lazy)


def _describe(obj: object) -> str:
    mod = getattr(obj, "__module__", None) or type(obj).__module__
    qual = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{mod}.{qual}"


def _resolve(loader: str | Callable[[], T]) -> T:
    if isinstance(loader, str):
        module, _, attr = loader.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        return obj  # type: ignore[return-value]
    return loader()
