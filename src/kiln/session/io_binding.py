"""`IOBinding`: inputs and preallocated outputs for `InferenceSession.run_with_iobinding`,
with onnxruntime's method names.

Every bind checks what it is given before it keeps it: the name against the model's
inputs or outputs, the element type and shape against the model's, and a raw
`buffer_ptr` for being an address of mapped memory large enough for the shape. That
the memory is the caller's and stays alive until the run stays the caller's promise,
as in onnxruntime.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import math
import mmap
import operator
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import ArgumentTypeError, CallError, UsageError, shown
from kiln.runtime.libc import libc_function
from kiln.session import ort_names
from kiln.session.node_arg import NodeArg, ort_type
from kiln.session.ort_value import OrtValue

if TYPE_CHECKING:
    from kiln.session.inference import InferenceSession

# One past the highest address a pointer of this process can hold.
_ADDRESS_LIMIT = 1 << (8 * ctypes.sizeof(ctypes.c_void_p))


class IOBinding:
    """Inputs and outputs bound by name; made by `InferenceSession.io_binding()`.

    An output bound to memory (`bind_output(..., buffer_ptr=...)`, or
    `bind_ortvalue_output` with an array) is written in place by `run_with_iobinding`;
    an output bound by name only is allocated by the run. A bad name, element type,
    shape or buffer raises a KilnError naming the input or output when it is bound.
    """

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, np.ndarray | None] = {}
        self.results: list[np.ndarray] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind input `name` to an array (numpy or DLPack), without copying; the run
        checks its dtype and shape, as `run` checks its feed."""
        self.inputs[self._arg(name, self._session.get_inputs(), "input").name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Any, buffer_ptr: int) -> None:
        """Bind input `name` to `shape` elements of `element_type` at `buffer_ptr`."""
        arg = self._arg(name, self._session.get_inputs(), "input")
        self.inputs[arg.name] = _wrap(arg, device_type, device_id, element_type, shape,
                                      buffer_ptr)

    def bind_ortvalue_input(self, name: str, ortvalue: Any) -> None:
        """Bind input `name` to a kiln.OrtValue (or an array, numpy or DLPack, as in
        `bind_cpu_input`)."""
        self.bind_cpu_input(name, _array_for_ortvalue(name, ortvalue, writable=False))

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Any = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind output `name`: to memory at `buffer_ptr` (written in place; needs
        `element_type` and `shape`), or, without a pointer, to an array the run allocates."""
        arg = self._arg(name, self._session.get_outputs(), "output")
        self.outputs[arg.name] = (None if buffer_ptr is None else
                                  _wrap(arg, device_type, device_id, element_type, shape,
                                        buffer_ptr))

    def bind_ortvalue_output(self, name: str, ortvalue: Any) -> None:
        """Bind output `name` to a kiln.OrtValue or a writable numpy array, written in
        place by the run."""
        arg = self._arg(name, self._session.get_outputs(), "output")
        self.outputs[arg.name] = _array_for_ortvalue(arg.name, ortvalue, writable=True)

    def get_outputs(self) -> list[OrtValue]:
        """The bound outputs after `run_with_iobinding`, in binding order, as OrtValues
        over the arrays the run wrote (not copies: `.numpy()` is the array)."""
        return [OrtValue(a) for a in self._results()]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the bound outputs after `run_with_iobinding`, in binding order."""
        return [result.copy() for result in self._results()]

    def _results(self) -> list[np.ndarray]:
        picks = [self._session.output_index(n) for n in self.outputs]
        return [self.results[i] for i in picks] if self.results else []

    def clear_binding_inputs(self) -> None:
        """Forget the bound inputs."""
        self.inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget the bound outputs."""
        self.outputs.clear()
        self.results = []

    def synchronize_inputs(self) -> None:
        """Nothing to do: kiln runs on the CPU, synchronously."""

    def synchronize_outputs(self) -> None:
        """Nothing to do: kiln runs on the CPU, synchronously."""

    def __getattr__(self, name: str) -> Any:
        raise ort_names.missing("IOBinding", name)

    @staticmethod
    def _arg(name: Any, args: list[NodeArg], kind: str) -> NodeArg:
        """The model's input or output `name` (a KilnError naming them all otherwise)."""
        if not isinstance(name, str):
            raise ArgumentTypeError(f"the name of an {kind} to bind must be a str, got "
                                    f"{type(name).__name__} {shown(name, 60)}")
        for arg in args:
            if arg.name == name:
                return arg
        raise CallError(f"'{name}' is not an {kind} of this model; its {kind}s: "
                        f"{', '.join(a.name for a in args) or '(none)'}")


def _array_for_ortvalue(name: str, value: Any, *, writable: bool) -> Any:
    """`value` when it is an array kiln can bind (a writable numpy array for an output),
    or a kiln.OrtValue's array."""
    if isinstance(value, OrtValue):
        value = value.numpy()
    elif type(value).__name__ == "OrtValue":
        raise ArgumentTypeError(f"'{name}': an onnxruntime OrtValue; bind a kiln.OrtValue "
                                "or a numpy array (the OrtValue's .numpy())")
    if writable:
        if not isinstance(value, np.ndarray) or not value.flags.writeable:
            raise ArgumentTypeError(f"'{name}': an output binds to a writable numpy array, got "
                                    f"{type(value).__name__}")
    elif not isinstance(value, np.ndarray) and not hasattr(value, "__dlpack__"):
        raise ArgumentTypeError(f"'{name}': an input binds to a numpy array or a DLPack "
                                f"tensor, got {type(value).__name__} (or to a kiln.OrtValue: "
                                "OrtValue.ortvalue_from_numpy(array))")
    return value


def _wrap(arg: NodeArg, device_type: Any, device_id: Any, element_type: Any, shape: Any,
          buffer_ptr: Any) -> np.ndarray:
    """A numpy view of caller-owned memory (the caller keeps it alive, as in onnxruntime)."""
    name = arg.name
    if not isinstance(device_type, str) or device_type.lower() != "cpu":
        raise UsageError(f"'{name}': kiln binds CPU memory only, got device_type "
                         f"{device_type!r}")
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise UsageError(f"'{name}': device_id must be an int >= 0 (0 for the CPU), got "
                         f"{device_id!r}")
    if element_type is None or shape is None:
        raise UsageError(f"'{name}': binding a buffer needs its element_type and shape")
    dtype = _element_type(arg, element_type)
    dims = _shape(arg, shape)
    size = math.prod(dims) * dtype.itemsize
    address = _address(name, buffer_ptr, size)
    memory = (ctypes.c_char * size).from_address(address)
    return np.frombuffer(memoryview(memory), dtype=dtype).reshape(dims)


def _element_type(arg: NodeArg, element_type: Any) -> np.dtype[Any]:
    """The numpy dtype `element_type` names, which must be the model's for `arg`."""
    try:
        dtype = np.dtype(element_type)
    except TypeError as exc:
        raise UsageError(f"'{arg.name}': element_type {element_type!r} is not a numpy "
                         f"dtype, e.g. np.float32 ({exc})") from None
    if ort_type(dtype.name) != arg.type:
        raise CallError(f"'{arg.name}': element_type {dtype.name} does not match the model's "
                        f"{arg.type}")
    return dtype


def _shape(arg: NodeArg, shape: Any) -> tuple[int, ...]:
    """`shape` as ints >= 0, checked against the model's dimensions for `arg`."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        raise ArgumentTypeError(f"'{arg.name}': shape must be a list of ints, got "
                                f"{type(shape).__name__} {shown(shape, 60)}")
    dims = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0:
            raise UsageError(f"'{arg.name}': shape {shown(list(shape), 80)} has {d!r}; every "
                             "dimension must be an int >= 0")
        dims.append(int(d))
    fits = len(dims) == len(arg.shape) and all(
        not isinstance(want, int) or want == got for want, got in zip(arg.shape, dims))
    if not fits:
        raise CallError(f"'{arg.name}': shape {dims} does not fit the model's {arg.shape}")
    return tuple(dims)


def _address(name: str, buffer_ptr: Any, size: int) -> int:
    """`buffer_ptr` as the address of `size` bytes of mapped memory."""
    if isinstance(buffer_ptr, (bool, np.bool_)) or not hasattr(buffer_ptr, "__index__"):
        raise ArgumentTypeError(f"'{name}': buffer_ptr must be an address (an int, e.g. "
                                f"array.ctypes.data), got {type(buffer_ptr).__name__} "
                                f"{shown(buffer_ptr, 60)}")
    address = operator.index(buffer_ptr)
    if address == 0:
        raise UsageError(f"'{name}': buffer_ptr is NULL; give the address of the memory to "
                         "bind (array.ctypes.data)")
    if address < mmap.PAGESIZE or address + size > _ADDRESS_LIMIT:
        raise UsageError(f"'{name}': buffer_ptr {address:#x} with {size} bytes is not an "
                         "address range of this process's memory")
    if _unmapped(address, size):
        raise UsageError(f"'{name}': the {size} bytes at buffer_ptr {address:#x} are not all "
                         "mapped memory of this process (freed, or a wrong address or shape)")
    return address


@functools.cache
def _mincore() -> Any:
    return libc_function("mincore", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                         ctypes.POINTER(ctypes.c_ubyte))


# Pages asked about per mincore call, so a large buffer needs no large answer vector.
_PAGES_PER_CALL = 1 << 16


def _unmapped(address: int, size: int) -> bool:
    """Whether [address, address + size) reaches memory not mapped in this process, by
    Linux's mincore (which reads no memory); False where that cannot be asked."""
    mincore = _mincore() if sys.platform.startswith("linux") else None
    if size == 0 or mincore is None:
        return False
    page = mmap.PAGESIZE
    pos, end = address - address % page, address + size
    answer = (ctypes.c_ubyte * min(_PAGES_PER_CALL, -(-(end - pos) // page)))()
    while pos < end:
        length = min(end - pos, _PAGES_PER_CALL * page)
        if mincore(pos, length, answer) != 0:
            return ctypes.get_errno() == errno.ENOMEM  # ENOMEM: a page is not mapped
        pos += length
    return False
