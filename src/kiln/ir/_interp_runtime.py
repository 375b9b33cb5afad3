"""Run-time helpers of the reference interpreter: what compiled PrimFuncs call.

`kiln.ir.evaluate` compiles each PrimFunc into Python source
(`kiln.ir._interp_compiler`); that code runs in the namespace `BASE_NS`
built here: integer division and shifts with C semantics, float16/bfloat16
rounding, poisoned allocations, byte views, and the float intrinsics.

The public names are what the compiler and `kiln.ir.evaluate` use; the private
ones are used only here, or through `BASE_NS` by the generated code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.ir import dtype as dt
from kiln.ir.kernel_errors import error_message


class Fault(Exception):
    """A run-time fault inside interpreted code (reported as CallError)."""


def float_carrier(dtype: str) -> type:
    """The numpy scalar type arithmetic of `dtype` uses (floats only)."""
    return np.float64 if dtype == "float64" else np.float32


def np_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype buffers of `dtype` are stored in."""
    return dt.to_numpy(dtype)


def int_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of the integer (or bool) `dtype`."""
    n = dt.bits(dtype)
    if dtype == "bool":
        return 0, 1
    if dt.kind(dtype) == "uint":
        return 0, (1 << n) - 1
    return -(1 << (n - 1)), (1 << (n - 1)) - 1


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _tmod(a: int, b: int) -> int:
    return a - b * _tdiv(a, b)


def _ipow(a: int, b: int, bits: int) -> int:
    if b >= 0:
        return pow(a, b, 1 << bits)
    if a == 0:
        raise ZeroDivisionError
    if a == 1:
        return 1
    if a == -1:
        return 1 if b % 2 == 0 else -1
    return 0


def _shift_check(b: int, bits: int) -> None:
    if not 0 <= b < bits:
        raise Fault(f"shift amount {b} is outside [0, {bits})")


def _shl(a: int, b: int, bits: int) -> int:
    _shift_check(b, bits)
    return a << b


def _shr(a: int, b: int, bits: int) -> int:
    _shift_check(b, bits)
    return a >> b


def _sel(c: Any, x: Any, y: Any) -> Any:
    return x if c else y


def _f2i(x: Any) -> int:
    if not np.isfinite(x):
        raise Fault(f"cannot convert {x} to an integer (undefined in C)")
    return int(x)


def bit_view(src: str, dst: str) -> Callable[[Any], Any]:
    """Reads the bits of a `src` value as `dst` (equal widths): an int for integer
    dtypes, the float carrier for float ones."""
    src_np, dst_np = np_dtype(src), np_dtype(dst)
    if dt.is_int(dst):
        return lambda x: int(np.asarray(x, src_np).view(dst_np)[()])
    return lambda x: np.asarray(x, src_np).view(dst_np)[()]


def _fmin(a: Any, b: Any) -> Any:
    """min of two floats as the backends compute it: ties give the first, NaN wins."""
    return a if (a <= b or a != a) else b


def _fmax(a: Any, b: Any) -> Any:
    """max of two floats as the backends compute it: ties give the first, NaN wins."""
    return a if (a >= b or a != a) else b


def _ffloordiv(a: Any, b: Any) -> Any:
    return np.floor(a / b)


def _ffloormod(a: Any, b: Any) -> Any:
    return a - np.floor(a / b) * b


def converter(dtype: str) -> Callable[[Any], Any]:
    """Converts an extern's result to the carrier of `dtype` (ints wrap)."""
    if dtype == "bool":
        return bool
    if dt.is_int(dtype):
        lo, hi = int_range(dtype)
        span = hi - lo + 1
        return lambda x: (int(x) - lo) % span + lo
    if dtype == "float16":
        return round16
    if dtype == "bfloat16":
        return round_bf16
    return float_carrier(dtype)


def round16(x: Any) -> np.float32:
    """`x` rounded to float16, carried as float32."""
    return np.float32(np.float16(x))


def round_bf16(x: Any) -> np.float32:
    """`x` rounded to bfloat16, carried as float32."""
    return np.float32(dt.to_numpy("bfloat16").type(np.float32(x)))


def alloc(count: int, dtype: np.dtype[Any]) -> np.ndarray:
    """A flat array of `count` elements, poisoned (floats NaN, bool True, other bytes
    0xA5) so that reading it before writing shows up."""
    if count < 0:
        raise Fault(f"cannot allocate {count} elements")
    arr = np.empty(count, dtype=dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        arr[:] = np.nan
    elif dtype.kind == "b":
        arr[:] = True
    else:
        arr.view(np.uint8)[:] = 0xA5
    return arr


def _view(src: np.ndarray, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
    raw = src.view(np.uint8)
    size = count * dtype.itemsize
    if offset < 0 or offset + size > raw.size:
        raise Fault(f"DeclBuffer view [{offset}, {offset + size}) is outside its source "
                     f"of {raw.size} bytes")
    return raw[offset:offset + size].view(dtype)


def _float_intrinsic(fn: Callable[..., Any], carrier: type) -> Callable[..., Any]:
    if carrier is np.float64:
        return fn

    def run(*args: Any) -> Any:
        return np.float32(fn(*args, dtype=np.float64))
    return run


# Float intrinsics a float32 value computes in float64 and rounds (`_<name>32` and
# `_<name>64` in BASE_NS).
FLOAT_UFUNCS: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "pow": np.power, "atan2": np.arctan2,
}
# Float intrinsics correctly rounded in any precision: applied to the carrier
# directly (`_<name>` in BASE_NS).
EXACT_UFUNCS: dict[str, Callable[..., Any]] = {
    "sqrt": np.sqrt, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    "round": np.rint, "fmod": np.fmod, "isnan": np.isnan, "isinf": np.isinf,
}


def _check(ok: Any, code: int) -> None:
    """The `check` intrinsic: fail the kernel with error `code` unless `ok`."""
    if not ok:
        raise Fault(error_message(code))


def _dot4_u8s8(acc: Any, a: Any, b: Any) -> int:
    """The `dot4_u8s8` intrinsic before int32 wraparound: `acc` plus the products of
    `a`'s bytes (unsigned) and `b`'s (signed)."""
    a, b = int(a), int(b)
    total = int(acc)
    for shift in (0, 8, 16, 24):
        sb = (b >> shift) & 0xFF
        total += ((a >> shift) & 0xFF) * (sb - 256 if sb > 127 else sb)
    return total


def _dot4_u8s8_sat16(acc: Any, a: Any, b: Any) -> int:
    """The `dot4_u8s8_sat16` intrinsic before int32 wraparound: `acc` plus the two pair
    sums of `a`'s bytes (unsigned) times `b`'s (signed), each clamped to int16."""
    a, b = int(a), int(b)
    total = int(acc)
    for pair in (0, 16):
        s = 0
        for shift in (pair, pair + 8):
            sb = (b >> shift) & 0xFF
            s += ((a >> shift) & 0xFF) * (sb - 256 if sb > 127 else sb)
        total += min(max(s, -32768), 32767)
    return total


def _dot2_i16(acc: Any, a: Any, b: Any) -> int:
    """The `dot2_i16` intrinsic before int32 wraparound: `acc` plus the products of
    `a`'s and `b`'s 16-bit halves, both signed."""
    a, b = int(a), int(b)
    total = int(acc)
    for shift in (0, 16):
        x, w = (a >> shift) & 0xFFFF, (b >> shift) & 0xFFFF
        total += (x - 0x10000 if x > 0x7FFF else x) * (w - 0x10000 if w > 0x7FFF else w)
    return total


def _bf16_half(word: int, shift: int) -> np.float32:
    """The bfloat16 in bits `shift .. shift + 16` of `word`, widened to float32."""
    bits = ((int(word) >> shift) & 0xFFFF) << 16
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def _dot2_bf16(acc: Any, a: Any, b: Any) -> np.float32:
    """The `dot2_bf16` intrinsic: `(acc + hi(a) * hi(b)) + lo(a) * lo(b)` in float32
    (the products of two bfloat16 values are exact in float32)."""
    with np.errstate(all="ignore"):
        hi = _bf16_half(a, 16) * _bf16_half(b, 16)
        lo = _bf16_half(a, 0) * _bf16_half(b, 0)
        return np.float32(np.float32(np.float32(acc) + hi) + lo)


def _bf16_bits(x: Any) -> int:
    """The 16 bits of float32 `x` rounded to bfloat16 (nearest, ties to even; NaN 0x7FC0)."""
    value = np.float32(x)
    if np.isnan(value):
        return 0x7FC0
    bits = int(np.array([value], dtype=np.float32).view(np.uint32)[0])
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _bf16_pair(lo: Any, hi: Any) -> int:
    """The `bf16_pair` intrinsic: the int32 word of `lo` (half 0) and `hi` as bfloat16."""
    word = _bf16_bits(lo) | (_bf16_bits(hi) << 16)
    return word - (1 << 32) if word >= 1 << 31 else word


def _base_namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {
        "_check": _check, "_dot4_u8s8": _dot4_u8s8, "_dot4_u8s8_sat16": _dot4_u8s8_sat16,
        "_dot2_i16": _dot2_i16, "_dot2_bf16": _dot2_bf16, "_bf16_pair": _bf16_pair,
        "_Fault": Fault, "_tdiv": _tdiv, "_tmod": _tmod, "_ipow": _ipow, "_shl": _shl,
        "_shr": _shr, "_sel": _sel, "_f2i": _f2i, "_fmin": _fmin, "_fmax": _fmax,
        "_ffloordiv": _ffloordiv, "_ffloormod": _ffloormod, "_round16": round16,
        "_round_bf16": round_bf16,
        "_alloc": alloc, "_view": _view, "_F32": np.float32, "_F64": np.float64,
        "_erf32": lambda x: np.float32(math.erf(x)), "_erf64": lambda x: np.float64(
            math.erf(x)),
    }
    for name, fn in FLOAT_UFUNCS.items():
        ns[f"_{name}32"] = _float_intrinsic(fn, np.float32)
        ns[f"_{name}64"] = fn
    for name, fn in EXACT_UFUNCS.items():
        ns[f"_{name}"] = fn
    return ns


# The globals compiled PrimFuncs run in (each compiled function gets a copy): the
# helpers above under the names the generated code calls.
BASE_NS = _base_namespace()


def ir_text(node: object) -> str:
    """One line of IR for a message."""
    from kiln.ir.printer import NodeText  # cycle: kiln.ir.evaluate imports this module

    return NodeText().node(node)
