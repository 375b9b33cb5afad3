"""How kiln dtypes look in LLVM: in memory, in registers, and at the C ABI.

Three views of one dtype:

- *storage* type: the element type of a buffer in memory (`bool` is `i8`,
  `float16`/`bfloat16` are `i16` bit patterns, as docs/abi.md says);
- *compute* type: what an expression of that dtype is in registers (`bool` is
  `i1`; the 16-bit floats are computed in `float`, rounded on store and cast);
- *C* type: how a scalar crosses a call (`bool` is `i8` = `uint8_t`, 16-bit
  floats are `i16` = `uint16_t`), equal to the storage type.
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np
from llvmlite import ir

from kiln.ir import dtype as dt

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()

# The 16-bit float dtypes: stored as bit patterns, computed in float32.
HALF_DTYPES = ("float16", "bfloat16")


def is_half(dtype: str) -> bool:
    """True for float16 and bfloat16, which compute in float32."""
    return dtype in HALF_DTYPES


@functools.cache  # a lowering asks once per access; the answer is a fixed llvmlite type
def storage_type(dtype: str) -> ir.Type:
    """The element type of a buffer of `dtype` (also its C scalar type)."""
    if dt.is_bool(dtype):
        return I8
    if dt.is_float(dtype):
        if is_half(dtype):
            return I16
        return F32 if dt.bits(dtype) == 32 else F64
    return ir.IntType(dt.bits(dtype))


# A scalar crosses a C call exactly as it is stored.
c_type = storage_type


@functools.cache
def compute_type(dtype: str) -> ir.Type:
    """The register type of an expression of `dtype`."""
    if dt.is_bool(dtype):
        return I1
    if is_half(dtype):
        return F32
    return storage_type(dtype)


def float_suffix(ty: ir.Type) -> str:
    """LLVM's overload suffix of a float type or vector of floats ("f32", "v8f32")."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{float_suffix(ty.element)}"
    return "f32" if ty == F32 else "f64"


def libm_name(base: str, ty: ir.Type) -> str:
    """The C math library name for `base` at float type `ty` (`expf` vs `exp`)."""
    return base + "f" if ty == F32 else base


# ----------------------------------------------------------------- constants


def round_to_bfloat16(value: float) -> float:
    """`value` rounded to the nearest bfloat16 (ties to even), as a Python float."""
    if math.isnan(value):
        return value
    f32 = _round_to_odd_float32(value)
    bits = struct.unpack("<I", struct.pack("<f", f32))[0]
    if math.isinf(f32):
        return f32
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _round_to_odd_float32(value: float) -> float:
    """`value` as float32 rounded to odd, so a later rounding to 16 bits is exact."""
    with np.errstate(over="ignore"):
        f = np.float32(value)
    if float(f) == value or math.isinf(value):
        return float(f)
    bits = int(f.view(np.uint32))
    if abs(float(f)) > abs(value):
        bits -= 1  # sign-magnitude: one step toward zero
    bits |= 1
    return float(np.uint32(bits).view(np.float32))


def const_value(value: float | int | bool, dtype: str) -> ir.Constant:
    """An LLVM constant of `dtype`'s compute type holding `value`.

    Integer values are answered from a cache: llvmlite keeps a constant's printed text
    on the object, so a kernel's many equal index constants are built and printed once
    (floats are not cached: -0.0 equals 0.0 as a key, and NaN never matches)."""
    if type(value) is int or type(value) is bool:
        return _int_const(value, dtype)
    return _const_value(value, dtype)


@functools.lru_cache(maxsize=4096)
def _int_const(value: int | bool, dtype: str) -> ir.Constant:
    return _const_value(value, dtype)


def _const_value(value: float | int | bool, dtype: str) -> ir.Constant:
    ty = compute_type(dtype)
    if dt.is_bool(dtype):
        return ir.Constant(I1, int(bool(value)))
    if dt.is_float(dtype):
        v = float(value)
        if dtype == "float16":
            with np.errstate(over="ignore"):
                v = float(np.float16(v))
        elif dtype == "bfloat16":
            v = round_to_bfloat16(v)
        return ir.Constant(ty, v)
    bits = dt.bits(dtype)
    # LLVM prints integer constants signed: wrap into [-2**(bits-1), 2**(bits-1)).
    v = int(value) & ((1 << bits) - 1)
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return ir.Constant(ty, v)
