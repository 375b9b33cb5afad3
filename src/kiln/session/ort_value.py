"""`OrtValue`: onnxruntime's tensor handle, over a numpy array on the CPU.

kiln's sessions take and return numpy arrays; an OrtValue is the same array behind
onnxruntime's methods, so `OrtValue.ortvalue_from_numpy(x)`, `run_with_ort_values`,
`bind_ortvalue_input/output` and `io_binding.get_outputs()` run as written for
onnxruntime. No data is copied: `numpy()` shares the value's memory, as there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import ArgumentTypeError, UsageError, shown
from kiln.session import ort_names
from kiln.session.node_arg import ort_type

# numpy dtype name -> ONNX TensorProto's element type, what `element_type()` returns.
_ONNX_ELEMENT = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16,
}


def _cpu(device_type: Any, device_id: Any) -> None:
    if not isinstance(device_type, str) or device_type.lower() != "cpu":
        raise UsageError(f"OrtValue: kiln keeps values in CPU memory only, got device_type "
                         f"{shown(device_type, 40)} (use 'cpu')")
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id != 0:
        raise UsageError(f"OrtValue: the CPU is device 0, got device_id {shown(device_id, 40)}")


class OrtValue:
    """A tensor as onnxruntime's OrtValue, holding a numpy array (`numpy()` is it).

    Made by the static constructors (`ortvalue_from_numpy`, `ortvalue_from_shape_and_type`,
    `from_dlpack`), returned by `run_with_ort_values` and `IOBinding.get_outputs()`.
    """

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(f"OrtValue holds a numpy array, got {type(array).__name__}"
                                    "; make one with OrtValue.ortvalue_from_numpy(array)")
        if array.dtype.kind in "OUSVc":  # text, objects, records, complex: no tensor type
            raise ArgumentTypeError(f"OrtValue: kiln has no tensor type for numpy dtype "
                                    f"{array.dtype}; its types: {', '.join(_ONNX_ELEMENT)}")
        self._array = array

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: Any, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        """The value of a numpy array (shared, not copied, when it is C-contiguous)."""
        _cpu(device_type, device_id)
        if not isinstance(numpy_obj, np.ndarray):
            raise ArgumentTypeError("OrtValue.ortvalue_from_numpy takes a numpy array, got "
                                    f"{type(numpy_obj).__name__} (np.asarray(value, dtype) "
                                    "first)")
        return OrtValue(np.ascontiguousarray(numpy_obj))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any,
                                     device_type: str = "cpu", device_id: int = 0,
                                     vendor_id: int = -1) -> OrtValue:
        """A new value of `shape` and numpy `element_type` (zeros in kiln)."""
        _cpu(device_type, device_id)
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)) \
                or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                           and d >= 0 for d in shape):
            raise ArgumentTypeError(f"OrtValue.ortvalue_from_shape_and_type: shape must be a "
                                    f"list of ints >= 0, got {shown(shape, 60)}")
        try:
            dtype = np.dtype(element_type)
        except TypeError:
            raise ArgumentTypeError(f"OrtValue.ortvalue_from_shape_and_type: element_type "
                                    f"must be a numpy dtype (np.float32), got "
                                    f"{shown(element_type, 60)}") from None
        return OrtValue(np.zeros([int(d) for d in shape], dtype))

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> OrtValue:
        """The value of a DLPack tensor (an object with `__dlpack__`), through
        numpy.from_dlpack: no copy."""
        if not hasattr(data, "__dlpack__"):
            raise ArgumentTypeError(f"OrtValue.from_dlpack takes an object with __dlpack__ "
                                    f"(a numpy, torch or jax tensor), got {type(data).__name__}")
        array = np.from_dlpack(data)
        return OrtValue(array.astype(bool, copy=False) if is_bool_tensor else array)

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the value's memory (numpy's `__dlpack__`)."""
        return self._array.__dlpack__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def numpy(self) -> np.ndarray:
        """The value's numpy array (its memory, not a copy)."""
        return self._array

    def shape(self) -> list[int]:
        """The dimensions, as a list."""
        return list(self._array.shape)

    def data_type(self) -> str:
        """onnxruntime's type string: "tensor(float)"."""
        return ort_type(self._array.dtype.name)

    def element_type(self) -> int:
        """The ONNX TensorProto element type (1 float, 7 int64, ...)."""
        if self._array.dtype.name not in _ONNX_ELEMENT:
            raise UsageError(f"OrtValue.element_type: no ONNX element type number for "
                             f"{self._array.dtype}; data_type() names it")
        return _ONNX_ELEMENT[self._array.dtype.name]

    def device_name(self) -> str:
        """Where the value lives: "cpu"."""
        return "cpu"

    def is_tensor(self) -> bool:
        """True: kiln's values are tensors."""
        return True

    def has_value(self) -> bool:
        """True: a kiln OrtValue always holds an array."""
        return True

    def tensor_size_in_bytes(self) -> int:
        """The bytes of the tensor's data."""
        return int(self._array.nbytes)

    def data_ptr(self) -> int:
        """The address of the first element."""
        return int(self._array.ctypes.data)

    def update_inplace(self, np_arr: Any) -> None:
        """Copy `np_arr` (same shape and dtype) into the value's memory."""
        if not isinstance(np_arr, np.ndarray) or np_arr.shape != self._array.shape \
                or np_arr.dtype != self._array.dtype:
            raise UsageError(f"OrtValue.update_inplace takes an array of shape "
                             f"{list(self._array.shape)} and dtype {self._array.dtype}, got "
                             f"{shown(np_arr, 60)}")
        np.copyto(self._array, np_arr)

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"

    def __getattr__(self, name: str) -> Any:
        raise ort_names.missing("OrtValue", name)


__all__ = ["OrtValue"]
