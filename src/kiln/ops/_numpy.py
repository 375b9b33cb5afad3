"""Small numpy helpers for the operators' reference implementations."""

from __future__ import annotations

import numpy as np


def is_float(a: np.ndarray) -> bool:
    """True for float16/32/64 and bfloat16 (whose numpy kind is 'V')."""
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def widen(a: np.ndarray) -> np.ndarray:
    """16-bit floats as float32 (the IR computes them in float32 too); others unchanged."""
    if is_float(a) and a.dtype.itemsize < 4:
        return a.astype(np.float32)
    return a


def work(a: np.ndarray) -> np.ndarray:
    """A float64 copy of float data, for references that must be more exact than
    the kernels they check; integers and bools unchanged."""
    return a.astype(np.float64) if is_float(a) else a
