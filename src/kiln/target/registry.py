"""The registry of target kinds: the built-in ones plus any a backend registers.

Bring-your-own-codegen (docs/targets.md): an external backend makes a `TargetKind`
with its attribute schema, registers it with `register_kind`, and sets its
per-kind attributes (`kind.set_attr("codegen", ...)`); `Target({"kind": ...})`
then validates against that schema like any built-in kind.
"""

from __future__ import annotations

from kiln._registry import Registry
from kiln.errors import TargetError
from kiln.target.attrs import suggest_name
from kiln.target.builtin_kinds import BUILTIN_KINDS
from kiln.target.kind import TargetKind

KINDS: Registry[TargetKind] = Registry("target kind")
for _kind in BUILTIN_KINDS:
    KINDS.register(_kind.name, _kind)


def register_kind(kind: TargetKind, *, override: bool = False) -> TargetKind:
    """Add `kind` to the registry so targets of that kind can be built.

    A name registered twice raises TargetError unless `override=True`.
    Returns `kind`, so a module can write `MYDEV = register_kind(TargetKind(...))`.
    """
    if not isinstance(kind, TargetKind):
        raise TargetError(f"register_kind expects a TargetKind, got {type(kind).__name__}")
    if not override and kind.name in KINDS:
        existing = KINDS.get(kind.name)
        raise TargetError(
            f"target kind '{kind.name}' is already registered "
            f"({existing.doc or 'no description'}); pass override=True to replace it"
        )
    KINDS.register(kind.name, kind, override=override)
    return kind


def unregister_kind(name: str) -> None:
    """Remove a kind (tests and plug-ins that unload themselves)."""
    KINDS.unregister(name)


def get_kind(name: str) -> TargetKind:
    """The kind called `name`; an unknown name raises TargetError with a suggestion."""
    if not isinstance(name, str):
        raise TargetError(f"a target kind is named by a str, got {type(name).__name__} {name!r}")
    if name not in KINDS:
        names = KINDS.names()
        raise TargetError(
            f"unknown target kind '{name}'.{suggest_name(name, names)} Known: {', '.join(names)}"
        )
    return KINDS.get(name)


def list_kinds() -> list[str]:
    """Names of every registered target kind, sorted."""
    return KINDS.names()
