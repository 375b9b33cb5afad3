"""TerminateFlag: stop a running call from another thread (docs/runtime.md).

A graph function of a library whose metadata says `"terminate": true` (llvm and c
libraries from kiln with library metadata version 5 on) polls a flag the caller owns
before every kernel call and at every loop back-edge (docs/abi.md, "Stopping a
call"). `PackedFunction.call_with_flag(flag, ...)` passes this flag; `flag.set()`
from any thread stops the call, which raises CallError("...: terminated: ...").
"""

from __future__ import annotations

import ctypes


class TerminateFlag:
    """An int32 the compiled code reads while it runs: `set()` stops the calls given it.

    The flag stays set until `clear()`: a call started with a set flag stops before its
    first kernel. Thread-safe: ctypes releases the GIL during a call, so another
    thread's `set()` runs while the call does, and an aligned int32 store is atomic.
    """

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = ctypes.c_int32(0)

    def set(self) -> None:
        """Ask every call running with this flag to stop at its next check."""
        self._value.value = 1

    def clear(self) -> None:
        """Let later calls run to the end."""
        self._value.value = 0

    @property
    def is_set(self) -> bool:
        """Whether `set()` was called since the last `clear()`."""
        return bool(self._value.value)

    @property
    def address(self) -> int:
        """The int32's address, the packed argument of a call (kiln.h's
        `kiln_set_terminate_flag`)."""
        return ctypes.addressof(self._value)

    def __repr__(self) -> str:
        return f"TerminateFlag(is_set={self.is_set})"


__all__ = ["TerminateFlag"]
