"""`describe(name)`: a human-readable page about a target kind or a tag."""

from __future__ import annotations

import json

from kiln.errors import TargetError
from kiln.target.attrs import COMMON_OPTIONS, suggest_name
from kiln.target.kind import TargetKind
from kiln.target.registry import KINDS, list_kinds
from kiln.target.tags import all_names, get_tag, is_tag
from kiln.target.target import Target


def describe(name: str) -> str:
    """Describe a kind (its attributes with types and defaults) or a tag (its config);
    "host" describes this machine's llvm target."""
    if name == "host":
        host = Target("host")
        return f"'host' is this machine's target: {summarize(host)}\n  {host}"
    if name in KINDS:
        return describe_kind(KINDS.get(name))
    if is_tag(name):
        return describe_tag(name)
    hint = suggest_name(name, [*list_kinds(), *all_names()])
    raise TargetError(f"'{name}' is neither a target kind nor a tag.{hint}")


def summarize(target: Target) -> str:
    """One line naming what `target` builds for: its tag, else its kind with the
    triple and CPU, e.g. "llvm x86_64-unknown-linux-gnu (znver4)" or
    "raspberry-pi/4b-aarch64"; "llvm x86_64-... (generic)" when no CPU is named."""
    if target.tag is not None:
        return target.tag
    triple = target.get("mtriple")
    if triple is None:
        return target.kind.name
    return f"{target.kind.name} {triple} ({target.get('mcpu') or 'generic'})"


def describe_kind(kind: TargetKind) -> str:
    """The attribute table of a kind: name, type, default and a line of doc."""
    keys = ", ".join(kind.default_keys) or "(none)"
    lines = [f"target kind '{kind.name}': {kind.doc}".rstrip(": "), f"  default keys: {keys}"]
    rows: list[tuple[str, str, str, str]] = []
    sections = (("attributes", kind.own_options), ("common attributes", COMMON_OPTIONS))
    for section, options in sections:
        if not options:
            continue
        rows.append((section, "", "", ""))
        for option, spec in options.items():
            if option in ("kind",):
                continue
            default = "-" if spec.default is None else json.dumps(_plain(spec.default))
            rows.append((option, spec.expected, default, spec.doc))
    width_name = max(len(row[0]) for row in rows) + 2
    width_type = max(len(row[1]) for row in rows) + 2
    width_default = max(len(row[2]) for row in rows) + 2
    for option, expected, default, doc in rows:
        if not expected:
            lines.append(f"  {option}:")
            continue
        lines.append(
            f"    {option:<{width_name}}{expected:<{width_type}}{default:<{width_default}}{doc}"
        )
    per_kind = kind.attr_names()
    if per_kind:
        lines.append(f"  per-kind attributes set: {', '.join(per_kind)}")
    return "\n".join(lines)


def describe_tag(name: str) -> str:
    """The canonical name, aliases, description and target config of a tag."""
    tag = get_tag(name)
    lines = [f"target tag '{tag.canonical}'"]
    if tag.canonical != name:
        lines[0] += f" (resolved from '{name}')"
    if tag.description:
        lines.append(f"  {tag.description}")
    if tag.aliases:
        lines.append(f"  aliases: {', '.join(tag.aliases)}")
    config = json.dumps(tag.config, indent=2, sort_keys=True)
    lines.append("  config:")
    lines.extend("    " + line for line in config.splitlines())
    return "\n".join(lines)


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
