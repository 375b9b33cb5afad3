"""C spellings of IR literals (strings: kiln.escape).

Float literals are exact: the value is first rounded to its dtype (as the IR
interpreter does), then printed with the shortest decimal that reads back to the
same value (`0.1f`), or as a hex float for subnormals; inf and NaN use the
<math.h> macros.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.errors import CompileError
from kiln.ir import dtype as dt


def round_float(value: float, dtype: str) -> float:
    """`value` rounded to the nearest `dtype` value (ties to even), as a Python float."""
    with np.errstate(over="ignore"):
        if dtype == "float64":
            return float(value)
        if dtype == "float32":
            return float(np.float32(value))
        if dtype == "float16":
            return float(np.float16(value))
    if dtype == "bfloat16":
        return bfloat16_round(value)
    raise CompileError(f"round_float: {dtype} is not a float dtype")


def bfloat16_round(value: float) -> float:
    """`value` rounded to bfloat16 through float32 (ties to even), as the interpreter does."""
    with np.errstate(over="ignore"):
        f32 = np.array(value, np.float32)
    if np.isnan(f32) or np.isinf(f32):
        return float(f32)
    bits = int(f32.view(np.uint32))
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.array(bits & 0xFFFFFFFF, np.uint32).view(np.float32))


def float_literal(value: float, dtype: str) -> str:
    """A C literal of `value` for a float dtype; 16-bit floats compute as `float`."""
    value = round_float(value, dtype)
    double = dtype == "float64"
    if math.isnan(value):
        return "(double)NAN" if double else "NAN"
    if math.isinf(value):
        text = "HUGE_VAL" if double else "INFINITY"
        return "-" + text if value < 0 else text
    if double:
        text = repr(value)
        tiny = value != 0 and abs(value) < np.finfo(np.float64).tiny
    else:
        text = str(np.float32(value))
        tiny = value != 0 and abs(value) < np.finfo(np.float32).tiny
    if tiny or not any(c in text for c in ".e"):
        text = hex_float(value)
    return text if double else text + "f"


def hex_float(value: float) -> str:
    """C99 hex float, trailing zeros dropped: `0x1.8p+1`, `0x1p-149`."""
    mantissa, exponent = float.hex(value).split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}"


# (min, max) of every integer dtype.
INT_RANGES = {
    name: ((-(1 << (b - 1)), (1 << (b - 1)) - 1) if k == "int" else (0, (1 << b) - 1))
    for name, (k, b) in dt.DTYPES.items() if k in ("int", "uint")
}


def wrap_int(value: int, dtype: str) -> int:
    """`value` reduced modulo 2**bits into the range of `dtype` (bool: 0 or 1)."""
    if dtype == "bool":
        return 1 if value else 0
    lo, hi = INT_RANGES[dtype]
    span = hi - lo + 1
    return (value - lo) % span + lo


def int_literal(value: int, dtype: str) -> tuple[str, bool]:
    """(C text, typed) of an integer literal.

    `typed` is False when the text is a plain literal of C type `int`, which is
    narrower than a 64-bit or unsigned dtype (the expression printer then adds a
    cast where C would otherwise compute in `int`).
    """
    value = wrap_int(value, dtype)
    if dtype in ("int64", "uint64", "uint32") and not -(1 << 31) <= value < (1 << 31):
        if dtype == "int64":
            if value == -(1 << 63):
                return "INT64_MIN", True
            return f"INT64_C({value})", True
        return f"UINT{dt.bits(dtype)}_C({value})", True
    if dtype == "int32" and value == -(1 << 31):
        return "INT32_MIN", True
    return str(value), dtype in ("int32", "int16", "int8", "uint16", "uint8", "bool")
