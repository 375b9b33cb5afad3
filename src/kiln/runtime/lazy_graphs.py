"""The library metadata's "graphs" entry, parsed only when something reads it.

"graphs" (docs/abi.md: each lowered graph's kernel calls and tensors) is for
reports and profiles -- `kiln inspect --report`, `kiln profile` -- and is most
of a large model's metadata: 0.93 of the 1.2 MB of a 24-layer decoder's JSON,
some 10 MiB as Python objects that a process which only runs the library never
reads. `split_entry` cuts an entry's JSON text out of the metadata text without
parsing it (kiln.artifact._json), and `LazyGraphs` is the dict that parses and checks that text on
first use (with the same schema `load_module` checks the rest by).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kiln.artifact._json import split_entry


class LazyGraphs(dict[str, Any]):
    """A dict holding the parse of `text`, made (by `load(text)`) on first use."""

    def __init__(self, text: str, load: Callable[[str], dict[str, Any]]) -> None:
        super().__init__()
        self._pending: tuple[str, Callable[[str], dict[str, Any]]] | None = (text, load)

    @property
    def parsed(self) -> bool:
        """Whether the text has been parsed (by a first read)."""
        return self._pending is None

    def _ready(self) -> None:
        if self._pending is not None:
            text, load = self._pending
            dict.update(self, load(text))
            self._pending = None

    def __getitem__(self, key: str) -> Any:
        self._ready()
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        self._ready()
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        self._ready()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._ready()
        return dict.__len__(self)

    def __eq__(self, other: object) -> bool:
        self._ready()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        self._ready()
        return dict.__repr__(self)

    def get(self, key: str, default: Any = None) -> Any:
        self._ready()
        return dict.get(self, key, default)

    def keys(self) -> Any:
        self._ready()
        return dict.keys(self)

    def values(self) -> Any:
        self._ready()
        return dict.values(self)

    def items(self) -> Any:
        self._ready()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self._ready()
        return dict(dict.items(self))


__all__ = ["LazyGraphs", "split_entry"]
