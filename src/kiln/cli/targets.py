"""`kiln targets`: list target tags (marking those no codegen can compile for yet), show one."""

from __future__ import annotations

import json
from collections.abc import Sequence

# The verbs of `kiln targets`; any other first word is the old `kiln targets NAME` spelling.
VERBS = ("list", "show", "kinds")


def normalize_argv(argv: list[str]) -> list[str]:
    """Rewrite the old spellings `kiln targets [--kinds] [NAME]` into the verb form."""
    if not argv or argv[0] != "targets":
        return argv
    rest = argv[1:]
    if not rest:
        return ["targets", "list"]
    if rest[0] in (*VERBS, "-h", "--help"):
        return argv
    if rest == ["--kinds"]:
        return ["targets", "kinds"]
    if len(rest) == 1 and not rest[0].startswith("-"):
        return ["targets", "show", rest[0]]
    return argv


def has_codegen(kind_name: str) -> bool:
    """Whether a codegen is registered for the kind (its "codegen" attribute or its own name)."""
    import kiln.codegen  # lazy: loaded on first use (registry)  # noqa: F401  (registers the built-in codegens)
    from kiln.codegen.registry import (
        list_codegens,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.target import get_kind  # heavy: kept off the cli's startup (kiln --help)

    attr = get_kind(kind_name).get_attr("codegen")
    if callable(attr):
        return True
    return (attr if isinstance(attr, str) else kind_name) in list_codegens()


def tag_rows(kind: str | None) -> list[tuple[str, str, str, str]]:
    """(tag, kind, codegen yes/no, description) of every tag, or only those of `kind`."""
    from kiln.target import get_kind, list_tags  # heavy: kept off the cli's startup (kiln --help)
    from kiln.target.tags import get_tag  # heavy: kept off the cli's startup (kiln --help)

    if kind is not None:
        get_kind(kind)  # an unknown kind raises TargetError with a suggestion
    rows = []
    for name in list_tags():
        tag = get_tag(name)
        tag_kind = str(json.loads(tag.config_json).get("kind", "?"))
        if kind is not None and tag_kind != kind:
            continue
        codegen = "yes" if has_codegen(tag_kind) else "no"
        rows.append((tag.canonical, tag_kind, codegen, tag.description))
    return rows


def format_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Left-aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [f"{cell:<{w}}" for cell, w in zip(row, widths)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def cmd_list(kind: str | None) -> str:
    rows = tag_rows(kind)
    table = format_table(("tag", "kind", "codegen", "description"), rows)
    missing = sum(1 for r in rows if r[2] == "no")
    note = (f"\n{len(rows)} tags; {missing} have a kind with no code generator yet "
            "(codegen: no): kiln can describe them but not compile for them")
    return table + (note if missing else f"\n{len(rows)} tags")


def cmd_kinds() -> str:
    from kiln.target import list_kinds  # heavy: kept off the cli's startup (kiln --help)

    rows = [(k, "yes" if has_codegen(k) else "no") for k in list_kinds()]
    return format_table(("kind", "codegen"), rows)


def cmd_show(name: str) -> str:
    from kiln.target import describe  # heavy: kept off the cli's startup (kiln --help)

    text: str = describe(name)
    return text
