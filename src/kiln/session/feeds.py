"""The values of an input feed as the library takes them, converted as onnxruntime
converts them.

A numpy array or a DLPack tensor goes through as it is (the call checks its dtype and
shape); a kiln OrtValue gives its array; anything else (a Python list, a number, a
numpy scalar) becomes `np.asarray(value, dtype=the input's declared dtype)`, as
onnxruntime converts a list. A value numpy cannot convert, text, or numbers an
integer or bool input would change (1.5 for int64) raise an ArgumentTypeError naming
the input and its type, never a silently truncated feed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import ArgumentTypeError, shown
from kiln.session.node_arg import ort_type
from kiln.session.ort_value import OrtValue


def converted(name: str, value: Any, dtype: np.dtype[Any]) -> Any:
    """The value of input `name` (declared `dtype`) as the library takes it."""
    if isinstance(value, OrtValue):
        return value.numpy()
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
        return value
    want = ort_type(dtype.name)
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ArgumentTypeError(f"input '{name}' expects {want}: {type(value).__name__} "
                                f"{shown(value, 60)} is no array ({exc})") from None
    if raw.dtype.kind not in "biuf":
        raise ArgumentTypeError(f"input '{name}' expects {want}, got {type(value).__name__} "
                                f"{shown(value, 60)} (numpy reads it as {raw.dtype})")
    array = raw.astype(dtype)
    if dtype.kind in "biu" and raw.dtype.kind not in "b" and \
            not np.array_equal(array.astype(raw.dtype), raw):
        raise ArgumentTypeError(f"input '{name}' expects {want}: {shown(value, 60)} has values "
                                f"that {dtype.name} cannot hold")
    return array


__all__ = ["converted"]
