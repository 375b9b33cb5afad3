"""Fewer garbage collections while kiln builds: `fewer_collections`.

A compile allocates millions of small IR objects while a large heap of them is alive;
at Python's default pace (a young collection every 700 new container objects, a
full one as the old generation grows) the collector rescans that heap again and
again: about 10% of ResNet-50's compile and 20% of BERT-base's (docs/performance.md,
"Compile time, round four"). While any build runs, the young generation's threshold is
raised to `YOUNG_THRESHOLD` (the older generations keep their ratios); the last build
to end restores the threshold it found. Garbage in cycles is still collected, less often:
the peak resident set of those builds did not change.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

#: The young generation's threshold during a build (Python's default is 700).
YOUNG_THRESHOLD = 10_000

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None

P = ParamSpec("P")
R = TypeVar("R")


def _enter() -> None:
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            young, *older = _saved
            if young > 0:  # 0: collection off, left so
                gc.set_threshold(max(young, YOUNG_THRESHOLD), *older)
        _depth += 1


def _exit() -> None:
    global _depth, _saved
    with _lock:
        _depth -= 1
        if _depth == 0 and _saved is not None:
            if gc.get_threshold()[0] == max(_saved[0], YOUNG_THRESHOLD):
                gc.set_threshold(*_saved)  # unless the program set its own meanwhile
            _saved = None


def fewer_collections(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run with the young generation's threshold raised (nested and concurrent
    calls included: the last to end restores it)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        _enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _exit()

    return wrapper


__all__ = ["YOUNG_THRESHOLD", "fewer_collections"]
