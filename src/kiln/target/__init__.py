"""Targets: what kiln compiles for (after Apache TVM's target RFC; docs/targets.md).

    >>> from kiln.target import Target
    >>> t = Target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon")
    >>> t.kind.name, t.get("mtriple"), t.keys
    ('llvm', 'aarch64-linux-gnu', ('cpu',))

A target is built from a kind name, a tag ("raspberry-pi/4b-aarch64"), a dict,
a JSON string or a TVM command line; it is checked against its kind's typed
schema, canonicalised, immutable, and equal to any other target with the same
canonical content. See docs/targets.md.

This package is a leaf: it imports only kiln._registry and kiln.errors from
kiln, and llvmlite only when a target needs the host (lazily).
"""

from kiln.errors import TargetError
from kiln.target.attrs import AttrSpec
from kiln.target.describe import describe
from kiln.target.kind import TargetKind
from kiln.target.registry import get_kind, list_kinds, register_kind, unregister_kind
from kiln.target.tags import Tag, get_tag, list_tags, register_tag, unregister_tag
from kiln.target.target import Target, TargetSpec

__all__ = [
    "AttrSpec",
    "Tag",
    "Target",
    "TargetError",
    "TargetKind",
    "TargetSpec",
    "describe",
    "get_kind",
    "get_tag",
    "list_kinds",
    "list_tags",
    "register_kind",
    "register_tag",
    "unregister_kind",
    "unregister_tag",
]
