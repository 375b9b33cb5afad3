"""A strict structural comparison for the DSL tests.

`kiln.ir.assert_structural_equal` is the project's comparison (the tests run
both); this private one is stricter where the DSL promises more: float literals compare by `repr`
(so -0.0 != 0.0, nan == nan), arrays by dtype, shape and bytes, attributes by
value *and* container type (a list does not equal a tuple), and it can also
require equal name hints. Variables and buffers map one-to-one, by position
of first appearance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule

# Nodes compared by identity in the IR; here they are matched by a bijection.
_BOUND = (t.Var, t.Buffer, g.Var)


class Mismatch(AssertionError):
    pass


class _Comparer:
    def __init__(self, names: bool) -> None:
        self.names = names
        self.fwd: dict[int, Any] = {}
        self.back: dict[int, Any] = {}

    def fail(self, path: str, msg: str) -> None:
        raise Mismatch(f"at {path or '<root>'}: {msg}")

    def value(self, a: Any, b: Any, path: str) -> None:
        if type(a) is not type(b):
            self.fail(path, f"type {type(a).__name__} != {type(b).__name__}: {a!r} vs {b!r}")
        if isinstance(a, _BOUND):
            self.bound(a, b, path)
        elif isinstance(a, np.ndarray):
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                self.fail(path, f"arrays differ: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        elif isinstance(a, float):
            if repr(a) != repr(b):
                self.fail(path, f"{a!r} != {b!r}")
        elif isinstance(a, (tuple, list)):
            if len(a) != len(b):
                self.fail(path, f"length {len(a)} != {len(b)}")
            for k, (x, y) in enumerate(zip(a, b)):
                self.value(x, y, f"{path}[{k}]")
        elif isinstance(a, dict) or type(a).__name__ == "mappingproxy":
            if list(a) != list(b):
                self.fail(path, f"keys {list(a)} != {list(b)}")
            for k in a:
                self.value(a[k], b[k], f"{path}.{k}")
        elif dataclasses.is_dataclass(a):
            for f in dataclasses.fields(a):
                self.value(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
        elif a != b:
            self.fail(path, f"{a!r} != {b!r}")

    def bound(self, a: Any, b: Any, path: str) -> None:
        seen = self.fwd.get(id(a))
        if seen is not None:
            if seen is not b:
                self.fail(path, f"{a!r} maps to two different nodes")
            return
        if id(b) in self.back:
            self.fail(path, f"{b!r} is already matched to another node")
        self.fwd[id(a)] = b
        self.back[id(b)] = a
        for f in dataclasses.fields(a):
            if f.name == "name" and not self.names:
                continue
            self.value(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")


def strict_equal(a: IRModule, b: IRModule, *, names: bool = False) -> None:
    """Raise Mismatch (an AssertionError) saying where `a` and `b` differ."""
    if list(a) != list(b):
        raise Mismatch(f"function names {list(a)} != {list(b)}")
    _Comparer(names).value(dict(a.attrs), dict(b.attrs), "attrs")
    for name in a:
        # Each function has its own variables.
        _Comparer(names).value(a[name], b[name], name)


def assert_roundtrip_equal(parsed: IRModule, original: IRModule, *, names: bool = False) -> None:
    """The strict comparison plus the project's structural equality.

    map_free_vars: kiln.ir.structural defines variables at their binding sites,
    so a symbolic dimension of a graph parameter type, or a buffer shape naming
    a scalar parameter that comes later, counts as a free variable there; the
    strict comparison above already checks those map one-to-one.
    """
    from kiln.ir import assert_structural_equal

    strict_equal(parsed, original, names=names)
    assert_structural_equal(parsed, original, map_free_vars=True)
