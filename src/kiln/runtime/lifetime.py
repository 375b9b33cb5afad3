"""CallGuard: lets `close()` wait for the calls in flight instead of unmapping their code.

Each call holds the guard shared (a counter under a condition variable);
`close()` marks the guard closed, so no new call starts, then waits until the
counter drops to zero before the owner releases its code. A call after that
raises `CallError` naming the closed owner.
"""

from __future__ import annotations

import threading

from kiln.errors import CallError


class CallGuard:
    """Counts calls in flight on one library or JIT module; `close()` waits for them."""

    __slots__ = ("_active", "_idle", "_lock", "closed", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner  # how error messages name the library
        self.closed = False
        self._active = 0
        self._lock = threading.Lock()  # a plain lock: two per call, so keep them cheap
        self._idle = threading.Event()  # set once closed and no call is running

    def enter(self, function: str) -> None:
        """Start a call of `function`; CallError if the owner is closed."""
        with self._lock:
            if self.closed:
                raise CallError(f"{function}: {self.owner} is closed; load it again to call it")
            self._active += 1

    def exit(self) -> None:
        """End a call started with `enter`."""
        with self._lock:
            self._active -= 1
            if self.closed and not self._active:
                self._idle.set()

    def close(self) -> bool:
        """Refuse new calls and wait for running ones; True the first time."""
        with self._lock:
            first = not self.closed
            self.closed = True
            if not self._active:
                self._idle.set()
        self._idle.wait()
        return first
