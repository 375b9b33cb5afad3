"""Results computed from immutable IR nodes, kept for as long as the node lives.

IR nodes are frozen and compared by identity, so a result derived from one (an
analysis of a PrimFunc, its compiled interpreter code) holds for the object's
lifetime. The cache keys on the node weakly: an entry goes when its node does, so
it neither keeps a model's kernels alive nor hands one node's result to another
that reuses its `id`. A cached value must not refer to its own key.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityCache(Generic[K, V]):
    """`get_or_compute(node, compute)`: `compute(node)` once per live `node`."""

    def __init__(self) -> None:
        self._entries: weakref.WeakKeyDictionary[K, V] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # compiles may run in threads (build-many, tuning)

    def get(self, node: K) -> V | None:
        """The result kept for `node`, or None (nothing is computed)."""
        with self._lock:
            return self._entries.get(node)

    def put(self, node: K, value: V) -> None:
        """Keep `value` as `node`'s result (one known to equal what compute would give)."""
        with self._lock:
            self._entries[node] = value

    def get_or_compute(self, node: K, compute: Callable[[K], V]) -> V:
        with self._lock:
            hit = self._entries.get(node)
        if hit is not None:
            return hit
        value = compute(node)  # outside the lock: a computation may be long or nest
        with self._lock:
            self._entries[node] = value
        return value
