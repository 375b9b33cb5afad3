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
offset and the pool's chunked digest (computed once, and reused for the cache
and the library's weight check) instead of being hashed a second time.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
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

    `pool`, if given, must be `ConstantPool.from_module(mod)`.
    """
    h = hashlib.sha256()
    h.update(f"kiln.ir.fingerprint/{FINGERPRINT_VERSION}\n".encode())
    if pool is not None:
        h.update(f"pool:{pool.fingerprint()}\n".encode())
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
        if type(item) is _Token:
            texts.append(item.text)
            continue
        children: list[Any] = []
        offset = pool.find(item) if pool is not None and isinstance(item, np.ndarray) else None
        texts.append(f"pooled:{offset}:{item.dtype.str}:{item.shape};" if offset is not None
                     else _emit(item, ids, keep, children))
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


def _emit(obj: Any, ids: dict[int, int], keep: list[object], children: list[Any]) -> str:
    """Text for `obj` itself; its parts are appended to `children` (visited next, in order)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return f"{type(obj).__name__}:{obj!r};"
    if isinstance(obj, float):
        return f"float:{obj.hex()};"
    if isinstance(obj, np.generic):
        return f"np.{obj.dtype}:{obj.item()!r};"
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        # hashlib reads the array's memory: no .tobytes() copy.
        digest = hashlib.sha256(data.reshape(-1).view(np.uint8).data).hexdigest()
        return f"array:{data.dtype.str}:{data.shape}:{digest};"
    if isinstance(obj, _IDENTITY_TYPES):
        key = id(obj)
        if key in ids:
            return f"ref:{ids[key]};"
        ids[key] = len(ids)
        keep.append(obj)
        children.extend(_fields(obj))
        children.append(_CLOSE_DEF)
        return f"def:{ids[key]}:{type(obj).__name__}("
    if isinstance(obj, Mapping):
        for k, v in _sorted_items(obj):
            children.extend([_Token(f"key:{k!s};"), v])
        children.append(_CLOSE_MAP)
        return "{"
    if isinstance(obj, (tuple, list)):
        children.extend(obj)
        children.append(_CLOSE_LIST)
        return f"[{len(obj)}:"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children.extend(_fields(obj))
        children.append(_CLOSE_FIELDS)
        return f"{type(obj).__module__}.{type(obj).__name__}("
    # Anything else (e.g. a Target in an attribute): its text form. A repr
    # holding an address only costs a cache miss, never a wrong hit.
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!s};"


def _fields(obj: Any) -> list[Any]:
    out: list[Any] = []
    for token, name in _field_tokens(type(obj)):
        out.append(token)
        out.append(getattr(obj, name))
    return out


# Each dataclass's (`name=` token, field name) pairs, in field order.
_FIELD_TOKENS: dict[type, tuple[tuple[_Token, str], ...]] = {}


def _field_tokens(cls: type) -> tuple[tuple[_Token, str], ...]:
    tokens = _FIELD_TOKENS.get(cls)
    if tokens is None:
        tokens = tuple((_Token(f"{f.name}="), f.name) for f in dataclasses.fields(cls))
        _FIELD_TOKENS[cls] = tokens
    return tokens
