"""The tables of kiln's C ABI (docs/abi.md), defined once.

Every number and name that compiled code, the header `kiln/kiln.h`, the
generated host.c and the Python runtime must agree on lives here: DLPack codes,
packed-argument type codes, the status codes of an entry, and per kiln dtype its
DLPack `(code, bits, lanes)`, its C type, its `kiln.h` macro, its numpy dtype
and, for integer scalars, the value range an entry accepts. The code generators
and the exporters import these tables; none keeps a copy.
`tests/runtime/test_abi.py` checks them against `kiln.h` and `kiln_host.c`
(compiled), against numpy and against the IR's dtype table (which keeps only the
kinds and widths the IR's semantics need, since the IR may not import the runtime).

This module imports nothing but numpy and kiln's dependency-free helpers, so a
deploy host (kiln.runtime without the compiler) has it.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from kiln._bfloat16 import numpy_bfloat16
from kiln.errors import CallError
from kiln.escape import int64_literal

# ---------------------------------------------------------------- DLPack
# DLDeviceType of host memory, the only device kiln's CPU libraries accept, and of
# CUDA memory (kiln.runtime.cuda_loader's functions take it).
KDL_CPU = 1
KDL_CUDA = 2

# DLDataTypeCode values.
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_OPAQUE, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 3, 4, 5, 6

# The DLPack version whose structs kiln.h spells out (DLPACK_MAJOR_VERSION).
DLPACK_MAJOR_VERSION = 1

# ---------------------------------------------------------------- packed calls
# Version of the packed calling convention (KILN_ABI_VERSION): 2 (2026-11-27) adds the
# optional terminate flag after a graph function's arguments (docs/abi.md, "Stopping a
# call"); a call of version 1 is a call of version 2 without it.
ABI_VERSION = 2

# Type codes of packed arguments (KILN_ARG_*); ARG_HANDLE: the terminate flag, an
# `int32_t*` the caller may set from another thread.
ARG_INT = 0
ARG_FLOAT = 2
ARG_HANDLE = 3
ARG_DLTENSOR = 7

# Status codes of an entry: 0 success; ARGUMENT_ERROR an argument was rejected
# (KILN_HOST_ARGUMENT_ERROR of kiln_host.c); any other value is the kernel's own
# status (the IR's kernel error table, docs/abi.md).
SUCCESS = 0
ARGUMENT_ERROR = -1

# Bytes of an entry's thread-local error message buffer (KILN_HOST_ERROR_SIZE):
# longer messages are cut there.
ERROR_BUFFER_SIZE = 1024

# Most tensors `kiln_call_tensors` of kiln.h passes (KILN_MAX_TENSOR_ARGS).
MAX_TENSOR_ARGS = 64


# ---------------------------------------------------------------- dtypes
class DLType(NamedTuple):
    """DLPack's DLDataType: type code, bits per lane, lanes."""

    code: int
    bits: int
    lanes: int = 1


# kiln dtype -> DLPack type (lanes always 1: kiln tensors hold scalars).
DL_TYPES: dict[str, DLType] = {
    "bool": DLType(KDL_BOOL, 8),
    "int8": DLType(KDL_INT, 8), "int16": DLType(KDL_INT, 16),
    "int32": DLType(KDL_INT, 32), "int64": DLType(KDL_INT, 64),
    "uint8": DLType(KDL_UINT, 8), "uint16": DLType(KDL_UINT, 16),
    "uint32": DLType(KDL_UINT, 32), "uint64": DLType(KDL_UINT, 64),
    "float16": DLType(KDL_FLOAT, 16), "bfloat16": DLType(KDL_BFLOAT, 16),
    "float32": DLType(KDL_FLOAT, 32), "float64": DLType(KDL_FLOAT, 64),
}

# The C type of an element of each dtype, in raw kernels and buffers. 16-bit floats
# travel as their bit pattern (uint16_t): C has no portable half type.
C_TYPE_NAMES: dict[str, str] = {
    "bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float",
    "float64": "double",
}

# The kiln.h macro giving each dtype's DLDataType (`KILN_FLOAT32`), for generated C
# that includes kiln.h (the MLF interface).
C_DTYPE_MACROS: dict[str, str] = {name: f"KILN_{name.upper()}" for name in DL_TYPES}

# Inclusive range of the value an integer or bool scalar argument may carry (check
# 6 of docs/abi.md): C would otherwise wrap it silently.
SCALAR_RANGES: dict[str, tuple[int, int]] = {
    "bool": (0, 1),
    **{f"int{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)},
    **{f"uint{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64)},
}

INT64_MIN, INT64_MAX = SCALAR_RANGES["int64"]

_CODE_NAMES = {KDL_INT: "int", KDL_UINT: "uint", KDL_FLOAT: "float", KDL_OPAQUE: "handle",
               KDL_BFLOAT: "bfloat", KDL_COMPLEX: "complex", KDL_BOOL: "bool"}


def dl_type(dtype: str) -> DLType:
    """The DLPack type of kiln dtype `dtype` (CallError naming it if unknown)."""
    try:
        return DL_TYPES[dtype]
    except KeyError:
        raise CallError(f"unknown dtype {dtype!r}; known: {', '.join(DL_TYPES)}") from None


def dtype_name(code: int, bits: int, lanes: int = 1) -> str:
    """The name docs/abi.md gives a DLDataType in error messages ("float32", "int8x4")."""
    if code == KDL_BOOL and bits == 8:
        name = "bool"
    elif code in _CODE_NAMES:
        name = f"{_CODE_NAMES[code]}{bits}"
    else:
        name = f"dtype(code={code}, bits={bits})"
    return name if lanes == 1 else f"{name}x{lanes}"


def is_float_dtype(dtype: str) -> bool:
    """True for the dtypes whose scalars travel as `v_float64` (ARG_FLOAT)."""
    return dl_type(dtype).code in (KDL_FLOAT, KDL_BFLOAT)


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of a kiln dtype; bfloat16 needs the ml_dtypes package."""
    dl_type(dtype)  # an unknown name is a CallError, not numpy's TypeError
    return numpy_bfloat16() if dtype == "bfloat16" else np.dtype(dtype)


@functools.lru_cache(maxsize=64)
def dl_type_of(dtype: np.dtype[Any]) -> DLType | None:
    """The DLPack type of a numpy dtype, or None when DLPack cannot express it.

    Cached: every tensor argument of every call asks, and `dtype.name` is slow.
    """
    if dtype.name == "bfloat16":
        return DL_TYPES["bfloat16"]
    bits = dtype.itemsize * 8
    code = {"b": KDL_BOOL, "i": KDL_INT, "u": KDL_UINT, "f": KDL_FLOAT,
            "c": KDL_COMPLEX}.get(dtype.kind)
    return None if code is None else DLType(code, bits)


__all__ = [
    "ABI_VERSION", "ARGUMENT_ERROR", "ARG_DLTENSOR", "ARG_FLOAT", "ARG_HANDLE", "ARG_INT",
    "C_DTYPE_MACROS",
    "C_TYPE_NAMES", "DLPACK_MAJOR_VERSION", "DL_TYPES", "ERROR_BUFFER_SIZE", "INT64_MAX",
    "INT64_MIN", "KDL_BFLOAT", "KDL_BOOL", "KDL_COMPLEX", "KDL_CPU", "KDL_CUDA", "KDL_FLOAT",
    "KDL_INT", "KDL_OPAQUE", "KDL_UINT", "MAX_TENSOR_ARGS", "SCALAR_RANGES", "SUCCESS", "DLType",
    "dl_type", "dl_type_of", "dtype_name", "int64_literal", "is_float_dtype", "numpy_dtype",
]
