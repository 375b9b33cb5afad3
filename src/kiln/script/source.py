"""`from_source`: DSL text -> IRModule."""

from __future__ import annotations

from kiln.errors import IRError
from kiln.ir.metadata import MetadataLike, resolve_metadata
from kiln.ir.module import IRModule
from kiln.script.diagnostics import Source
from kiln.script.parser import default_env, parse_source


def from_source(text: str, *, metadata: MetadataLike = None, filename: str = "") -> IRModule:
    """Parse DSL text (an `@ir_module` class, or decorated top-level functions)
    into an IRModule.

    metadata: the arrays that `meta["name"]` references resolve to — a dict,
    or the path of a `.npz` written by `save_metadata` — in addition to the
    text's own `meta = {...}` section. Errors raise `ScriptError` (an
    `IRError`) naming the line and column and quoting the line.
    """
    if not isinstance(text, str):
        raise IRError(f"from_source expects DSL text (str), got {type(text).__name__}")
    source = Source.from_text(text, filename)
    return parse_source(source, env=default_env(), metadata=resolve_metadata(metadata))
