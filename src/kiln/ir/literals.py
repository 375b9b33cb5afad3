"""Python literal text for attribute values, array data and float scalars.

Everything printed here parses back (with `ast`) to an equal value: floats
print as `repr` (shortest round-tripping form) and non-finite floats as
`float("inf")` / `float("nan")`, which the parser's literal evaluator accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt


def quote(s: str) -> str:
    """A double-quoted Python string literal for `s`."""
    return json.dumps(s)


def float_text(x: float) -> str:
    """`repr` of a finite float; `float("inf")`-style text otherwise."""
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(float(x))


def special_float_name(x: float) -> str | None:
    """'inf', '-inf' or 'nan' for a non-finite float, else None."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return None


def literal(value: Any) -> str:
    """Python source for an attribute value (scalars, str, tuple, list, dict)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, np.generic):
        return literal(value.item())
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_text(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, tuple):
        items = [literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(literal(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise IRError(
        f"cannot print attribute value {value!r} of type {type(value).__name__}: "
        "attributes must be None, bool, int, float, str, tuple, list or dict"
    )


def array_literal(arr: np.ndarray) -> str:
    """Nested-list text of `arr`'s values (a bare scalar for a 0-d array).

    Narrow floats print as the shortest text that reads back (through float64,
    as the parser reads it) to the same value: `0.1`, not `0.10000000149011612`.
    """
    name = dt.from_numpy(arr.dtype)
    if name in ("float16", "float32"):
        return _nested(_shortest(arr))
    if name == "bfloat16":
        return _nested(arr.astype(np.float32).tolist())  # exact: bfloat16 is within float32
    return _nested(arr.tolist())


class _Text(str):
    """An already formatted element."""


def _shortest(arr: np.ndarray) -> Any:
    if arr.ndim > 0:
        return [_shortest(x) for x in arr]
    x = arr[()]
    exact = float(x)
    if not math.isfinite(exact):
        return exact
    short = str(x)  # numpy's shortest repr that identifies x among values of its dtype
    if len(repr(exact)) <= len(short):  # e.g. 65504.0 reads better than 6.55e+04
        return exact
    try:
        same = np.array(float(short)).astype(arr.dtype).tobytes() == arr.tobytes()
    except ValueError:
        same = False
    return _Text(short) if same else exact


def literal_is_exact(arr: np.ndarray) -> bool:
    """True if `array_literal(arr)` parses back to the same bytes.

    Only float data can fail: a NaN with a payload or sign prints as the one
    `float("nan")`. (The parser goes through float64, as this check does.)
    """
    name = dt.from_numpy(arr.dtype)
    if not dt.is_float(name):
        return True
    wide = arr.astype(np.float64)
    if not np.isnan(wide).any():
        return True
    canonical = np.where(np.isnan(wide), np.float64("nan"), wide)
    back = canonical.astype(arr.dtype)
    return bool(np.ascontiguousarray(back).tobytes() == np.ascontiguousarray(arr).tobytes())


def _nested(v: Any) -> str:
    if isinstance(v, _Text):
        return str(v)
    if isinstance(v, list):
        return f"[{', '.join(_nested(x) for x in v)}]"
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return float_text(v)
    raise IRError(f"cannot print array element {v!r} of type {type(v).__name__}")
