"""The C library's functions through ctypes: one handle on the process's C library
(errno kept for the callers that report it), each function given its signature where
it is looked up."""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _process_libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def libc_function(name: str, restype: Any, *argtypes: Any) -> Any:
    """The C library's `name` with result type `restype` and `argtypes`, or None where
    the C library lacks it (or the process has no C library ctypes can open)."""
    try:
        # Indexing makes a function object of its own (getattr would hand every caller
        # ctypes' one cached object, and a second signature would overwrite the first).
        fn = _process_libc()[name]
    except (AttributeError, OSError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


__all__ = ["libc_function"]
