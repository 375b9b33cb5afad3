"""`IOBinding`: inputs and preallocated outputs for `InferenceSession.run_with_iobinding`,
with onnxruntime's method names."""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import ArgumentTypeError, UsageError

if TYPE_CHECKING:
    from kiln.session.inference import InferenceSession


class IOBinding:
    """Inputs and outputs bound by name; made by `InferenceSession.io_binding()`.

    An output bound to memory (`bind_output(..., buffer_ptr=...)`) is written in place
    by `run_with_iobinding`; an output bound by name only is allocated by the run.
    """

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, np.ndarray | None] = {}
        self.results: list[np.ndarray] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind input `name` to an array (numpy or DLPack), without copying."""
        self.inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Any, buffer_ptr: int) -> None:
        """Bind input `name` to `shape` elements of `element_type` at `buffer_ptr`."""
        self.inputs[name] = _wrap(name, device_type, element_type, shape, buffer_ptr)

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Any = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind output `name`: to memory at `buffer_ptr` (written in place; needs
        `element_type` and `shape`), or, without a pointer, to an array the run allocates."""
        self._session.output_index(name)  # an unknown name fails here, naming the outputs
        self.outputs[name] = (None if buffer_ptr is None else
                              _wrap(name, device_type, element_type, shape, buffer_ptr))

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the bound outputs after `run_with_iobinding`, in binding order."""
        picks = [self._session.output_index(n) for n in self.outputs]
        return [self.results[i].copy() for i in picks] if self.results else []

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


def _wrap(name: str, device_type: str, element_type: Any, shape: Any,
          buffer_ptr: int) -> np.ndarray:
    """A numpy view of caller-owned memory (the caller keeps it alive, as in onnxruntime)."""
    if str(device_type).lower() != "cpu":
        raise UsageError(f"'{name}': kiln binds CPU memory only, got device_type "
                         f"{device_type!r}")
    if element_type is None or shape is None:
        raise UsageError(f"'{name}': binding a buffer needs its element_type and shape")
    if not isinstance(buffer_ptr, int) or buffer_ptr == 0:
        raise ArgumentTypeError(f"'{name}': buffer_ptr must be a non-null address (an int, "
                                f"e.g. array.ctypes.data), got {buffer_ptr!r}")
    dtype = np.dtype(element_type)
    dims = tuple(int(d) for d in shape)
    size = math.prod(dims) * dtype.itemsize
    memory = (ctypes.c_char * size).from_address(buffer_ptr)
    return np.frombuffer(memory, dtype=dtype).reshape(dims)
