"""The schema layer for untrusted JSON: each checker, and errors that name the JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.artifact.schema import (
    AnyOf,
    Anything,
    Bool,
    Enum,
    Int,
    ListOf,
    MapOf,
    Num,
    Obj,
    Str,
    check,
    identifier,
    optional,
    parse,
)
from kiln.errors import FormatError

TENSOR = Obj(required={"name": Str(), "shape": ListOf(Int(0)), "dtype": Enum(("float32",))})
DOC = Obj(required={"outputs": ListOf(TENSOR)}, optional={"note": optional(Str())})


def _error(schema: Any, value: Any) -> str:
    with pytest.raises(FormatError) as info:
        check(schema, value, "metadata.json")
    return str(info.value)


def test_the_error_names_the_file_and_the_json_path() -> None:
    doc = {"outputs": [{"name": "y", "shape": [1, "x"], "dtype": "float32"}]}
    assert _error(DOC, doc) == \
        'metadata.json: outputs[0].shape[1]: expected an int >= 0, got "x"'


@pytest.mark.parametrize("schema, good, bad, message", [
    (Int(0), 0, -1, "expected an int >= 0, got -1"),
    (Int(0), 5, True, "expected an int >= 0, got true"),
    (Int(1, 10), 10, 11, "expected an int in [1, 10], got 11"),
    (Int(), -(2**63), 2**63, "expected an int, got 9223372036854775808"),
    (Num(), 1.5, float("nan"), "expected a number, got NaN"),
    (Bool(), False, 0, "expected true or false, got 0"),
    (Str(r"[a-z]+", 4), "abcd", "abcde", 'expected a string, got "abcde"'),
    (identifier(), "a_1", "1a", 'expected a C identifier, got "1a"'),
    (Enum((1,)), 1, True, "expected one of 1, got true"),
    (optional(Int()), None, "1", 'expected an int or null, got "1"'),
    (ListOf(Int(), max_len=2), [1, 2], [1, 2, 3], "got a list of 3 items"),
    (MapOf(Int()), {"a": 1}, {"a": "b"}, 'a: expected an int, got "b"'),
    (AnyOf((Int(), Str())), "x", [], "expected an int or a string, got []"),
    (Obj(required={"a": Int()}), {"a": 1}, {}, 'expected an object with key "a", got keys []'),
    (Obj(optional={"a": Int()}), {}, {"b": 1}, "b: expected no such key (keys allowed here: a)"),
    (Obj(extra=Anything()), {"b": [1]}, [], "expected an object, got []"),
])
def test_each_checker(schema: Any, good: Any, bad: Any, message: str) -> None:
    assert check(schema, good, "f") is good
    assert message in _error(schema, bad)


def test_keys_that_are_not_identifiers_are_quoted_and_long_values_cut() -> None:
    text = _error(MapOf(Int()), {"a b": "x" * 500})
    assert text.startswith('metadata.json: ["a b"]: expected an int, got "xxx')
    assert text.endswith('...') and len(text) < 120


def test_parse_refuses_what_is_not_strict_json() -> None:
    for raw, message in [(b"{", "invalid JSON"), (b'{"a": NaN}', "NaN is not valid JSON"),
                         (b'{"a": 1, "a": 2}', "duplicate key"), (b"[]", "found a list"),
                         (b"[" * 100 + b"]" * 100, "nested 100 levels deep"),
                         (b"\xff", "expected UTF-8 text")]:
        with pytest.raises(FormatError, match=message):
            parse(raw, Obj(extra=Anything()), "x.json")
    assert parse(b'{"outputs": []}', DOC, "x.json") == {"outputs": []}


def test_the_json_view_refuses_absurd_nesting_without_recursion_error() -> None:
    from kiln.artifact import Artifact, inspect_artifact

    deep = Artifact("cuda", "none", "table.json", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(FormatError, match="nested 100000 levels deep, deeper than 64"):
        inspect_artifact(deep, "json")
