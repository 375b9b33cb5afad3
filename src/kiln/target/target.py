"""`Target`: an immutable, validated, canonical description of what to compile for.

A target configures the compiler only (docs/targets.md, Apache TVM's target RFC): every
attribute changes generated code. Building one runs the same steps whatever
the spec's form (kind name, tag, dict, JSON, command line):

1. parse the spec into a dict (`parse.py`);
2. merge a tag's config under the spec's own attributes;
3. look up the kind and check every name and value against its schema;
4. fill defaults, compute `keys`, build `host` / `devices` as Targets;
5. run the kind's canonicalizer, then check the result again.

Two targets are equal when their canonical JSON is; `fingerprint()` hashes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Literal, NoReturn, Union, overload

from kiln.errors import TargetError
from kiln.target.attrs import (
    NOT_TARGET_ATTRS,
    RENAMED_ATTRS,
    TARGET_TYPES,
    AttrSpec,
    suggest_name,
    unique,
)
from kiln.target.host import host_config
from kiln.target.kind import TargetKind
from kiln.target.parse import spec_to_dict
from kiln.target.registry import get_kind
from kiln.target.tags import get_tag

#: What `Target(...)` accepts.
TargetSpec = Union[str, Mapping[str, Any], "Target"]

_SCOPE = threading.local()


class Target:
    """A compilation target: a kind, its checked attributes, and an optional host.

    Args:
        spec: a kind name ("llvm"), a tag ("raspberry-pi/4b-aarch64"), a dict,
            a JSON string, a TVM command line
            ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon") or a Target.
            A dict with "tag" and other attributes merges them over the tag.
        host: the target for host-side code (any accepted spec); replaces a
            host given in `spec`.

    Raises:
        TargetError: unknown kind, tag or attribute, or a value of the wrong
            type; the message names the attribute and suggests a fix.
    """

    __slots__ = ("_json", "_kind", "_values")

    _kind: TargetKind
    _values: Mapping[str, Any]
    _json: str

    def __init__(self, spec: TargetSpec, host: TargetSpec | None = None) -> None:
        if isinstance(spec, Target) and host is None:
            kind, values = spec._kind, spec._values
        else:
            raw = spec.export() if isinstance(spec, Target) else spec_to_dict(spec)
            if host is not None:
                raw["host"] = host
            kind, values = _build(raw)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_values", MappingProxyType(values))
        object.__setattr__(self, "_json", _canonical_json(self.export()))

    # -- accessors ---------------------------------------------------------

    @property
    def kind(self) -> TargetKind:
        """The target's kind (`.name`, `.options`, `.get_attr(...)`)."""
        return self._kind

    @property
    def tag(self) -> str | None:
        """The canonical tag this target was built from, if any."""
        tag: str | None = self._values.get("tag")
        return tag

    @property
    def keys(self) -> tuple[str, ...]:
        """Strategy groups, most specific first (e.g. ('arm_cpu', 'cpu'))."""
        keys: tuple[str, ...] = self._values["keys"]
        return keys

    @property
    def libs(self) -> tuple[str, ...]:
        """Extension libraries codegen may call (e.g. ('cublas',)), sorted."""
        libs: tuple[str, ...] = self._values["libs"]
        return libs

    @property
    def host(self) -> Target | None:
        """The target for host-side code, or None."""
        host: Target | None = self._values.get("host")
        return host

    @property
    def devices(self) -> tuple[Target, ...]:
        """The device targets of a composite target; () for other kinds."""
        devices: tuple[Target, ...] = self._values.get("devices", ())
        return devices

    @property
    def attrs(self) -> Mapping[str, Any]:
        """Every set attribute except `kind`, read-only (lists are tuples)."""
        return self._values

    def get(self, name: str, default: Any = None) -> Any:
        """The value of attribute `name`, or `default` when it is unset.

        A name the kind does not declare raises TargetError (with a
        suggestion), so a typo is not mistaken for an unset attribute.
        """
        if name == "kind":
            return self._kind.name
        if name not in self._kind.options:
            _unknown_attribute(self._kind, name)
        return self._values.get(name, default)

    # -- derived targets ---------------------------------------------------

    def with_host(self, host: TargetSpec | None) -> Target:
        """This target with `host` replaced; None removes it."""
        return self.with_attrs(host=host)

    def with_attrs(self, attrs: Mapping[str, Any] | None = None, /, **more: Any) -> Target:
        """This target with some attributes replaced.

        Attribute names with '-' go in the mapping: `t.with_attrs({"opt-level": 2})`.
        A value of None resets the attribute to the kind's default. Resetting
        an attribute that the target's tag sets detaches the result from the
        tag (its `tag` becomes None), since the tag would set it again.
        """
        changes = {**(attrs or {}), **more}
        raw = self.export()
        raw.update(changes)
        if self.tag is not None and "tag" not in changes:
            tag_config = get_tag(self.tag).config
            if any(value is None and name in tag_config for name, value in changes.items()):
                raw.pop("tag")
        return Target(raw)

    # -- canonical form ----------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The canonical dict: sorted keys, defaults filled, host and devices nested.

        Unset attributes are absent. `Target(t.export()) == t` always holds.
        """
        out: dict[str, Any] = {"kind": self._kind.name}
        for name, value in self._values.items():
            out[name] = _export_value(value)
        return dict(sorted(out.items()))

    def fingerprint(self) -> str:
        """A stable content hash (sha256 hex of the canonical JSON), for caches."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def __str__(self) -> str:
        return self._json

    def __repr__(self) -> str:
        return f"Target({self._json!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Target):
            return NotImplemented
        return self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Target is immutable; use with_attrs() to change '{name}'")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Target is immutable; cannot delete '{name}'")

    def __reduce__(self) -> tuple[type[Target], tuple[dict[str, Any]]]:
        return (Target, (self.export(),))

    def __copy__(self) -> Target:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Target:
        return self

    # -- scope ---------------------------------------------------------------

    def __enter__(self) -> Target:
        _scope_stack().append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack = _scope_stack()
        if not stack or stack[-1] is not self:
            raise TargetError("Target scopes must be exited in the order they were entered")
        stack.pop()

    @overload
    @staticmethod
    def current(allow_none: Literal[True] = ...) -> Target | None: ...

    @overload
    @staticmethod
    def current(allow_none: Literal[False]) -> Target: ...

    @staticmethod
    def current(allow_none: bool = True) -> Target | None:
        """The innermost target entered with `with target:` on this thread.

        With `allow_none=False`, no target in scope raises TargetError.
        """
        stack = _scope_stack()
        if stack:
            return stack[-1]
        if allow_none:
            return None
        raise TargetError("no target is in scope; use 'with Target(...):' or pass a target")

    @staticmethod
    def from_host() -> Target:
        """The `llvm` target of this machine: its triple, CPU name and CPU features.

        Detected once with llvmlite and cached.
        """
        return _host_target()


@functools.cache
def _host_target() -> Target:
    return Target(host_config())


def _scope_stack() -> list[Target]:
    stack: list[Target] | None = getattr(_SCOPE, "stack", None)
    if stack is None:
        stack = []
        _SCOPE.stack = stack
    return stack


def _canonical_json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _export_value(value: object) -> Any:
    if isinstance(value, Target):
        return value.export()
    if isinstance(value, tuple):
        return [_export_value(item) for item in value]
    return value


# -- building --------------------------------------------------------------


def _build(raw: dict[str, Any]) -> tuple[TargetKind, dict[str, Any]]:
    """Validate and canonicalise a raw spec dict; returns the kind and sorted values."""
    given = {name: value for name, value in raw.items() if value is not None}
    given = _apply_tag(given)
    if "kind" not in given:
        if "id" in given:
            raise TargetError("target spec uses 'id'; kiln calls it 'kind'")
        raise TargetError(
            f"target spec has neither 'kind' nor 'tag': {given!r}; "
            "e.g. {'kind': 'llvm', 'mcpu': 'neoverse-v1'}"
        )
    kind = get_kind(given.pop("kind"))
    for name in given:
        if name not in kind.options:
            _unknown_attribute(kind, name)
    values: dict[str, Any] = {}
    for name, spec in kind.options.items():
        value = given.get(name, spec.default)
        if name != "kind" and value is not None:
            values[name] = _check_value(kind, name, spec, value)
    device: tuple[str, ...] = (values["device"],) if "device" in values else ()
    values["keys"] = unique((*values["keys"], *device, *kind.default_keys))
    values["libs"] = tuple(sorted(set(values["libs"])))
    values = _recheck(kind, kind.canonicalize(values))
    _check_host(kind, values.get("host"))
    return kind, dict(sorted(values.items()))


def _apply_tag(given: dict[str, Any]) -> dict[str, Any]:
    """Merge the tag's config under the given attributes; record the canonical tag."""
    name = given.get("tag")
    if name is None:
        return given
    tag = get_tag(name)
    merged = tag.config
    if "kind" in given and given["kind"] != merged["kind"]:
        raise TargetError(
            f"tag '{tag.canonical}' is a '{merged['kind']}' target; its kind cannot be "
            f"overridden with '{given['kind']}'"
        )
    merged.update(given)
    merged["tag"] = tag.canonical
    return merged


def _check_value(kind: TargetKind, name: str, spec: AttrSpec, value: object) -> Any:
    where = f"attribute '{name}' of target kind '{kind.name}'"
    if spec.type_name == "target":
        return _nested(value, where)
    if spec.type_name == "list[target]":
        if isinstance(value, str | Mapping | Target) or not isinstance(value, list | tuple):
            raise TargetError(f"{where} expects a list of targets, got {type(value).__name__}")
        return tuple(_nested(item, f"{where}, item {index}") for index, item in enumerate(value))
    return spec.check(value, where)


def _nested(value: object, where: str) -> Target:
    if isinstance(value, Target):
        return value
    if not isinstance(value, str | Mapping):
        raise TargetError(f"{where} expects a target spec, got {type(value).__name__} {value!r}")
    try:
        return Target(value)
    except TargetError as err:
        raise TargetError(f"in {where}: {err}") from None


def _recheck(kind: TargetKind, values: dict[str, Any]) -> dict[str, Any]:
    """Check a canonicalizer's output: known names, right types, None dropped."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        spec = kind.options.get(name)
        if spec is None or name == "kind":
            raise TargetError(
                f"the canonicalizer of target kind '{kind.name}' produced unknown "
                f"attribute '{name}'"
            )
        out[name] = value if spec.type_name in TARGET_TYPES else _check_value(
            kind, name, spec, value
        )
    return out


def _check_host(kind: TargetKind, host: Target | None) -> None:
    if host is None:
        return
    if host.host is not None:
        raise TargetError(
            f"the host of a '{kind.name}' target has a host of its own ({host.host.kind.name}); "
            "a host target cannot have a host"
        )
    if "cpu" not in host.keys:
        raise TargetError(
            f"the host of a '{kind.name}' target must be a CPU target (llvm, c, ...); "
            f"got kind '{host.kind.name}' with keys {list(host.keys)}"
        )


def _unknown_attribute(kind: TargetKind, name: str) -> NoReturn:
    if name in NOT_TARGET_ATTRS:
        raise TargetError(f"'{name}' is not a target attribute: {NOT_TARGET_ATTRS[name]}")
    renamed = RENAMED_ATTRS.get(name)
    if renamed is not None and renamed in kind.options:
        raise TargetError(
            f"target kind '{kind.name}' has no attribute '{name}'; kiln calls it '{renamed}'"
        )
    options = [option for option in kind.options if option != "kind"]
    raise TargetError(
        f"target kind '{kind.name}' has no attribute '{name}'.{suggest_name(name, options)} "
        f"Valid attributes: {', '.join(options)}"
    )
