"""Data types of the IR: a dtype is a canonical string such as "float32".

Strings keep the IR printable and JSON-able; this module is the one place that
knows their kinds, widths and numpy equivalents.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln._bfloat16 import numpy_bfloat16
from kiln._registry import suggest
from kiln.errors import IRError

# name -> (kind, bits); kind is "bool", "int", "uint" or "float".
DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("bool", 8),
    "int8": ("int", 8),
    "int16": ("int", 16),
    "int32": ("int", 32),
    "int64": ("int", 64),
    "uint8": ("uint", 8),
    "uint16": ("uint", 16),
    "uint32": ("uint", 32),
    "uint64": ("uint", 64),
    "float16": ("float", 16),
    "bfloat16": ("float", 16),
    "float32": ("float", 32),
    "float64": ("float", 64),
}

# The dtype loop variables and shape arithmetic use.
INDEX_DTYPE = "int64"


def check_dtype(dtype: str) -> str:
    """Return `dtype` if it is a known dtype, else raise IRError with a suggestion."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise IRError(
            f"unknown dtype {dtype!r}.{suggest(str(dtype), list(DTYPES))} "
            f"Known: {', '.join(DTYPES)}"
        )
    return dtype


# kind() and bits() run for most IR nodes of every walk (verify, passes, codegen): a
# known dtype is one dict lookup; anything else takes check_dtype's path (and error).
_KINDS = {name: k for name, (k, _) in DTYPES.items()}
_BITS = {name: b for name, (_, b) in DTYPES.items()}


def kind(dtype: str) -> str:
    """"bool", "int", "uint" or "float"."""
    if type(dtype) is str:
        known = _KINDS.get(dtype)
        if known is not None:
            return known
    return DTYPES[check_dtype(dtype)][0]


def bits(dtype: str) -> int:
    """Width in bits (bool is stored in 8)."""
    if type(dtype) is str:
        known = _BITS.get(dtype)
        if known is not None:
            return known
    return DTYPES[check_dtype(dtype)][1]


def itemsize(dtype: str) -> int:
    """Bytes one element takes in memory."""
    return max(1, bits(dtype) // 8)


def is_float(dtype: str) -> bool:
    """True for float16, bfloat16, float32 and float64."""
    return kind(dtype) == "float"


def is_int(dtype: str) -> bool:
    """True for signed and unsigned integers (not bool)."""
    return kind(dtype) in ("int", "uint")


def is_signed(dtype: str) -> bool:
    """True for signed integers and floats."""
    return kind(dtype) in ("int", "float")


def is_bool(dtype: str) -> bool:
    """True for bool."""
    return dtype == "bool"


def to_numpy(dtype: str) -> np.dtype[Any]:
    """The numpy dtype for `dtype`; bfloat16 uses ml_dtypes when it is installed."""
    check_dtype(dtype)
    return numpy_bfloat16() if dtype == "bfloat16" else np.dtype(dtype)


# numpy dtype -> kiln name: numpy computes `dtype.name` in Python on every access, and
# the ONNX import asks it of every constant and value it types.
_FROM_NUMPY: dict[np.dtype[Any], str] = {}


def from_numpy(dt: Any) -> str:
    """The kiln dtype name of a numpy dtype (or anything np.dtype accepts)."""
    npdt = np.dtype(dt)
    name = _FROM_NUMPY.get(npdt)
    if name is not None:
        return name
    name = npdt.name
    if name not in DTYPES:
        raise IRError(f"numpy dtype {name!r} has no kiln equivalent; known: {', '.join(DTYPES)}")
    _FROM_NUMPY[npdt] = name
    return name
