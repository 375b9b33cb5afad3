"""Prebuilt packed arguments for the fast call path of a graph function.

Packing a call from scratch (`ctypes_abi.pack_arguments`) builds a ctypes
`DLTensor`, a shape array and the packed value array for every call; for a
small model that costs more than its kernels. A function whose arguments are
all tensors of a fixed signature builds them once instead (`ArgumentSlots`)
and writes only each tensor's `data` pointer per call.

One `ArgumentSlots` serves one call at a time: a call takes one from its
function's `SlotPool` and gives it back afterwards, so concurrent calls (each
thread) and a call made while another is being packed (a finalizer, a signal
handler) each write their own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from kiln.runtime import abi, ctypes_abi


class ArgumentSlots:
    """Packed values, type codes and DLTensors for one signature, all tensors on the CPU.

    Every field but `data` is written here once: device, ndim, dtype and the
    signature's shape (contiguous, so no strides).
    """

    __slots__ = ("_storage", "codes", "count", "shapes", "tensors", "values")

    def __init__(self, layouts: Sequence[tuple[tuple[int, ...], str]]) -> None:
        n = len(layouts)
        self.count = n
        self._storage = (ctypes_abi.DLTensor * n)()
        # one slot more: the terminate flag (`set_flag`) follows the arguments
        self.values = (ctypes_abi.KilnValue * (n + 1))()
        self.codes = (ctypes.c_int32 * (n + 1))(*([abi.ARG_DLTENSOR] * n), abi.ARG_HANDLE)
        self.shapes: list[Any] = []
        self.tensors: list[ctypes_abi.DLTensor] = []
        for i, (shape, dtype) in enumerate(layouts):
            t = self._storage[i]
            shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            self.shapes.append(shape_array)  # `t.shape` points into it
            t.device.device_type = abi.KDL_CPU
            t.device.device_id = 0
            t.ndim = len(shape)
            t.dtype.code, t.dtype.bits, t.dtype.lanes = abi.dl_type(dtype)
            t.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
            t.byte_offset = 0
            self.values[i].v_handle = ctypes.addressof(t)
            self.tensors.append(t)

    def set_data(self, addresses: Sequence[int]) -> None:
        """Point each tensor at its array's memory."""
        for t, address in zip(self.tensors, addresses):
            t.data = address

    def set_flag(self, address: int | None) -> int:
        """Put the terminate flag at `address` after the arguments; the number of extra
        arguments to pass: 1, or 0 when `address` is None (no flag)."""
        if address is None:
            return 0
        self.values[self.count].v_handle = address
        return 1

    def set_sizes(self, shapes: Sequence[Sequence[int]],
                  axes: Sequence[tuple[int, int]]) -> None:
        """Write the sizes of this call's symbolic dimensions only, `axes` listing each as
        (tensor, axis): the rest of every shape stays the signature's, written once."""
        arrays = self.shapes
        for i, d in axes:
            arrays[i][d] = shapes[i][d]

    def shape_of(self, i: int) -> tuple[int, ...]:
        """Tensor i's shape as it is now (a call with data-dependent sizes writes the
        actual extents of its results there)."""
        return tuple(self.shapes[i][:self.tensors[i].ndim])


class SlotPool:
    """`ArgumentSlots` of one signature for calls in flight; grows to the calls at once.

    `list.pop` and `list.append` are atomic, so no lock is needed.
    """

    __slots__ = ("_free", "_layouts")

    def __init__(self, layouts: Sequence[tuple[tuple[int, ...], str]]) -> None:
        self._layouts = list(layouts)
        self._free: list[ArgumentSlots] = []

    def take(self) -> ArgumentSlots:
        """Slots no other call uses until `give_back`."""
        try:
            return self._free.pop()
        except IndexError:
            return ArgumentSlots(self._layouts)

    def give_back(self, slots: ArgumentSlots) -> None:
        self._free.append(slots)
