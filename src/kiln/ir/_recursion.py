"""Room for deep IR: the analyses walk trees recursively.

A long expression chain (an unrolled sum, say) is a few thousand Python frames
deep, past the default limit of 1000. Python 3.11 runs Python-to-Python calls
without growing the C stack, so a higher frame limit is safe for these walks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kiln.errors import IRError

FRAME_LIMIT = 20_000


@contextmanager
def deep_recursion(what: str) -> Iterator[None]:
    """Raise the frame limit for the duration; turn overflow into a clear IRError."""
    old = sys.getrecursionlimit()
    if old < FRAME_LIMIT:
        sys.setrecursionlimit(FRAME_LIMIT)
    try:
        yield
    except RecursionError:
        raise IRError(f"{what}: the IR is nested too deeply to walk; split long expressions "
                      "with LetStmt bindings") from None
    finally:
        if old < FRAME_LIMIT:
            sys.setrecursionlimit(old)
