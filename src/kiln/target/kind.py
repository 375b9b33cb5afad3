"""`TargetKind`: the schema and the per-kind registry of one code generator family.

A kind is what TVM calls a target id: `llvm`, `cuda`, `c`, ... It declares the
typed attributes a target of that kind accepts (schema validation, docs/targets.md),
the default `keys`, an optional canonicalizer that fills or checks attributes,
and a small registry of named per-kind attributes that later parts of the
compiler set and read (docs/targets.md, "Per-kind attributes"): `"codegen"`, `"tensor_pipeline"`,
`"loader"`, ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kiln._registry import Registry, RegistryError
from kiln.errors import TargetError
from kiln.target.attrs import COMMON_OPTIONS, AttrSpec

#: A canonicalizer receives a target's checked attributes (defaults filled,
#: `host` already a Target) and returns the attributes to keep. It may fill
#: values (llvm fills `mtriple` from the host) or raise TargetError. It must be
#: idempotent: canonicalizing its own output changes nothing.
Canonicalizer = Callable[[dict[str, Any]], dict[str, Any]]

_KIND_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True, eq=False)
class TargetKind:
    """One kind of target: its attribute schema, default keys and per-kind attributes.

    Args:
        name: the kind's name, e.g. "llvm".
        options: the kind's own attributes; the common ones (kind, tag, keys,
            libs, host, device, model) are added automatically. After
            construction `options` maps every attribute name to its AttrSpec.
        default_keys: keys every target of this kind carries, e.g. ("cpu",).
        canonicalizer: optional function that fills or checks attributes.
        doc: one line describing the kind.

    Kinds compare by identity; the registry holds one object per name.
    """

    name: str
    options: Mapping[str, AttrSpec] = field(default_factory=dict)
    default_keys: tuple[str, ...] = ()
    canonicalizer: Canonicalizer | None = None
    doc: str = ""
    _attrs: Registry[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not _KIND_NAME.fullmatch(self.name):
            raise TargetError(
                f"target kind name '{self.name}' must be lowercase letters, digits and '_'"
            )
        merged: dict[str, AttrSpec] = dict(COMMON_OPTIONS)
        for option, spec in self.options.items():
            if option in COMMON_OPTIONS:
                raise TargetError(
                    f"target kind '{self.name}': '{option}' is a common attribute of every "
                    "kind; do not declare it again"
                )
            if not isinstance(spec, AttrSpec):
                raise TargetError(
                    f"target kind '{self.name}': option '{option}' must be an AttrSpec, "
                    f"got {type(spec).__name__}"
                )
            merged[option] = spec
        object.__setattr__(self, "options", MappingProxyType(dict(sorted(merged.items()))))
        object.__setattr__(self, "default_keys", tuple(self.default_keys))
        object.__setattr__(self, "_attrs", Registry(f"target kind '{self.name}' attribute"))

    @property
    def own_options(self) -> Mapping[str, AttrSpec]:
        """The kind's own attributes, without the common ones."""
        return MappingProxyType(
            {name: spec for name, spec in self.options.items() if name not in COMMON_OPTIONS}
        )

    def set_attr(
        self, key: str, value: object = None, *, lazy: str | None = None, override: bool = False
    ) -> None:
        """Register a per-kind attribute, e.g. `set_attr("codegen", emit_llvm)`.

        `lazy="module:attr"` registers an import path resolved on first
        `get_attr`, so registering a backend does not import it. Setting a key
        twice raises TargetError unless `override=True`.
        """
        if (value is None) == (lazy is None):
            raise TargetError(f"set_attr('{key}') takes exactly one of value and lazy=")
        try:
            if lazy is not None:
                self._attrs.register(key, lazy=lazy, override=override)
            else:
                self._attrs.register(key, value, override=override)
        except RegistryError as err:
            raise TargetError(str(err)) from None

    def get_attr(self, key: str, default: Any = None) -> Any:
        """The per-kind attribute `key`, or `default` when it was never set."""
        if key not in self._attrs:
            return default
        return self._attrs.get(key)

    def attr_names(self) -> list[str]:
        """Names of the per-kind attributes set so far."""
        return self._attrs.names()

    def canonicalize(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Run the canonicalizer (if any) over checked attributes."""
        if self.canonicalizer is None:
            return attrs
        return self.canonicalizer(dict(attrs))

    def __repr__(self) -> str:
        return f"TargetKind('{self.name}')"
