"""Declarative checks for untrusted JSON: one schema layer for every reader.

Every JSON document kiln reads from a file someone else may have written (the
library metadata in a blob or a `.so`, an MLF `metadata.json`, a compile-cache
entry, the input of `kiln inspect --report`) is checked against a schema built
from the small checkers below *before* any reader looks inside it. A reader
then indexes and iterates without `isinstance` guards, and a malformed
document is one `FormatError` that names the file and the JSON path:

    metadata.json: outputs[0].shape[1]: expected an int >= 0, got "x"

    TENSOR = Obj(required={"name": Str(), "shape": ListOf(Int(0)), "dtype": Str()})
    check(TENSOR, value, "metadata.json")

Schemas are plain frozen values, so a format's schema is written once, next to
its reader, and printed by `describe()` in docs and errors. This module imports
nothing of the compiler (the runtime and `kiln.artifact` use it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.artifact._json import parse_json_object, thaw
from kiln.errors import FormatError

INT64_MAX = (1 << 63) - 1
# A got-value is quoted up to this many characters (a fuzzed document can hold megabytes).
_QUOTE_LIMIT = 40
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Mismatch(Exception):
    """Internal: where a value first failed its schema and what was expected there."""

    def __init__(self, path: str, expected: str, got: Any, *, quote: bool = True) -> None:
        super().__init__(path)
        self.path, self.expected, self.got, self.quote = path, expected, got, quote


def _quote(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT - 3] + "..."


def _key_path(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quote(key)}]"


class Schema:
    """A checker of one JSON value. Subclasses implement `_check` and `describe`."""

    def _check(self, value: Any, path: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """What this schema accepts, in words ("an int >= 0")."""
        raise NotImplementedError


def check(schema: Schema, value: Any, where: str) -> Any:
    """`value` if it satisfies `schema`; else a FormatError naming `where` and the path."""
    try:
        schema._check(value, "")
    except _Mismatch as m:
        at = f"{m.path}: " if m.path else ""
        got = _quote(m.got) if m.quote else str(m.got)
        raise FormatError(f"{where}: {at}expected {m.expected}, got {got}") from None
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Schema):
    """An int (not a bool) in [lo, hi]; `hi` defaults to int64's largest."""

    lo: int | None = None
    hi: int | None = INT64_MAX

    def _check(self, value: Any, path: str) -> None:
        if (not _is_int(value) or (self.lo is not None and value < self.lo)
                or (self.hi is not None and value > self.hi)):
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None and self.hi != INT64_MAX:
            return f"an int in [{self.lo}, {self.hi}]"
        return f"an int >= {self.lo}" if self.lo is not None else "an int"


@dataclass(frozen=True)
class Num(Schema):
    """A finite JSON number (int or float, not a bool)."""

    def _check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                or value in (float("inf"), float("-inf")):
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return "a number"


@dataclass(frozen=True)
class Bool(Schema):
    """true or false."""

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Str(Schema):
    """A string of at most `max_len` characters, matching `pattern` (whole) if given."""

    pattern: str | None = None
    max_len: int = 4096
    what: str = "a string"

    def _check(self, value: Any, path: str) -> None:
        if (not isinstance(value, str) or len(value) > self.max_len
                or (self.pattern is not None and re.fullmatch(self.pattern, value) is None)):
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return self.what


def identifier(max_len: int = 256) -> Str:
    """A C identifier (ASCII letters, digits, '_'; not starting with a digit)."""
    return Str(_IDENTIFIER.pattern, max_len, "a C identifier")


@dataclass(frozen=True)
class Enum(Schema):
    """One of a fixed set of JSON scalars."""

    values: tuple[Any, ...]

    def _check(self, value: Any, path: str) -> None:
        # `True == 1` in Python: compare types too, so `true` is not the version 1.
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return "one of " + ", ".join(_quote(v) for v in self.values)


@dataclass(frozen=True)
class Null(Schema):
    """Only null."""

    def _check(self, value: Any, path: str) -> None:
        if value is not None:
            raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return "null"


@dataclass(frozen=True)
class AnyOf(Schema):
    """A value one of `options` accepts (the error lists them all)."""

    options: tuple[Schema, ...]

    def _check(self, value: Any, path: str) -> None:
        for option in self.options:
            try:
                option._check(value, path)
                return
            except _Mismatch:
                continue
        raise _Mismatch(path, self.describe(), value)

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)


def optional(schema: Schema) -> AnyOf:
    """`schema` or null."""
    return AnyOf((schema, Null()))


@dataclass(frozen=True)
class Anything(Schema):
    """Any JSON value (its parser already refused what is not JSON)."""

    def _check(self, value: Any, path: str) -> None:
        return None

    def describe(self) -> str:
        return "any value"


@dataclass(frozen=True)
class ListOf(Schema):
    """A list of at most `max_len` items, each accepted by `item`."""

    item: Schema
    max_len: int = 1 << 20
    min_len: int = 0

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise _Mismatch(path, self.describe(), value)
        if not self.min_len <= len(value) <= self.max_len:
            raise _Mismatch(path, self.describe(), f"a list of {len(value)} items", quote=False)
        for i, item in enumerate(value):
            self.item._check(item, f"{path}[{i}]")

    def describe(self) -> str:
        bounds = f" of {self.min_len}..{self.max_len} items" if self.min_len else ""
        return f"a list{bounds} of {self.item.describe()}"


@dataclass(frozen=True)
class Obj(Schema):
    """An object with `required` and `optional` keys, each value checked by its schema.

    Other keys are an error unless `extra` is given: then their values must satisfy it
    (`Anything()` lets a newer writer add keys an older reader ignores).
    """

    required: Mapping[str, Schema] = field(default_factory=dict)
    optional: Mapping[str, Schema] = field(default_factory=dict)
    extra: Schema | None = None

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _Mismatch(path, "an object", value)
        missing = [k for k in self.required if k not in value]
        if missing:
            raise _Mismatch(path, f"an object with key {_quote(missing[0])}",
                            f"keys {_quote(sorted(value))}", quote=False)
        for key, item in value.items():
            schema = self.required.get(key) or self.optional.get(key) or self.extra
            if schema is None:
                raise _Mismatch(_key_path(path, key), "no such key (keys allowed here: "
                                f"{', '.join(sorted([*self.required, *self.optional]))})",
                                item)
            schema._check(item, _key_path(path, key))

    def describe(self) -> str:
        return "an object"


@dataclass(frozen=True)
class MapOf(Schema):
    """An object used as a map: any key matching `key`, every value accepted by `value`."""

    value: Schema
    key: Str = Str(max_len=1024)
    max_len: int = 1 << 20

    def _check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise _Mismatch(path, "an object", value)
        if len(value) > self.max_len:
            raise _Mismatch(path, f"at most {self.max_len} keys", f"{len(value)} keys",
                            quote=False)
        for key, item in value.items():
            self.key._check(key, f"{path} key {_quote(key)}")
            self.value._check(item, _key_path(path, key))

    def describe(self) -> str:
        return f"an object of {self.value.describe()}"


def parse(text: str | bytes, schema: Schema, where: str) -> Any:
    """Parse strict JSON (no NaN, no duplicate keys, bounded nesting) and check it."""

    return check(schema, thaw(parse_json_object(text, where, FormatError)), where)


__all__ = ["INT64_MAX", "AnyOf", "Anything", "Bool", "Enum", "Int", "ListOf", "MapOf", "Null",
           "Num", "Obj", "Schema", "Str", "check", "identifier", "optional", "parse"]
