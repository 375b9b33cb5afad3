"""Turn the textual forms of a target spec into a plain dict.

Accepted strings:

* a kind name: ``"llvm"``
* ``"host"``: this machine's llvm target (`Target.from_host()`), optionally with
  options: ``"host -mattr=-avx512f"``
* a tag, alias or versioned tag: ``"raspberry-pi/4b-aarch64"``, ``"nvidia/a100:v1"``
* JSON: ``'{"kind": "cuda", "arch": "sm_80"}'``
* TVM's command line: a kind or tag, then ``-name=value`` options, e.g.
  ``"llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+fp-armv8"``. Values are
  converted with the attribute's declared type: list attributes split on
  commas, ints and bools are parsed, a bare ``-fast-math`` means true, and a
  target-valued option may be quoted: ``-host='llvm -mcpu=cortex-a72'``.

The dict still has to be validated; `kiln.target.target` does that for every
form alike, so a typo reads the same whichever way it was written.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from kiln.errors import TargetError
from kiln.target.attrs import suggest_name
from kiln.target.host import host_config
from kiln.target.registry import KINDS, get_kind, list_kinds
from kiln.target.tags import all_names, get_tag, is_tag


def spec_to_dict(spec: object) -> dict[str, Any]:
    """A shallow dict for `spec` (a Mapping or a string); anything else raises TargetError."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, str):
        return parse_string(spec)
    raise TargetError(
        "a target spec is a kind or tag name, a command line, a JSON string, a dict or a "
        f"Target; got {type(spec).__name__} {spec!r}"
    )


def parse_string(text: str) -> dict[str, Any]:
    """Parse a kind name, tag, JSON object or TVM-style command line."""
    stripped = text.strip()
    if not stripped:
        raise TargetError("empty target spec; write a kind such as 'llvm' or a tag")
    if stripped.startswith(("{", "[")):
        return _parse_json(stripped)
    try:
        tokens = shlex.split(stripped)
    except ValueError as err:
        raise TargetError(f"cannot split target command line {text!r}: {err}") from None
    head, options = tokens[0], tokens[1:]
    base = _parse_head(head)
    if not options:
        return base
    kind_name = base["kind"] if "kind" in base else get_tag(base["tag"]).config["kind"]
    return {**base, **_parse_options(kind_name, options)}


def _parse_json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TargetError(
            f"target JSON is malformed: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    if not isinstance(data, dict):
        raise TargetError(f"target JSON must be an object, got {type(data).__name__}")
    return data


def _parse_head(head: str) -> dict[str, Any]:
    if head.startswith("-"):
        raise TargetError(
            f"a target command line starts with a kind or tag, e.g. 'llvm {head}'; got '{head}'"
        )
    if head == "host":  # this machine's llvm target: triple, CPU name and features

        return host_config()
    if head in KINDS:
        return {"kind": head}
    if is_tag(head):
        return {"tag": head}
    if "/" in head:
        get_tag(head)  # raises the tag error, with its suggestion
    raise TargetError(
        f"unknown target kind '{head}'."
        f"{suggest_name(head, ['host', *list_kinds(), *all_names()])} "
        f"Kinds: {', '.join(list_kinds())}; 'host' (this machine's CPU); tags: see "
        "kiln.target.list_tags()"
    )


def _parse_options(kind_name: str, tokens: list[str]) -> dict[str, Any]:
    kind = get_kind(kind_name)
    out: dict[str, Any] = {}
    for token in tokens:
        if not token.startswith("-") or token.lstrip("-") == "":
            raise TargetError(
                f"target option '{token}' must look like '-name=value' (or '-flag' for a bool)"
            )
        name, has_value, text = token.lstrip("-").partition("=")
        if name in out:
            raise TargetError(f"target option '-{name}' is given twice")
        spec = kind.options.get(name)
        where = f"attribute '{name}' of target kind '{kind.name}'"
        if spec is None:
            # Unknown names are reported by the validator, with a suggestion.
            out[name] = text if has_value else True
        elif not has_value:
            if spec.type_name != "bool":
                raise TargetError(f"{where} needs a value: -{name}=<{spec.type_name}>")
            out[name] = True
        else:
            out[name] = spec.parse_text(text, where)
    return out
