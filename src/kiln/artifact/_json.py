"""Read-only JSON values: the metadata of artifacts, blobs and archives.

Metadata is copied on the way in and frozen: objects become `FrozenDict` and
arrays `FrozenList` -- subclasses of dict and list that refuse mutation, so
`json.dumps`, `==` against plain values and `meta["cflags"] + [...]` keep
working. Anything that is not JSON (a set, bytes, NaN, a non-str key) is
rejected with an ArtifactError (a ValueError) that says where it was found.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from kiln.errors import ArtifactError, FormatError

# Deeper nesting than this is almost certainly a cycle or an attack on Python's
# frame limit (json.loads and freezing go one frame per level); real metadata is
# two or three levels deep.
MAX_DEPTH = 64


class FrozenDict(dict[str, Any]):
    """A dict that refuses mutation; hashable, picklable, JSON-serializable."""

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("artifact metadata is read-only; build a new dict, e.g. {**meta, 'k': v}")

    __setitem__ = _readonly
    __delitem__ = _readonly
    __ior__ = _readonly
    clear = _readonly
    pop = _readonly
    popitem = _readonly
    setdefault = _readonly
    update = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return _json_hash(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # dict's default pickling calls __setitem__, which we forbid.
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return dict.__repr__(self)


class FrozenList(list[Any]):
    """A list that refuses mutation; hashable, picklable, JSON-serializable."""

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("artifact metadata is read-only; build a new list, e.g. [*xs, x]")

    __setitem__ = _readonly
    __delitem__ = _readonly
    __iadd__ = _readonly
    __imul__ = _readonly
    append = _readonly
    extend = _readonly
    insert = _readonly
    pop = _readonly
    remove = _readonly
    clear = _readonly
    sort = _readonly
    reverse = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return _json_hash(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __repr__(self) -> str:
        return list.__repr__(self)


def _json_hash(value: Any) -> int:
    """A hash consistent with ==: key order ignored, 1 == 1.0 hash alike (as in Python)."""
    if isinstance(value, dict):
        return hash(frozenset((k, _json_hash(v)) for k, v in value.items()))
    if isinstance(value, list):
        return hash(tuple(_json_hash(v) for v in value))
    return hash(value)


def freeze(value: Any, where: str, _depth: int = 0) -> Any:
    """A read-only deep copy of the JSON value `value`; ArtifactError naming `where` otherwise.

    A value this function froze before is taken as it is (not copied or walked again):
    metadata is frozen once, then handed on through artifacts, blobs and their stubs.
    """
    try:
        return _freeze(value, _depth)[0]
    except _Bad as bad:
        raise ArtifactError(bad.message(where)) from None


class _Bad(Exception):
    """A fault found `path` levels down (keys and indices, innermost first)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
        self.path: list[str | int] = []

    def message(self, where: str) -> str:
        return where + "".join(f"[{k!r}]" for k in reversed(self.path)) + ": " + self.text


# Set on the containers `_freeze` built, which hold nothing but frozen JSON: their height
# (levels of containers below them, for the MAX_DEPTH check of a value nesting them).
_HEIGHT = "_kiln_json_height"


def _freeze(value: Any, depth: int) -> tuple[Any, int]:
    """(frozen `value`, its height); `_Bad` with the path of the fault otherwise. Type
    checks of the common exact types first: metadata has tens of thousands of leaves."""
    if depth > MAX_DEPTH:
        raise _Bad(f"nested deeper than {MAX_DEPTH} levels (a cycle?)")
    kind = type(value)
    if value is None or kind is str or kind is bool:
        return value, 0
    if kind is int:
        return value, 0
    if kind is float:
        if not math.isfinite(value):
            raise _Bad(f"{value} is not valid JSON (only finite numbers are)")
        return value, 0
    height = getattr(value, _HEIGHT, None) if kind is FrozenDict or kind is FrozenList else None
    if height is not None:
        if depth + height > MAX_DEPTH:  # as deep as walking it again would find
            raise _Bad(f"nested deeper than {MAX_DEPTH} levels (a cycle?)")
        return value, height
    if isinstance(value, str):
        return value, 0
    if isinstance(value, numbers.Integral):
        return int(value), 0
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise _Bad(f"{f} is not valid JSON (only finite numbers are)")
        return f, 0
    if isinstance(value, Mapping):
        return _freeze_mapping(value, depth)
    if isinstance(value, (list, tuple)):
        return _freeze_list(value, depth)
    raise _Bad(f"a {type(value).__name__} is not JSON-able "
               "(use None, bool, int, float, str, list or dict)")


def _freeze_mapping(value: Mapping[Any, Any], depth: int) -> tuple[FrozenDict, int]:
    out = {}
    height = 0
    for k, v in value.items():
        if not isinstance(k, str):
            raise _Bad(f"key {k!r} is a {type(k).__name__}; JSON object keys must be str")
        try:
            out[k], h = _freeze(v, depth + 1)
        except _Bad as bad:
            bad.path.append(k)
            raise
        height = max(height, h + 1)
    frozen = FrozenDict(out)
    setattr(frozen, _HEIGHT, height)
    return frozen, height


def _freeze_list(value: list[Any] | tuple[Any, ...], depth: int) -> tuple[FrozenList, int]:
    items = []
    height = 0
    for i, v in enumerate(value):
        try:
            item, h = _freeze(v, depth + 1)
        except _Bad as bad:
            bad.path.append(i)
            raise
        items.append(item)
        height = max(height, h + 1)
    frozen = FrozenList(items)
    setattr(frozen, _HEIGHT, height)
    return frozen, height


def freeze_object(value: Any, where: str) -> FrozenDict:
    """`freeze` for a value that must be a JSON object (a mapping at the top)."""
    if not isinstance(value, Mapping):
        raise ArtifactError(
            f"{where} must be a mapping (a JSON object), got {type(value).__name__}")
    frozen: FrozenDict = freeze(value, where)
    return frozen


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy (dicts and lists) of a frozen JSON value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """One fixed text for a JSON value (sorted keys, no spaces): what checksums cover."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def parse_json_object(text: str | bytes, where: str, error: type[Exception]) -> FrozenDict:
    """Parse strict JSON (no NaN, no duplicate keys) that must be an object.

    Every failure, including invalid UTF-8 and absurd nesting, raises `error`
    with a message naming `where`.
    """
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{where}: expected UTF-8 text, found invalid byte at {err.start}") from None
    # json.loads recurses per level: measure the nesting first, without recursion.
    # (`freeze` counts the outer object as level 0, brackets count it as 1.)
    depth = text_depth(text)
    if depth > MAX_DEPTH + 1:
        raise error(f"{where}: expected a JSON object, found invalid JSON (nested "
                    f"{depth} levels deep, deeper than {MAX_DEPTH})")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates,
                           parse_constant=_reject_constant)
    except ValueError as err:
        raise error(f"{where}: expected a JSON object, found invalid JSON ({err})") from None
    if not isinstance(value, dict):
        raise error(f"{where}: expected a JSON object, found a {type(value).__name__}")
    try:
        return freeze_object(value, where)
    except ValueError as err:
        raise error(str(err)) from None


# A string as runs of plain characters between escapes ("unrolled"): a 70 KB string of
# hex digests (a large library's chunk hashes) scans in microseconds, not milliseconds.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


def text_depth(text: str) -> int:
    """The deepest bracket nesting of JSON text, strings skipped (an iterative scan)."""
    depth = deepest = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = text[m.start()]  # not m.group(): a string's match would be copied
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> NoReturn:
    raise FormatError(f"{name} is not valid JSON")


# A JSON string (escapes included; an unterminated one runs to the end, so a damaged
# text is scanned once, in linear time) or a bracket: enough to find where a value ends.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\Z)|[\[\]{}]', re.DOTALL)
_COLON = re.compile(r"\s*:\s*\{")  # a key's colon, then an object
_COMMA = re.compile(r"\s*,\s*")


def split_entry(text: str, key: str) -> tuple[str, str | None]:
    """(`text` without the top-level entry `key`, that entry's value as JSON text),
    for the JSON object `text`; (`text`, None) when `key` is absent at the top level or
    its value is not an object. Nothing is parsed: a malformed text is left whole
    for the parser to reject."""
    want = json.dumps(key)
    depth = 0
    key_at = value_at = -1  # where the entry starts and its value, once found
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok[0] in "{[":
            depth += 1
        elif tok[0] in "}]":
            depth -= 1
            if value_at >= 0 and depth == 1:
                return _cut(text, key_at, value_at, m.end())
        elif value_at < 0 and depth == 1 and tok == want and \
                (colon := _COLON.match(text, m.end())):
            key_at, value_at = m.start(), colon.end() - 1
    return text, None


def _cut(text: str, key_at: int, value_at: int, end: int) -> tuple[str, str]:
    """`split_entry`'s result for the entry at [key_at, end), its value from value_at."""
    after = _COMMA.match(text, end)
    if after:  # the entry and its comma
        return text[:key_at] + text[after.end():], text[value_at:end]
    before = text[:key_at].rstrip()
    if before.endswith(","):  # the last entry: the comma before it
        return text[:len(before) - 1] + text[end:], text[value_at:end]
    return text[:key_at] + text[end:], text[value_at:end]
