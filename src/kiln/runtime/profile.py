"""Per-kernel timings of a library built with `kiln.compile(..., profile=True)`.

Such a library exports `{prefix}_profile_read` and `{prefix}_profile_reset`
(docs/abi.md, "Profiling"); its metadata lists the timer sites under
"profile". `Module.profile()` reads every site into `ProfileRow`s.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from kiln.errors import KilnError
from kiln.runtime import ctypes_abi


@dataclass(frozen=True)
class ProfileRow:
    """The counters of one timer site since the library was loaded (or reset).

    `kernel` is the kernel that `function` calls there, or None for the site that
    times `function`'s whole body (the whole call, without the packed entry's
    argument checks). Only calls that succeeded are counted.
    """

    function: str
    kernel: str | None
    calls: int
    total_ns: int

    @property
    def total_ms(self) -> float:
        """`total_ns` in milliseconds."""
        return self.total_ns / 1e6


class ProfileCounters:
    """The bound profiling accessors of one loaded library."""

    def __init__(self, lib: ctypes.CDLL, prefix: str, sites: int) -> None:
        self._read = ctypes_abi.bind(lib, f"{prefix}_profile_read", "profile_read")
        self._reset = ctypes_abi.bind(lib, f"{prefix}_profile_reset", "profile_reset")
        self.sites = sites
        self.prefix = prefix

    def read(self) -> list[ProfileRow]:
        """Every site's counters, in site order."""
        rows = []
        function, kernel = ctypes.c_char_p(), ctypes.c_char_p()
        calls, total = ctypes.c_uint64(), ctypes.c_uint64()
        for site in range(self.sites):
            status = self._read(site, ctypes.byref(function), ctypes.byref(kernel),
                                ctypes.byref(calls), ctypes.byref(total))
            if status != 0:
                raise KilnError(f"{self.prefix}_profile_read({site}) failed: the library has fewer "
                                f"timer sites than its metadata lists ({self.sites})")
            name = (kernel.value or b"").decode("utf-8", "replace")
            rows.append(ProfileRow((function.value or b"").decode("utf-8", "replace"),
                                   name or None, calls.value, total.value))
        return rows

    def reset(self) -> None:
        """Zero every counter."""
        self._reset()


def not_profiled(where: Any) -> KilnError:
    """The error for a library built without profiling."""
    return KilnError(f"{where} was built without profiling timers: compile it with "
                     "kiln.compile(..., profile=True) or `kiln compile --profile` (timers "
                     "cost time, so only such a build has them; docs/profiling.md)")
