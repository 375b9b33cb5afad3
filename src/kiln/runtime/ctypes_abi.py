"""The C ABI (docs/abi.md) seen from Python: ctypes mirrors and one signature table.

Everything kiln calls through ctypes is declared here, in `SIGNATURES`; nothing
else in kiln spells a C signature. This module also turns Python values into
packed arguments: numpy arrays and DLPack tensors become `DLTensor`s that point
at the caller's memory (no copy), scalars become `KilnValue`s. The numbers and
names of the ABI (type codes, dtypes) are kiln.runtime.abi's tables.
"""

from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import CallError
from kiln.runtime.abi import (
    ARG_DLTENSOR,
    ARG_FLOAT,
    ARG_INT,
    C_TYPE_NAMES,
    INT64_MAX,
    INT64_MIN,
    KDL_CPU,
    DLType,
    dl_type_of,
    dtype_name,
)


# ---------------------------------------------------------------- DLPack mirrors
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class KilnValue(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double),
                ("v_handle", ctypes.c_void_p)]


# KilnTokenFunc (kiln.h): a generation's per-step callback (tokens, batch, step, user).
TOKEN_FUNC = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64,
                              ctypes.c_int64, ctypes.c_void_p)


# ---------------------------------------------------------------- the signature table
# name -> (restype, argtypes). `packed` is every public entry `{prefix}name`.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "packed": (ctypes.c_int32,
               [ctypes.POINTER(KilnValue), ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]),
    "last_error": (ctypes.c_char_p, []),
    "metadata": (ctypes.c_char_p, []),
    # {prefix}_cpu_missing(out, size): the CPU features this machine lacks (docs/abi.md).
    "cpu_missing": (ctypes.c_int32, [ctypes.c_char_p, ctypes.c_int32]),
    # {prefix}_profile_read(site, &function, &kernel, &calls, &total_ns) and _reset().
    "profile_read": (ctypes.c_int32,
                     [ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p),
                      ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_uint64),
                      ctypes.POINTER(ctypes.c_uint64)]),
    "profile_reset": (None, []),
    # {prefix}_map_weights_fd(fd): map an external weights file (kiln_weights.c).
    "map_weights_fd": (ctypes.c_int32, [ctypes.c_int32]),
    # {prefix}_map_weights_range(fd, tensor, start, length, offset): part of a region
    # from another weights file of equal bytes there (kiln_weights.c).
    "map_weights_range": (ctypes.c_int32, [ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64,
                                           ctypes.c_uint64, ctypes.c_uint64]),
    # kiln_hash64.c, kiln_check.c (kiln.runtime.weights_check): {prefix}_hash64(data, n),
    # {prefix}_check_weights(first, count), {prefix}_weights_chunks(),
    # {prefix}_rehash_weights(data, size, phase).
    "hash64": (ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_uint64]),
    "check_weights": (ctypes.c_int64, [ctypes.c_int64, ctypes.c_int64]),
    "weights_chunks": (ctypes.c_int64, []),
    "rehash_weights": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32]),
    # {prefix}_const_slots(&count): the table of constant addresses (const_table.c).
    "const_slots": (ctypes.c_void_p, [ctypes.POINTER(ctypes.c_uint32)]),
    # {prefix}_generate_{fn}(prompt, batch, prompt_len, max_new, stops, n_stop, pad, out,
    # &steps, on_token, user): the greedy loop in C (kiln_generate.c, KilnGenerateFunc).
    "generate": (ctypes.c_int32,
                 [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_int64), TOKEN_FUNC, ctypes.c_void_p]),
}


def bind(lib: ctypes.CDLL, symbol: str, kind: str) -> Any:
    """The function `symbol` of `lib`, typed by `SIGNATURES[kind]` (AttributeError if absent)."""
    restype, argtypes = SIGNATURES[kind]
    fn = lib[symbol]  # a fresh function object (getattr would cache and share it)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def read_string(fn: Any) -> str:
    """Call a `const char* (void)` function and decode its UTF-8 result ('' for NULL)."""
    raw = fn()
    return raw.decode("utf-8", errors="replace") if raw else ""


# ---------------------------------------------------------------- dtypes
# The ctypes type of each C element type of abi.C_TYPE_NAMES.
_CTYPES_BY_C_NAME: dict[str, Any] = {
    "float": ctypes.c_float, "double": ctypes.c_double,
    **{f"{s}int{b}_t": getattr(ctypes, f"c_{s}int{b}") for s in ("", "u") for b in (8, 16, 32, 64)},
}

# kiln dtype -> the ctypes type of a raw-kernel scalar argument of that dtype.
CTYPES_BY_DTYPE: dict[str, Any] = {dtype: _CTYPES_BY_C_NAME[c_name]
                                   for dtype, c_name in C_TYPE_NAMES.items()}


def array_dtype_name(arr: np.ndarray) -> str:
    """`dtype_name` of a numpy array's dtype (numpy's own name if DLPack has none)."""
    dl = dl_type_of(arr.dtype)
    return dtype_name(*dl) if dl is not None else arr.dtype.name


def format_shape(shape: Any) -> str:
    """`[2, 5]`; a symbolic dimension prints as its text: `[batch, seq*2]`."""
    return "[" + ", ".join(d if isinstance(d, str) else str(int(d)) for d in shape) + "]"


# ---------------------------------------------------------------- Python values -> arguments
@dataclass(frozen=True)
class Where:
    """Which argument is being converted, for error messages: `f: argument 1 'Y': ...`."""

    function: str
    index: int
    name: str

    def error(self, message: str) -> CallError:
        return CallError(f"{self.function}: argument {self.index} '{self.name}': {message}")


def is_tensor(value: object) -> bool:
    """True for a numpy array or anything exposing `__dlpack__`."""
    return isinstance(value, np.ndarray) or hasattr(value, "__dlpack__")


def is_scalar(value: object) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


def scalar_int(value: Any) -> int:
    """The integer value of an int-coded scalar (Python/numpy int or bool)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    return operator.index(value)


def type_code_of(value: object) -> int | None:
    """The packed type code a Python value travels with (None if it cannot travel).

    `None` travels as a NULL tensor.
    """
    if value is None or is_tensor(value):
        return ARG_DLTENSOR
    if isinstance(value, (float, np.floating)):
        return ARG_FLOAT
    if is_scalar(value):
        return ARG_INT
    return None


def to_numpy(value: object, where: Where) -> np.ndarray:
    """A numpy view of a CPU tensor (numpy array or DLPack tensor), never a copy.

    A tensor on another device is rejected with the same text the C entries use.
    """
    if isinstance(value, np.ndarray):
        return value
    device = getattr(value, "__dlpack_device__", None)
    if device is not None:
        try:
            dev_type = int(device()[0])
        except Exception as exc:
            raise where.error(f"__dlpack_device__() failed: {exc}") from exc
        if dev_type != KDL_CPU:
            raise where.error(
                f"expected a CPU tensor (device_type {KDL_CPU}), got device_type {dev_type}")
    try:
        return np.from_dlpack(value)  # type: ignore[arg-type]
    except Exception as exc:
        raise where.error(f"cannot read {type(value).__name__} through DLPack: {exc}") from exc


def require_dl_type(array: np.ndarray, where: Where) -> DLType:
    """DLPack type of the array's dtype; CallError if DLPack has none (e.g. object).

    A non-native byte order (`dtype('>f4')` here) is refused: compiled code reads
    memory in this machine's order, and DLPack has no way to say otherwise.
    """
    dtype = array.dtype
    if not dtype.isnative:
        raise where.error(
            f"numpy dtype {dtype.str!r} has non-native byte order; convert it first with "
            f"array.astype(array.dtype.newbyteorder('='))")
    dl = dl_type_of(dtype)
    if dl is None:
        raise where.error(f"numpy dtype {dtype.name} has no DLPack equivalent")
    return dl


_char_from_buffer = ctypes.c_char.from_buffer


def data_address(array: np.ndarray) -> int:
    """The address of a numpy array's first element.

    Through the buffer protocol when the array is writable and contiguous (a
    fraction of the cost of building `__array_interface__`), else through that.
    """
    try:
        return ctypes.addressof(_char_from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # read-only, strided or empty
        return int(array.__array_interface__["data"][0])


class TensorArg:
    """A DLTensor over a numpy array's memory; keeps the array (the owner) alive."""

    __slots__ = ("array", "shape", "strides", "tensor")

    def __init__(self, array: np.ndarray, where: Where) -> None:
        dl = require_dl_type(array, where)
        ndim = array.ndim
        self.array = array
        self.shape = (ctypes.c_int64 * ndim)(*array.shape)
        self.strides: Any = None
        if not array.flags.c_contiguous:
            itemsize = array.dtype.itemsize
            if any(s % itemsize for s in array.strides):
                raise where.error("expected a contiguous tensor")
            self.strides = (ctypes.c_int64 * ndim)(*(s // itemsize for s in array.strides))
        t = DLTensor()
        t.data = data_address(array)
        t.device.device_type = KDL_CPU
        t.device.device_id = 0
        t.ndim = ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = dl
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0
        self.tensor = t


def tensor_shape(handle: int) -> tuple[int, ...]:
    """The shape a DLTensor at `handle` holds now (a data-dependent result's entry wrote
    its actual extents into it, docs/abi.md)."""
    tensor = DLTensor.from_address(handle)
    return tuple(int(tensor.shape[d]) for d in range(tensor.ndim))


def pack_arguments(values: list[object], wheres: list[Where], spare: int = 0
                   ) -> tuple[Any, Any, list[Any]]:
    """(KilnValue array, type-code array, keep-alive list) for a packed call, with
    `spare` more slots after the values (for the terminate flag).

    Each value travels with the type code of its Python type; the C entry then
    checks it against the parameter (docs/abi.md).
    """
    n = len(values)
    args = (KilnValue * (n + spare))()
    codes = (ctypes.c_int32 * (n + spare))()
    keep: list[Any] = []
    for i, (value, where) in enumerate(zip(values, wheres)):
        code = type_code_of(value)
        if code is None:
            raise where.error(
                f"cannot pass {type(value).__name__}; expected a numpy array, a DLPack tensor "
                "or a number")
        if value is None:
            args[i].v_handle = None
        elif code == ARG_DLTENSOR:
            targ = TensorArg(to_numpy(value, where), where)
            keep.append(targ)
            args[i].v_handle = ctypes.addressof(targ.tensor)
        elif code == ARG_FLOAT:
            args[i].v_float64 = float(value)  # type: ignore[arg-type]
        else:
            ivalue = scalar_int(value)
            if not INT64_MIN <= ivalue <= INT64_MAX:
                raise where.error(f"value {ivalue} does not fit in int64")
            args[i].v_int64 = ivalue
        codes[i] = code
    return args, codes, keep
