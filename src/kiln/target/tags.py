"""Target tags: short canonical names for real hardware (docs/targets.md, "Tags").

Tags are data: one JSON file per vendor in `kiln/target/tags/`, read the first
time a tag is looked up. Each file is

    {"vendor": "Amazon Web Services",
     "tags": [{"name": "aws/c5", "version": "v1",          # version optional
               "aliases": ["aws/c5.xlarge", ...],
               "description": "...",
               "config": {"kind": "llvm", "mtriple": ..., "mcpu": ...}}]}

A tag's canonical name is `vendor/name`, or `vendor/name:version` when it has a
version; the bare name resolves to the latest version. Aliases resolve to the
canonical tag, which is what a target built from a tag records in `tag`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kiln._registry import Registry, suggest
from kiln.errors import TargetError
from kiln.target.attrs import suggest_name

_TAG_NAME = re.compile(r"[a-z0-9][a-z0-9._+\-]*(/[a-z0-9][a-z0-9._+\-]*)+")
_VERSION = re.compile(r"v[0-9]+(\.[0-9]+)*")


@dataclass(frozen=True, slots=True)
class Tag:
    """One tag: its canonical name, version, aliases, description and target config."""

    name: str
    version: str | None
    config_json: str
    aliases: tuple[str, ...] = ()
    description: str = ""
    source: str = ""

    @property
    def canonical(self) -> str:
        """The name a target records: 'vendor/name' or 'vendor/name:version'."""
        return self.name if self.version is None else f"{self.name}:{self.version}"

    @property
    def config(self) -> dict[str, Any]:
        """A fresh copy of the target config (the caller may change it)."""
        config: dict[str, Any] = json.loads(self.config_json)
        return config


def _version_key(version: str | None) -> tuple[int, ...]:
    return () if version is None else tuple(int(part) for part in version[1:].split("."))


class _TagTable:
    """Canonical names in a Registry, plus alias and version indexes."""

    def __init__(self) -> None:
        self.registry: Registry[Tag] = Registry("target tag")
        self.aliases: dict[str, str] = {}  # alias -> bare name
        self.versions: dict[str, list[str | None]] = {}  # bare name -> versions
        self.loaded = False
        self.lock = threading.RLock()

    def add(self, tag: Tag, *, override: bool = False) -> None:
        with self.lock:
            self._check_new(tag, override)
            self.registry.register(tag.canonical, tag, override=True)
            versions = self.versions.setdefault(tag.name, [])
            if tag.version not in versions:
                versions.append(tag.version)
                versions.sort(key=_version_key)
            for alias in tag.aliases:
                self.aliases[alias] = tag.name

    def _check_new(self, tag: Tag, override: bool) -> None:
        if tag.canonical in self.registry and not override:
            old = self.registry.get(tag.canonical)
            raise TargetError(
                f"target tag '{tag.canonical}' is defined twice: in {old.source} and in "
                f"{tag.source}; pass override=True to replace it"
            )
        if tag.name in self.aliases and not override:
            raise TargetError(
                f"target tag '{tag.name}' ({tag.source}) is already an alias of "
                f"'{self.aliases[tag.name]}'"
            )
        versions = self.versions.get(tag.name, [])
        if versions and (None in versions) != (tag.version is None):
            raise TargetError(
                f"target tag '{tag.name}' mixes versioned and unversioned entries "
                f"({tag.source}); give every entry a version"
            )
        for alias in tag.aliases:
            owner = self.aliases.get(alias)
            clash = alias in self.versions or (owner is not None and owner != tag.name)
            if clash and not override:
                raise TargetError(
                    f"alias '{alias}' of target tag '{tag.name}' ({tag.source}) is already "
                    f"the name or an alias of '{owner or alias}'"
                )

    def ensure_loaded(self) -> None:
        with self.lock:
            if self.loaded:
                return
            self.loaded = True
            from importlib import resources  # lazy: 4 ms of every start; most builds name no tag

            folder = resources.files("kiln.target") / "tags"
            for entry in sorted(folder.iterdir(), key=lambda item: item.name):
                if entry.name.endswith(".json"):
                    _load_file(entry.name, entry.read_text(encoding="utf-8"))

    def names(self) -> list[str]:
        return self.registry.names()


_TABLE = _TagTable()


def _load_file(file_name: str, text: str) -> None:
    where = f"tags/{file_name}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TargetError(f"{where} is not valid JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tags"), list):
        raise TargetError(f"{where} must be an object with a 'tags' list")
    unknown = set(data) - {"vendor", "tags"}
    if unknown:
        raise TargetError(f"{where}: unknown top-level keys {sorted(unknown)}")
    for index, entry in enumerate(data["tags"]):
        _TABLE.add(_tag_from_json(entry, f"{where} entry {index}"))


def _tag_from_json(entry: object, where: str) -> Tag:
    if not isinstance(entry, dict):
        raise TargetError(f"{where} must be an object")
    allowed = {"name", "version", "aliases", "description", "config"}
    unknown = set(entry) - allowed
    if unknown:
        key = sorted(unknown)[0]
        raise TargetError(f"{where}: unknown key '{key}'.{suggest(key, sorted(allowed))}")
    return make_tag(
        entry.get("name"),
        entry.get("config"),
        aliases=entry.get("aliases", ()),
        version=entry.get("version"),
        description=entry.get("description", ""),
        source=f"{where} ('{entry.get('name')}')",
    )


def make_tag(
    name: object,
    config: object,
    *,
    aliases: object = (),
    version: object = None,
    description: object = "",
    source: str = "",
) -> Tag:
    """Check the parts of a tag and build it (the config is checked when a target is built)."""
    where = source or f"target tag '{name}'"
    if not isinstance(name, str) or not _TAG_NAME.fullmatch(name):
        raise TargetError(
            f"{where}: a tag name is 'vendor/name' in lowercase, e.g. 'aws/c5', got {name!r}"
        )
    if version is not None and (not isinstance(version, str) or not _VERSION.fullmatch(version)):
        raise TargetError(f"{where}: a tag version looks like 'v1' or 'v1.2', got {version!r}")
    if not isinstance(config, Mapping) or not isinstance(config.get("kind"), str):
        raise TargetError(f"{where}: the config must be an object with a 'kind'")
    if "tag" in config:
        raise TargetError(f"{where}: the config must not contain 'tag' (it is the tag's name)")
    if isinstance(aliases, str) or not isinstance(aliases, list | tuple):
        raise TargetError(f"{where}: aliases must be a list of names")
    for alias in aliases:
        if not isinstance(alias, str) or not _TAG_NAME.fullmatch(alias):
            raise TargetError(f"{where}: alias {alias!r} is not a 'vendor/name' tag name")
    if not isinstance(description, str):
        raise TargetError(f"{where}: the description must be a string")
    return Tag(
        name=name,
        version=version,
        config_json=json.dumps(dict(config), sort_keys=True),
        aliases=tuple(aliases),
        description=description,
        source=source or "register_tag()",
    )


def register_tag(
    name: str,
    config: Mapping[str, Any],
    *,
    aliases: tuple[str, ...] | list[str] = (),
    version: str | None = None,
    description: str = "",
    override: bool = False,
) -> Tag:
    """Add a tag at run time (e.g. for in-house boards); returns the Tag."""
    _TABLE.ensure_loaded()
    tag = make_tag(name, config, aliases=aliases, version=version, description=description)
    _TABLE.add(tag, override=override)
    return tag


def unregister_tag(name: str) -> None:
    """Remove one version of a tag ('vendor/name:v1') or an unversioned tag, and its aliases."""
    _TABLE.ensure_loaded()
    with _TABLE.lock:
        bare, _, version = name.partition(":")
        _TABLE.registry.unregister(name)
        versions = _TABLE.versions.get(bare, [])
        if (version or None) in versions:
            versions.remove(version or None)
        if not versions:
            _TABLE.versions.pop(bare, None)
            for alias in [a for a, owner in _TABLE.aliases.items() if owner == bare]:
                del _TABLE.aliases[alias]


def is_tag(name: str) -> bool:
    """Whether `name` (a canonical name, bare name, alias, with or without version) is a tag."""
    _TABLE.ensure_loaded()
    bare, _, version = name.partition(":")
    bare = _TABLE.aliases.get(bare, bare)
    if version:
        return f"{bare}:{version}" in _TABLE.registry
    return bare in _TABLE.versions


def get_tag(name: str) -> Tag:
    """Resolve a tag name, alias or 'name:version'; a bare name gives the latest version."""
    if not isinstance(name, str):
        raise TargetError(f"a target tag is named by a str, got {type(name).__name__} {name!r}")
    _TABLE.ensure_loaded()
    bare, _, version = name.partition(":")
    bare = _TABLE.aliases.get(bare, bare)
    versions = _TABLE.versions.get(bare)
    if versions is None:
        raise TargetError(
            f"unknown target tag '{name}'.{suggest_name(bare, all_names())} "
            "See kiln.target.list_tags() for the known tags"
        )
    if not version:
        return _TABLE.registry.get(_canonical(bare, versions[-1]))
    if version not in versions:
        known = ", ".join(v for v in versions if v is not None) or "(unversioned)"
        raise TargetError(
            f"target tag '{bare}' has no version '{version}'.{suggest(version, known.split(', '))} "
            f"Versions: {known}"
        )
    return _TABLE.registry.get(_canonical(bare, version))


def _canonical(bare: str, version: str | None) -> str:
    return bare if version is None else f"{bare}:{version}"


def list_tags(*, aliases: bool = False) -> list[str]:
    """Canonical names of every tag, sorted; with `aliases=True` the aliases too."""
    _TABLE.ensure_loaded()
    names = _TABLE.names()
    if aliases:
        names = sorted({*names, *_TABLE.aliases})
    return names


def all_names() -> list[str]:
    """Every name a tag can be looked up by: canonical, bare and alias names."""
    _TABLE.ensure_loaded()
    return sorted({*_TABLE.names(), *_TABLE.versions, *_TABLE.aliases})
