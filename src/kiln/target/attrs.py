"""Typed target attributes: `AttrSpec`, value checking and command-line coercion.

Every attribute a target kind accepts is declared as an `AttrSpec`: a type, a
default, and optionally the valid choices or an integer range. Checking a value
returns its canonical, immutable form (lists become tuples) or raises a
`TargetError` that names the attribute, the expected type and what was given.

Types are written as Python types (`str`, `int`, `bool`, `float`, `list[str]`,
`list[int]`) or by name ("str", ..., "list[int]"). Two more names exist for
attributes that hold targets: "target" (the `host`) and "list[target]"
(`devices` of a composite); the target builder checks those itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kiln._registry import suggest
from kiln.errors import TargetError

#: The type names an `AttrSpec` may carry, after normalisation.
TYPE_NAMES: tuple[str, ...] = (
    "str", "int", "bool", "float", "list[str]", "list[int]", "target", "list[target]",
)

#: Types whose values are targets; `kiln.target.target` builds them.
TARGET_TYPES: frozenset[str] = frozenset({"target", "list[target]"})

_PYTHON_TYPES: dict[object, str] = {
    str: "str",
    int: "int",
    bool: "bool",
    float: "float",
    list[str]: "list[str]",
    list[int]: "list[int]",
}

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# A feature for LLVM's -mattr: "+name" or "-name"; names look like "neon",
# "fp-armv8", "avx512f", "mve.fp", "v8.2a", "ptx80".
_FEATURE = re.compile(r"[+-][A-Za-z0-9][A-Za-z0-9_.\-]*")


def normalize_type(type_: object) -> str:
    """The canonical type name for `type_` (a Python type or a name in TYPE_NAMES)."""
    if isinstance(type_, str):
        if type_ in TYPE_NAMES:
            return type_
        raise TargetError(
            f"unknown attribute type '{type_}'.{suggest(type_, TYPE_NAMES)} "
            f"Valid types: {', '.join(TYPE_NAMES)}"
        )
    try:
        return _PYTHON_TYPES[type_]
    except (KeyError, TypeError):
        raise TargetError(
            f"unsupported attribute type {type_!r}; use one of {', '.join(TYPE_NAMES)}"
        ) from None


def suggest_name(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """" did you mean 'x'?" for the closest choice, also when only the case differs."""
    hint = suggest(name, choices)
    if hint:
        return hint
    by_lower = {choice.lower(): choice for choice in choices}
    if name.lower() in by_lower:
        return f" did you mean '{by_lower[name.lower()]}'?"
    return suggest(name.lower(), choices)


def show(value: object) -> str:
    """`value` as an error message quotes it: its type and its repr."""
    return f"{type(value).__name__} {value!r}"


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """The declaration of one target attribute.

    Args:
        type: `str`, `int`, `bool`, `float`, `list[str]`, `list[int]`, or one of
            those names, or "target" / "list[target]".
        default: the value used when a spec does not give one; None means
            "unset" (the attribute is then absent from the target).
        choices: for `str` attributes, the only values allowed.
        min, max: for `int` attributes, the inclusive range allowed.
        doc: one line for `describe()` and docs/targets.md.
    """

    type: object
    default: object = None
    choices: tuple[str, ...] | None = None
    min: int | None = None
    max: int | None = None
    doc: str = ""
    type_name: str = field(init=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "type_name", normalize_type(self.type))
        if self.choices is not None:
            if self.type_name != "str":
                raise TargetError(f"choices apply only to str attributes, not {self.type_name}")
            object.__setattr__(self, "choices", tuple(self.choices))
        if (self.min is not None or self.max is not None) and self.type_name != "int":
            raise TargetError(f"min/max apply only to int attributes, not {self.type_name}")
        if self.default is not None and self.type_name not in TARGET_TYPES:
            object.__setattr__(self, "default", self.check(self.default, "the default"))

    @property
    def expected(self) -> str:
        """The expected type as error messages and `describe()` show it."""
        text = self.type_name
        if self.choices is not None:
            text += " (one of " + ", ".join(repr(c) for c in self.choices) + ")"
        if self.min is not None and self.max is not None:
            text += f" in {self.min}..{self.max}"
        elif self.min is not None:
            text += f" >= {self.min}"
        elif self.max is not None:
            text += f" <= {self.max}"
        return text

    def check(self, value: object, where: str) -> Any:
        """Return the canonical form of `value`, or raise TargetError.

        `where` names the attribute in messages, e.g. "attribute 'mcpu' of
        target kind 'llvm'".
        """
        name = self.type_name
        if name == "str":
            return self._check_str(value, where)
        if name == "int":
            return self._check_int(value, where)
        if name == "bool":
            if isinstance(value, bool):
                return value
            raise TargetError(f"{where} expects bool, got {show(value)}{_hint(value, name)}")
        if name == "float":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise TargetError(f"{where} expects float, got {show(value)}")
        if name in ("list[str]", "list[int]"):
            return self._check_list(value, where)
        raise TargetError(f"{where}: a {name} value is checked by the target builder")

    def parse_text(self, text: str, where: str) -> Any:
        """Coerce the text of a command-line value (`-name=text`) to this type."""
        name = self.type_name
        if name == "int":
            try:
                return self.check(int(text), where)
            except ValueError:
                raise TargetError(f"{where} expects int, got '{text}'") from None
        if name == "float":
            try:
                return float(text)
            except ValueError:
                raise TargetError(f"{where} expects float, got '{text}'") from None
        if name == "bool":
            word = text.lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
            raise TargetError(f"{where} expects bool (true/false/1/0), got '{text}'")
        if name == "list[str]":
            return self.check([item for item in text.split(",") if item], where)
        if name == "list[int]":
            items = [item for item in text.split(",") if item]
            try:
                return self.check([int(item) for item in items], where)
            except ValueError:
                raise TargetError(f"{where} expects list[int], got '{text}'") from None
        if name == "list[target]":
            raise TargetError(f"{where} cannot be written on a command line; use a dict or JSON")
        return self.check(text, where) if name == "str" else text

    def _check_str(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise TargetError(f"{where} expects str, got {show(value)}{_hint(value, 'str')}")
        if self.choices is not None and value not in self.choices:
            raise TargetError(
                f"{where} must be one of {', '.join(repr(c) for c in self.choices)}; "
                f"got '{value}'.{suggest_name(value, self.choices)}"
            )
        return value

    def _check_int(self, value: object, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TargetError(f"{where} expects int, got {show(value)}{_hint(value, 'int')}")
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            raise TargetError(f"{where} expects {self.expected}, got {value}")
        return value

    def _check_list(self, value: object, where: str) -> tuple[Any, ...]:
        item_type = str if self.type_name == "list[str]" else int
        if isinstance(value, str):
            raise TargetError(
                f"{where} expects {self.type_name}, got {show(value)}; "
                f"write a list such as {[value]!r}"
            )
        if not isinstance(value, list | tuple):
            raise TargetError(f"{where} expects {self.type_name}, got {show(value)}")
        for item in value:
            wrong_type = not isinstance(item, item_type) or isinstance(item, bool)
            if wrong_type:
                raise TargetError(
                    f"{where} expects {self.type_name}, but an item is {show(item)}"
                )
        return tuple(value)


def _hint(value: object, expected: str) -> str:
    """A short fix for common wrong-type mistakes, or ''."""
    if expected == "int" and isinstance(value, bool):
        return "; a bool is not an int, write a number such as 1"
    if expected == "int" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return f"; write {value.strip()} without quotes"
    if expected == "int" and isinstance(value, float) and value.is_integer():
        return f"; write {int(value)}"
    words = _TRUE_WORDS | _FALSE_WORDS
    if expected == "bool" and isinstance(value, str) and value.lower() in words:
        return f"; write {str(value.lower() in _TRUE_WORDS).lower()} without quotes"
    if expected == "bool" and isinstance(value, int) and value in (0, 1):
        return f"; write {str(bool(value)).lower()}"
    if expected == "str" and isinstance(value, list | tuple) and len(value) == 1:
        return f"; write a single string such as {value[0]!r}"
    return ""


def canonical_features(features: tuple[str, ...], where: str) -> tuple[str, ...]:
    """Canonical LLVM feature list: each "+name"/"-name", last one wins, sorted by name.

    LLVM applies -mattr left to right, so for a feature given twice only the
    last sign matters; sorting then makes equal feature sets compare equal.
    """
    by_name: dict[str, str] = {}
    for feature in features:
        if not _FEATURE.fullmatch(feature):
            raise TargetError(
                f"{where}: feature '{feature}' must be '+name' or '-name' (e.g. '+neon', '-sve')"
            )
        by_name[feature[1:]] = feature[0]
    return tuple(sign + name for name, sign in sorted(by_name.items()))


def unique(items: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`items` without repeats, first occurrence kept."""
    return tuple(dict.fromkeys(items))


#: Attributes every kind has. `kind` and `tag` select the schema; `keys` name
#: coarse strategy groups; `libs` are extension libraries codegen may call;
#: `host` is the target for host-side code; `device` and `model` refine the
#: strategy choice (TVM's `-device=arm_cpu -model=bcm2711`).
COMMON_OPTIONS: dict[str, AttrSpec] = {
    "kind": AttrSpec(str, doc="the kind (code generator family) of the target"),
    "tag": AttrSpec(str, doc="canonical name of the tag this target was built from"),
    "keys": AttrSpec(list[str], (), doc="strategy groups, most specific first"),
    "libs": AttrSpec(list[str], (), doc="extension libraries codegen may call (sorted)"),
    "host": AttrSpec("target", doc="target for the host-side code of a device target"),
    "device": AttrSpec(str, doc="device family refining the strategy, e.g. 'arm_cpu'"),
    "model": AttrSpec(str, doc="chip or board model, e.g. 'bcm2711'"),
}

#: Names that TVM accepts as target attributes but that do not change the
#: generated code (Apache TVM's target RFC: "would this option change the generated module?").
#: kiln rejects them with the reason and where the setting belongs instead.
NOT_TARGET_ATTRS: dict[str, str] = {
    "num-cores": (
        "the number of cores does not change generated code; choose the worker "
        "thread count when running the module, not in the target"
    ),
    "num_cores": (
        "the number of cores does not change generated code; choose the worker "
        "thread count when running the module, not in the target"
    ),
    "system-lib": (
        "how functions are registered is a packaging choice; pick the library kind "
        "when exporting, not in the target"
    ),
    "link-params": "where weights live is an export choice, not a target attribute",
    "executor": "the executor is chosen when compiling the model, not in the target",
    "runtime": "the runtime is chosen when exporting, not in the target",
    "device_id": "device ids belong to the runtime device, not to the target",
    "device-id": "device ids belong to the runtime device, not to the target",
}

#: Names from TVM's older target JSON and what kiln calls them.
RENAMED_ATTRS: dict[str, str] = {
    "id": "kind",
    "target_host": "host",
    "target-host": "host",
    "targets": "devices",
    "max_num_threads": "max_threads_per_block",
}
