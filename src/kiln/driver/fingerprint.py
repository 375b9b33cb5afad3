"""A structural content hash of an IRModule, for the compile cache.

Two modules get the same fingerprint only if they are structurally identical,
including every name hint (names become symbols and metadata), every attribute
and the bytes of every constant. Variables and buffers are numbered by first
appearance, so a module rebuilt from the same source hashes the same in any
process. The walk is iterative (deep expression trees do not hit Python's
recursion limit).

The hash is computed from the IR itself rather than from printed kiln.script
text: it covers the constants' bytes exactly and depends on no printer.

Given the module's `ConstantPool`, constants in the pool are named by their
offset, dtype and shape only: the fingerprint is then the module's structure without
its weights' bytes, and the compile cache keys the pool's chunked digest apart
(`kiln.driver.cache.cache_key`), so a build can ask whether the cache holds this
structure before the weights are hashed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule

if TYPE_CHECKING:
    from kiln.codegen.constants import ConstantPool

# Objects compared by identity in the IR: numbered on first sight.
_IDENTITY_TYPES = (t.Var, t.Buffer, g.Var)

FINGERPRINT_VERSION = 2


def module_fingerprint(mod: IRModule, pool: ConstantPool | None = None) -> str:
    """Hex SHA-256 over the module's structure (see the module docstring).

    `pool`, if given, must be `ConstantPool.from_module(mod)`: its constants are named by
    their place, not hashed (the caller keys `pool.fingerprint()` beside this one).
    """
    h = hashlib.sha256()
    h.update(f"kiln.ir.fingerprint/{FINGERPRINT_VERSION}\n".encode())
    if pool is not None:
        h.update(b"pooled\n")
    ids: dict[int, int] = {}
    keep: list[object] = []  # keeps id() values unique during the walk
    stack: list[Any] = [("module-attrs", _sorted_items(mod.attrs))]
    for name in sorted(mod.functions):
        stack.append(("function", name, mod.functions[name]))
    stack.reverse()
    # The texts are hashed in batches: SHA-256 of their concatenation is the same
    # fingerprint, without a hash update (and an encode) per node.
    texts: list[str] = []
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls is _Token:  # most items: the text between an object's parts
            texts.append(item.text)
            continue
        emit = _EMITTERS.get(cls) or _emitter_for(cls)
        offset = pool.find(item) if emit is _emit_array and pool is not None else None
        if offset is not None:
            texts.append(f"pooled:{offset}:{item.dtype.str}:{item.shape};")
        else:
            children: list[Any] = []
            texts.append(emit(item, ids, keep, children))
            if children:
                stack.extend(reversed(children))
        if len(texts) >= _BATCH:
            h.update("".join(texts).encode("utf-8", "surrogatepass"))
            texts.clear()
    h.update("".join(texts).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


# Texts hashed at once (a few hundred KB of text).
_BATCH = 8192


class _Token:
    """Text hashed as it is, between an object's parts."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_CLOSE_DEF, _CLOSE_LIST, _CLOSE_MAP, _CLOSE_FIELDS = (
    _Token(");"), _Token("]"), _Token("}"), _Token(")"))


def _sorted_items(m: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(m.items(), key=lambda kv: str(kv[0])))


# How an object is hashed depends on its type only: each type's emitter is chosen once
# (`_emitter_for`), not by a chain of isinstance tests per node. An emitter returns the
# text of the object itself and appends its parts to `children` (visited next, in order).
_Emitter = Callable[[Any, dict[int, int], list[object], list[Any]], str]


def _emit_scalar(obj: Any, ids: dict[int, int], keep: list[object],
                 children: list[Any]) -> str:
    return f"{type(obj).__name__}:{obj!r};"


def _emit_float(obj: float, ids: dict[int, int], keep: list[object],
                children: list[Any]) -> str:
    return f"float:{obj.hex()};"


def _emit_np_scalar(obj: np.generic, ids: dict[int, int], keep: list[object],
                    children: list[Any]) -> str:
    return f"np.{obj.dtype}:{obj.item()!r};"


def _emit_array(obj: np.ndarray, ids: dict[int, int], keep: list[object],
                children: list[Any]) -> str:
    data = np.ascontiguousarray(obj)
    # hashlib reads the array's memory: no .tobytes() copy.
    digest = hashlib.sha256(data.reshape(-1).view(np.uint8).data).hexdigest()
    return f"array:{data.dtype.str}:{data.shape}:{digest};"


def _emit_identity(obj: Any, ids: dict[int, int], keep: list[object],
                   children: list[Any]) -> str:
    key = id(obj)
    if key in ids:
        return f"ref:{ids[key]};"
    ids[key] = len(ids)
    keep.append(obj)
    children.extend(_fields(obj))
    children.append(_CLOSE_DEF)
    return f"def:{ids[key]}:{type(obj).__name__}("


def _emit_mapping(obj: Mapping[str, Any], ids: dict[int, int], keep: list[object],
                  children: list[Any]) -> str:
    for k, v in _sorted_items(obj):
        children.extend([_Token(f"key:{k!s};"), v])
    children.append(_CLOSE_MAP)
    return "{"


def _emit_sequence(obj: tuple[Any, ...] | list[Any], ids: dict[int, int],
                   keep: list[object], children: list[Any]) -> str:
    children.extend(obj)
    children.append(_CLOSE_LIST)
    return f"[{len(obj)}:"


def _emit_dataclass(obj: Any, ids: dict[int, int], keep: list[object],
                    children: list[Any]) -> str:
    children.extend(_fields(obj))
    children.append(_CLOSE_FIELDS)
    return f"{type(obj).__module__}.{type(obj).__name__}("


def _emit_other(obj: Any, ids: dict[int, int], keep: list[object],
                children: list[Any]) -> str:
    # Anything else (e.g. a Target in an attribute): its text form. A repr
    # holding an address only costs a cache miss, never a wrong hit.
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!s};"


_EMITTERS: dict[type, _Emitter] = {}


def _emitter_for(cls: type) -> _Emitter:
    """The emitter of objects of type `cls` (the first matching rule, in order)."""
    emit: _Emitter
    if cls is type(None) or issubclass(cls, (bool, int, str)):
        emit = _emit_scalar
    elif issubclass(cls, float):
        emit = _emit_float
    elif issubclass(cls, np.generic):
        emit = _emit_np_scalar
    elif issubclass(cls, np.ndarray):
        emit = _emit_array
    elif issubclass(cls, _IDENTITY_TYPES):
        emit = _emit_identity
    elif issubclass(cls, Mapping):
        emit = _emit_mapping
    elif issubclass(cls, (tuple, list)):
        emit = _emit_sequence
    elif dataclasses.is_dataclass(cls):
        emit = _emit_dataclass
    else:
        emit = _emit_other
    _EMITTERS[cls] = emit
    return emit


def _fields(obj: Any) -> list[Any]:
    """`obj`'s fields as [`name=` token, value, ...], in field order."""
    cls = type(obj)
    layout = _FIELD_LAYOUT.get(cls) or _field_layout(cls)
    out = list(layout.tokens)  # tokens at even positions, values filled in between
    out[1::2] = layout.values(obj)
    return out


class _FieldLayout:
    """A dataclass's `name=` tokens (interleaved with placeholders for the values) and
    a getter of its field values as a tuple."""

    __slots__ = ("tokens", "values")

    def __init__(self, cls: type) -> None:
        names = [f.name for f in dataclasses.fields(cls)]
        self.tokens: tuple[object, ...] = tuple(
            part for n in names for part in (_Token(f"{n}="), None))
        getter = operator.attrgetter(*names) if names else (lambda obj: ())
        # attrgetter of one name returns the value itself, not a 1-tuple
        self.values: Callable[[Any], tuple[Any, ...]] = (
            (lambda obj: (getter(obj),)) if len(names) == 1 else getter)


_FIELD_LAYOUT: dict[type, _FieldLayout] = {}


def _field_layout(cls: type) -> _FieldLayout:
    layout = _FIELD_LAYOUT[cls] = _FieldLayout(cls)
    return layout
